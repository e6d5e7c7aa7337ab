"""Mutual HMAC challenge-response on every connection, before anything else is read.

Every connection the engine accepts (worker -> driver control, worker -> worker data,
source -> Spark partition server) starts with this handshake, as
``multiprocessing.connection`` does: the accepting side proves nothing and learns nothing
until the connecting side has shown it knows the secret, and then proves it knows it too.

Wire (fixed sizes, no msgpack, so nothing is parsed before authentication):

    server -> client   CHALLENGE  MAGIC + nonce_s                         (36 bytes)
    client -> server   RESPONSE   MAGIC + HMAC(K, "C" + nonce_s) + nonce_c (68 bytes)
    server -> client   PROOF      MAGIC + HMAC(K, "S" + nonce_c + nonce_s) (36 bytes)

Invariants: digests are compared with ``hmac.compare_digest``; a handshake reads at most
its fixed size before it is verified; secrets travel only over stdin pipes and over
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


def recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    """Exactly ``n`` bytes before ``deadline`` (monotonic), or ProtocolError."""
    chunks: list[bytes] = []
    got = 0
    old = sock.gettimeout()
    try:
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProtocolError(ProtocolErrorReason.HANDSHAKE_TIMEOUT, "the handshake did not finish in time")
            sock.settimeout(left)
            try:
                data = sock.recv(n - got)
            except socket.timeout:
                raise ProtocolError(ProtocolErrorReason.HANDSHAKE_TIMEOUT,
                                    "the handshake did not finish in time") from None
            if not data:
                raise ProtocolError(ProtocolErrorReason.CLOSED, "the peer closed the connection during the handshake")
            chunks.append(data)
            got += len(data)
    finally:
        sock.settimeout(old)
    return b"".join(chunks)


def client_handshake(sock: socket.socket, secret: bytes, timeout: float = HANDSHAKE_TIMEOUT) -> None:
    """The connecting side (blocking): prove we know the secret, then check the server
    proves it too (so a worker never takes orders or code from an impostor)."""
    deadline = time.monotonic() + timeout
    challenge = recv_exact(sock, CHALLENGE_SIZE, deadline)
    if challenge[:4] != MAGIC:
        raise ProtocolError(ProtocolErrorReason.AUTH_FAILED, "the server is not an abs-engine endpoint")
    nonce_s = challenge[4:]
    nonce_c = os.urandom(NONCE)
    sock.sendall(MAGIC + _mac(secret, b"C", nonce_s) + nonce_c)
    proof = recv_exact(sock, PROOF_SIZE, deadline)
    if proof[:4] != MAGIC or not hmac.compare_digest(proof[4:], _mac(secret, b"S", nonce_c, nonce_s)):
        raise ProtocolError(ProtocolErrorReason.AUTH_FAILED, "the server failed authentication")


def server_handshake(sock: socket.socket, secret: bytes, timeout: float = HANDSHAKE_TIMEOUT) -> bytes:
    """The accepting side (blocking, for a thread per connection). Returns bytes that
    arrived after the response (normally none)."""
    hs = ServerHandshake(secret, timeout)
    sock.sendall(hs.challenge)
    proof = hs.feed(recv_exact(sock, RESPONSE_SIZE, hs.deadline))
    assert proof is not None
    sock.sendall(proof)
    return hs.rest


class Incoming:
    """An accepted connection on its way to its first frame, for a selector loop: the
    handshake first (reading no more than it needs), then one frame read with a bound.

    ``start()`` sends the challenge; call ``on_readable()`` whenever the socket is readable:
    it returns the first frame once there is one, None until then, and raises ProtocolError
    (or OSError) if the peer fails, closes or breaks the protocol: drop the connection then.
    ``reader`` keeps whatever arrived after that frame."""

    __slots__ = ("sock", "hs", "reader")

    def __init__(self, sock: socket.socket, secret: bytes, max_frame: int, timeout: float = HANDSHAKE_TIMEOUT):
        from .codec import FrameReader

        self.sock = sock
        self.hs = ServerHandshake(secret, timeout)
        self.reader = FrameReader(max_frame)

    def start(self) -> None:
        self.sock.send(self.hs.challenge)  # 36 bytes into an empty socket buffer

    def on_readable(self) -> tuple[int, bytes] | None:
        if not self.hs.done:
            data = self.sock.recv(self.hs.wanted())
            if not data:
                raise ProtocolError(ProtocolErrorReason.CLOSED, "the peer closed the connection during the handshake")
            proof = self.hs.feed(data)
            if proof is None:
                return None
            self.sock.sendall(proof)
            data = self.hs.rest
        else:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ProtocolError(ProtocolErrorReason.CLOSED, "the peer closed the connection before its first frame")
        self.reader.feed(data)
        return self.reader.next_frame()


MAX_PENDING = 256  #: unauthenticated connections kept at once; beyond it the oldest is dropped


def admit(listener: socket.socket, secret: bytes, max_frame: int, pending: "dict[socket.socket, Incoming]",
          drop: "Callable[[socket.socket], None]") -> Incoming | None:
    """Accept one connection and send it the challenge; the caller keeps it in ``pending``
    (and a selector) until ``on_readable`` yields its first frame. A failed accept (out of
    descriptors: a flood?) yields None; beyond MAX_PENDING the oldest pending one is dropped."""
    try:
        sock, _ = listener.accept()
    except OSError:
        return None  # the pending ones expire first, freeing descriptors
    if len(pending) >= MAX_PENDING:
        drop(min(pending, key=lambda s: pending[s].hs.deadline))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn = Incoming(sock, secret, max_frame)
    try:
        conn.start()
    except OSError:
        sock.close()
        return None
    return conn
