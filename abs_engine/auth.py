"""Mutual HMAC challenge-response on every connection, before anything else is read.

Every connection the engine accepts (worker -> driver control, worker -> worker data,
source -> Spark partition server) starts with this handshake, as
``multiprocessing.connection`` does: the accepting side proves nothing and learns nothing
until the connecting side has shown it knows the secret, and then proves it knows it too.

Wire (fixed sizes, no msgpack, so nothing is parsed before authentication):

    server -> client   CHALLENGE  MAGIC + nonce_s                         (36 bytes)
    client -> server   RESPONSE   MAGIC + HMAC(K, "C" + nonce_s) + nonce_c (68 bytes)
    server -> client   PROOF      MAGIC + HMAC(K, "S" + nonce_c + nonce_s) (36 bytes)

With ``tls`` on (tls.py) the same handshake runs inside the TLS session, after the TLS
handshake has verified the peer's certificate (defence in depth: either one alone keeps a
stranger out).

Invariants: digests are compared with ``hmac.compare_digest``; a handshake reads at most
its fixed size before it is verified (with TLS: at most what the TLS handshake allows,
tls.HANDSHAKE_READ_MAX, then one read); secrets travel only over stdin pipes and over
already-authenticated connections, never on a command line. Each attempt of a job has its
own secret, so a worker of an older attempt cannot talk to the driver or the workers of a
newer one (it is fenced out at the first byte).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import time
from typing import Callable

from .errors import ProtocolError, ProtocolErrorReason
from .tls import Material
from .wire import Wire, as_wire

MAGIC = b"ABS1"
NONCE = 32
DIGEST = 32
CHALLENGE_SIZE = len(MAGIC) + NONCE
RESPONSE_SIZE = len(MAGIC) + DIGEST + NONCE
PROOF_SIZE = len(MAGIC) + DIGEST
HANDSHAKE_TIMEOUT = 5.0  #: seconds a peer has to complete its side of the handshake
SECRET_BYTES = 32


def new_secret() -> bytes:
    return os.urandom(SECRET_BYTES)


def _mac(secret: bytes, *parts: bytes) -> bytes:
    return hmac.new(secret, b"".join(parts), hashlib.sha256).digest()


class ServerHandshake:
    """The accepting side, sans-IO: send ``challenge``, ``feed`` what arrives; once
    ``feed`` returns the proof (send it), the peer is authenticated. Bytes after the
    response (there should be none: a client waits for the proof) are kept in ``rest``."""

    __slots__ = ("secret", "nonce", "buf", "done", "rest", "deadline")

    def __init__(self, secret: bytes, timeout: float = HANDSHAKE_TIMEOUT):
        self.secret = secret
        self.nonce = os.urandom(NONCE)
        self.buf = b""
        self.done = False
        self.rest = b""
        self.deadline = time.monotonic() + timeout

    @property
    def challenge(self) -> bytes:
        return MAGIC + self.nonce

    def expired(self, now: float | None = None) -> bool:
        return not self.done and (now if now is not None else time.monotonic()) > self.deadline

    def wanted(self) -> int:
        """How many more bytes the handshake may read (a bound for recv)."""
        return RESPONSE_SIZE - len(self.buf)

    def feed(self, data: bytes) -> bytes | None:
        """Returns the proof to send once the response is complete and valid; raises
        ProtocolError(AUTH_FAILED) if it is not."""
        if self.done:
            raise RuntimeError("handshake already complete")
        self.buf += data
        if len(self.buf) < RESPONSE_SIZE:
            return None
        resp, self.rest = self.buf[:RESPONSE_SIZE], self.buf[RESPONSE_SIZE:]
        magic, digest, client_nonce = resp[:4], resp[4:4 + DIGEST], resp[4 + DIGEST:]
        if magic != MAGIC or not hmac.compare_digest(digest, _mac(self.secret, b"C", self.nonce)):
            raise ProtocolError(ProtocolErrorReason.AUTH_FAILED,
                                "a connection failed authentication (it does not know the job's secret)")
        self.done = True
        return MAGIC + _mac(self.secret, b"S", client_nonce, self.nonce)


def recv_exact(conn: socket.socket | Wire, n: int, deadline: float) -> bytes:
    """Exactly ``n`` bytes before ``deadline`` (monotonic), or ProtocolError."""
    wire = as_wire(conn)
    chunks: list[bytes] = []
    got = 0
    sock = wire.sock
    old = sock.gettimeout()
    try:
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProtocolError(ProtocolErrorReason.HANDSHAKE_TIMEOUT, "the handshake did not finish in time")
            sock.settimeout(left)
            try:
                data = wire.recv(n - got)
            except socket.timeout:
                raise ProtocolError(ProtocolErrorReason.HANDSHAKE_TIMEOUT,
                                    "the handshake did not finish in time") from None
            if data is None:
                continue  # part of a TLS record
            if not data:
                raise ProtocolError(ProtocolErrorReason.CLOSED, "the peer closed the connection during the handshake")
            chunks.append(data)
            got += len(data)
    finally:
        sock.settimeout(old)
    return b"".join(chunks)


def client_handshake(conn: socket.socket | Wire, secret: bytes, timeout: float = HANDSHAKE_TIMEOUT) -> None:
    """The connecting side (blocking): prove we know the secret, then check the server
    proves it too (so a worker never takes orders or code from an impostor)."""
    wire = as_wire(conn)
    deadline = time.monotonic() + timeout
    wire.handshake(deadline)  # TLS first, if on (Wire.connect has normally done it)
    challenge = recv_exact(wire, CHALLENGE_SIZE, deadline)
    if challenge[:4] != MAGIC:
        raise ProtocolError(ProtocolErrorReason.AUTH_FAILED, "the server is not an abs-engine endpoint")
    nonce_s = challenge[4:]
    nonce_c = os.urandom(NONCE)
    wire.sendall(MAGIC + _mac(secret, b"C", nonce_s) + nonce_c)
    proof = recv_exact(wire, PROOF_SIZE, deadline)
    if proof[:4] != MAGIC or not hmac.compare_digest(proof[4:], _mac(secret, b"S", nonce_c, nonce_s)):
        raise ProtocolError(ProtocolErrorReason.AUTH_FAILED, "the server failed authentication")


def server_handshake(conn: socket.socket | Wire, secret: bytes, timeout: float = HANDSHAKE_TIMEOUT) -> bytes:
    """The accepting side (blocking, for a thread per connection): TLS first if the wire
    has it, then the secret. Returns bytes that arrived after the response (normally none)."""
    wire = as_wire(conn)
    hs = ServerHandshake(secret, timeout)
    wire.handshake(hs.deadline)
    wire.sendall(hs.challenge)
    proof = hs.feed(recv_exact(wire, RESPONSE_SIZE, hs.deadline))
    assert proof is not None
    wire.sendall(proof)
    return hs.rest + wire.take_rest()


class Incoming:
    """An accepted connection on its way to its first frame, for a selector loop: the TLS
    handshake if the wire has TLS, the secret's handshake (reading no more than it needs),
    then one frame read with a bound. Nothing blocks on the peer: a stalled stranger
    costs a slot in ``pending`` until its deadline, and delays no one.

    ``start()`` sends the challenge (with TLS: the TLS handshake comes first, and the
    challenge once it is done); call ``on_readable()`` whenever the socket is readable:
    it returns the first frame once there is one, None until then, and raises ProtocolError
    (or OSError) if the peer fails, closes or breaks the protocol: drop the connection then.
    ``reader`` keeps whatever arrived after that frame."""

    __slots__ = ("wire", "sock", "hs", "reader")

    def __init__(self, wire: Wire, secret: bytes, max_frame: int, timeout: float = HANDSHAKE_TIMEOUT):
        from .codec import FrameReader

        self.wire = wire
        self.sock = wire.sock
        self.hs = ServerHandshake(secret, timeout)
        self.reader = FrameReader(max_frame)

    def start(self) -> None:
        if self.wire.tunnel is None:
            self.sock.send(self.hs.challenge)  # 36 bytes into an empty socket buffer

    def _tls_step(self) -> bytes | None:
        """One read of the TLS handshake; the plaintext that followed it once it is done."""
        tunnel = self.wire.tunnel
        assert tunnel is not None
        raw = self.sock.recv(1 << 16)
        if not raw:
            raise ProtocolError(ProtocolErrorReason.CLOSED, "the peer closed the connection during the TLS handshake")
        try:
            done = tunnel.handshake(raw)
        except ProtocolError:
            try:
                self.sock.send(tunnel.take_output())  # the alert that says why, if it fits
            except OSError:
                pass
            raise
        if out := tunnel.take_output():  # our flight (a few hundred bytes, an empty buffer)
            self.sock.sendall(out)
        if not done:
            return None
        self.wire.sendall(self.hs.challenge)
        return tunnel.open(b"")  # what came after the client's Finished (normally nothing)

    def on_readable(self) -> tuple[int, bytes] | None:
        tunnel = self.wire.tunnel
        data: bytes | None
        if tunnel is not None and not tunnel.done:
            data = self._tls_step()
            if not data:
                return None
        else:
            data = self.wire.recv(self.hs.wanted() if tunnel is None and not self.hs.done else 1 << 16)
            if data is None:
                return None  # part of a TLS record
            if not data:
                raise ProtocolError(ProtocolErrorReason.CLOSED, "the peer closed the connection before its first frame")
        if not self.hs.done:
            proof = self.hs.feed(data)
            if proof is None:
                return None
            self.wire.sendall(proof)
            data = self.hs.rest
        self.reader.feed(data)
        return self.reader.next_frame()


MAX_PENDING = 256  #: unauthenticated connections kept at once; beyond it the oldest is dropped


def admit(listener: socket.socket, secret: bytes, max_frame: int, pending: "dict[socket.socket, Incoming]",
          drop: "Callable[[socket.socket], None]", material: Material | None = None) -> Incoming | None:
    """Accept one connection and send it the challenge (with ``material``: wait for its TLS
    handshake first); the caller keeps it in ``pending`` (and a selector) until
    ``on_readable`` yields its first frame. A failed accept (out of descriptors: a flood?)
    yields None; beyond MAX_PENDING the oldest pending one is dropped."""
    try:
        sock, _ = listener.accept()
    except OSError:
        return None  # the pending ones expire first, freeing descriptors
    if len(pending) >= MAX_PENDING:
        drop(min(pending, key=lambda s: pending[s].hs.deadline))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn = Incoming(Wire(sock, material, server_side=True), secret, max_frame)
    try:
        conn.start()
    except OSError:
        sock.close()
        return None
    return conn
