"""A connection between engine processes, in the clear or through TLS: the one way the
engine reads and writes its sockets (control, data channels, the Spark partition server).

``Wire.sock`` stays the plain socket: selectors register it, timeouts and blocking modes
are set on it, and ``recv`` decrypts everything each read brings (tls.Tunnel), so a
readable socket is the only sign of new data either way.

``recv(n)`` returns plaintext, ``b""`` once the peer has closed, or ``None`` when bytes
arrived but complete no TLS record yet (never in the clear). Plaintext beyond ``n`` (only
a handshake reads fewer bytes than a record may hold) is kept for the next ``recv``;
``take_rest()`` hands it over to a frame reader before a selector takes the socket.
Writers that share a wire across threads (the control link) serialise ``sendall`` (or
``seal`` and the send of its result) themselves, so records go out in the order sealed.
"""

from __future__ import annotations

import socket
import time

from .errors import ProtocolError, ProtocolErrorReason
from .tls import Material, Tunnel


def server_socket(host: str, backlog: int) -> socket.socket:
    """A listening TCP socket on ``host`` (an IPv4 or IPv6 address), any free port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, 0), family=family, backlog=backlog)


def give_up_after(sock: socket.socket, seconds: float) -> None:
    """Abort the connection when data sent on it stays unacknowledged for ``seconds`` (the
    peer's machine lost or cut off): a send then fails instead of queueing for the kernel's
    ~15 minutes of retransmissions. Linux's TCP_USER_TIMEOUT; elsewhere nothing changes."""
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if option is not None and seconds > 0:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, option, max(1, int(seconds * 1000)))
        except OSError:
            pass  # not TCP (a socketpair in tests): nothing to bound


class Wire:
    __slots__ = ("sock", "tunnel", "rest")

    def __init__(self, sock: socket.socket, material: Material | None = None, server_side: bool = False):
        self.sock = sock
        self.tunnel = Tunnel(material, server_side) if material is not None else None
        self.rest = b""

    @classmethod
    def connect(cls, address: tuple[str, int], material: Material | None, timeout: float) -> "Wire":
        """Connect (TCP_NODELAY) and, with TLS, complete the handshake within ``timeout``."""
        sock = socket.create_connection(address, timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            wire = cls(sock, material)
            wire.handshake(time.monotonic() + timeout)
        except BaseException:
            sock.close()
            raise
        return wire

    def handshake(self, deadline: float) -> None:
        """The TLS handshake on a blocking socket (either side); nothing in the clear."""
        t = self.tunnel
        if t is None or t.done:
            return
        old = self.sock.gettimeout()
        try:
            data = b""
            while not t.handshake(data):
                if out := t.take_output():
                    self.sock.sendall(out)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ProtocolError(ProtocolErrorReason.HANDSHAKE_TIMEOUT, "the TLS handshake did not finish in time")
                self.sock.settimeout(left)
                try:
                    data = self.sock.recv(1 << 16)
                except socket.timeout:
                    raise ProtocolError(ProtocolErrorReason.HANDSHAKE_TIMEOUT,
                                        "the TLS handshake did not finish in time") from None
                if not data:
                    raise ProtocolError(ProtocolErrorReason.CLOSED, "the peer closed the connection during the TLS "
                                                                    "handshake (it refused our certificate?)")
            if out := t.take_output():
                self.sock.sendall(out)
        finally:
            self.sock.settimeout(old)

    def recv(self, n: int, flags: int = 0) -> bytes | None:
        if self.rest:
            data, self.rest = self.rest[:n], self.rest[n:]
            return data
        raw = self.sock.recv(n, flags)
        t = self.tunnel
        if t is None or not raw:
            return raw
        plain = t.open(raw)
        if t.closed and not plain:
            return b""  # close_notify: the peer is done
        if not plain:
            return None
        if len(plain) > n:
            plain, self.rest = plain[:n], plain[n:]
        return plain

    def read_nowait(self, chunk: int, limit: int | None = None) -> tuple[list[bytes], bool]:
        """What the socket has, in chunks of up to ``chunk`` bytes, until it would block or
        about ``limit`` bytes are read (None: no limit), without blocking (MSG_DONTWAIT, not a
        mode switch: another thread may be sending meanwhile); and whether the peer closed."""
        got: list[bytes] = []
        total = 0
        while limit is None or total < limit:
            try:
                data = self.recv(chunk, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            if data is None:
                continue  # part of a TLS record; the next read tells whether more is there
            if not data:
                return got, True
            got.append(data)
            total += len(data)
        return got, False

    def take_rest(self) -> bytes:
        rest, self.rest = self.rest, b""
        return rest

    def seal(self, data: bytes | memoryview) -> bytes | memoryview:
        """What to put on the socket for ``data``."""
        return data if self.tunnel is None else self.tunnel.seal(data)

    def sendall(self, data: bytes | memoryview) -> None:
        self.sock.sendall(self.seal(data))

    def close(self) -> None:
        self.sock.close()


def as_wire(conn: socket.socket | Wire) -> Wire:
    """A plain socket as a wire in the clear (for callers that hold sockets)."""
    return conn if isinstance(conn, Wire) else Wire(conn)
