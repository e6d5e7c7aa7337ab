"""FIFO channels between tasks: one TCP connection per (producer, consumer) pair.

Bounded by the kernel's socket buffers: a consumer that stops reading (a slow task, or one
blocking an input during barrier alignment) makes its producers' ``sendall`` block, which
back-pressures all the way to the sources. Frames are length-prefixed (codec.HEADER).
TCP (not a pipe) so the same worker code can run on several machines under Spark.
Every data connection is authenticated (auth.py, this attempt's secret) before its HELLO
frame is read; a connection that fails or stalls the handshake is dropped without
failing anything, so a stranger on the port can neither inject records nor stall start-up.
With the job's TLS material (tls.py) every channel is mutual TLS first (wire.py); frames
are sealed whole before they are sent, so back-pressure works on ciphertext as on plain.
A back-edge input is read even when its task cannot process it yet (task.py); what its
reader has no room for waits in its spill (runtime/overflow.py), in order, in memory up to
its share of ``loop_memory`` and on disk past it.
"""

from __future__ import annotations

import selectors
import socket
import time
from collections import deque
from typing import TYPE_CHECKING, Callable

from .. import auth, codec, ids
from ..errors import ProtocolError, ProtocolErrorReason
from ..tls import Material
from ..wire import Wire, as_wire
from .overflow import REFILL, BackEdgeSpill

if TYPE_CHECKING:
    from .memory import MemoryLink

RECV_SIZE = 1 << 20


#: Bytes of kernel buffer per direction of a data channel (the kernel doubles it). Bounded,
#: not left to autotuning (up to 32 MiB on Linux): the bytes in flight on a channel are what
#: an aligned barrier queues behind and what an unaligned checkpoint persists, as Flink
#: bounds them with its network buffers. Measured: no loss of throughput on one machine.
DEFAULT_BUFFER = 512 << 10


def tune(sock: socket.socket, buffer: int = 0) -> None:
    """No Nagle delay; with ``buffer`` > 0, that many bytes of kernel buffer each way."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if buffer > 0:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer)


class OutputChannel:
    __slots__ = ("id", "wire", "sock", "while_blocked", "records", "send_s", "sending_since")

    def __init__(self, channel_id: str, wire: Wire | MemoryLink):
        self.id = channel_id
        self.wire = wire
        self.sock: socket.socket | None = wire.sock  #: None over memory: sends never block there
        #: Set on tasks with back-edge inputs: called with this socket while a send would
        #: block; it waits until the socket is writable while draining the back-edges, so a
        #: loop of full channels cannot deadlock.
        self.while_blocked: Callable[[socket.socket], None] | None = None
        self.records = 0  #: records sent (stop-the-world counts them to prove quiescence)
        #: Seconds spent in send(): copying into the kernel's buffer (microseconds a frame)
        #: and waiting while it is full, i.e. backpressure (the dashboard's share of time).
        self.send_s = 0.0
        self.sending_since = 0.0  #: perf_counter() the send in progress began (0.0: none)

    @classmethod
    def connect(cls, channel_id: str, address: tuple[str, int], secret: bytes,
                timeout: float = auth.HANDSHAKE_TIMEOUT, material: Material | None = None,
                buffer: int = 0) -> "OutputChannel":
        """Connect to the consumer, authenticate and say HELLO with the channel's id."""
        # The consumer answers once it runs its accept loop (after restoring its state):
        # wait for it as long as start-up may take.
        wire = Wire.connect(address, material, timeout)
        sock = wire.sock
        tune(sock, buffer)
        try:
            auth.client_handshake(wire, secret, timeout)
            sock.settimeout(None)
            wire.sendall(codec.frame(codec.FrameKind.HELLO, codec.pack(channel_id)))
        except BaseException:
            sock.close()
            raise
        return cls(channel_id, wire)

    def send(self, data: bytes) -> None:
        started = self.sending_since = time.perf_counter()
        try:
            self._send(data)
        finally:
            self.sending_since = 0.0
            self.send_s += time.perf_counter() - started

    def send_seconds(self, now: float) -> float:
        """``send_s`` with the send in progress counted up to ``now`` (another thread reads
        this: a producer blocked for seconds in one send shows as blocked meanwhile)."""
        since = self.sending_since
        return self.send_s + (now - since if since else 0.0)

    def _send(self, data: bytes) -> None:
        sock = self.sock
        if self.while_blocked is None or sock is None:
            self.wire.sendall(data)
            return
        view = memoryview(self.wire.seal(data))
        sock.setblocking(False)
        try:
            while view:
                try:
                    view = view[sock.send(view):]
                    continue
                except (BlockingIOError, InterruptedError):
                    pass
                # Outside the handler: an error of the drain (LoopOverflow) is not "during" it.
                self.while_blocked(sock)
        finally:
            sock.setblocking(True)

    def close(self) -> None:
        try:
            self.wire.close()
        except OSError:
            pass


class ChannelClosed(Exception):
    """The producer's end disconnected before end of stream: it died."""

    def __init__(self, message: str, producer: str | None = None):
        super().__init__(message)
        self.producer = producer


class InputChannel:
    __slots__ = ("id", "wire", "sock", "reader", "back_edge", "ended", "records", "ahead", "ahead_stopped",
                 "ahead_bytes", "spill")

    def __init__(self, channel_id: str, conn: Wire | MemoryLink | socket.socket, reader: codec.FrameReader,
                 back_edge: bool):
        self.id = channel_id
        self.wire: Wire | MemoryLink = as_wire(conn) if isinstance(conn, socket.socket) else conn
        self.sock: socket.socket | None = self.wire.sock  #: None over memory: nothing to select on
        self.reader = reader
        self.back_edge = back_edge
        self.ended = False
        self.records = 0  #: records taken in for processing
        #: Frames read ahead of processing while a checkpoint logs this channel's state
        #: (runtime/channel_state.py): already logged, processed before the reader's.
        self.ahead: deque[tuple[int, bytes]] = deque()
        self.ahead_bytes = 0  #: bytes of ``ahead``: bounded by the task (channel_state_memory)
        #: The last frame read ahead is one read-ahead must not pass (a barrier no session
        #: waits for yet, or end of stream).
        self.ahead_stopped = False
        #: A back-edge's queue between socket and reader (runtime/overflow.py; set by the task
        #: when ``loop_memory`` bounds it): what the reader has no room for waits there, in
        #: order, in memory up to the channel's share of loop_memory and on disk past it.
        self.spill: BackEdgeSpill | None = None

    def fill_nowait(self, limit: int = 8 * RECV_SIZE) -> None:
        """Read what the socket has, up to about ``limit`` bytes, without blocking. With a
        spill, bytes the reader has no room for (or that come after bytes waiting in the
        spill) go to the spill instead (LoopOverflow when the task's back-edges have more
        than ``loop_disk`` on disk)."""
        chunks, closed = self.wire.read_nowait(RECV_SIZE, limit)
        spill, reader = self.spill, self.reader
        for data in chunks:
            if spill is not None and spill.wants(reader.buffered(), len(data)):
                spill.push(data)
            else:
                reader.feed(data)
        if closed:
            raise ChannelClosed(f"input channel {self.id} closed before end of stream (its producer died)",
                                ids.producer_of(self.id))

    def next_frame(self) -> tuple[int, bytes, bool] | None:
        """The next frame to process, and whether it was read ahead (and so logged)."""
        if self.ahead:
            kind, payload = self.ahead.popleft()
            self.ahead_bytes -= len(payload)
            if not self.ahead:
                self.ahead_stopped = False
            return kind, payload, True
        f = self.read_frame()
        return None if f is None else (f[0], f[1], False)

    def read_frame(self) -> tuple[int, bytes] | None:
        """The next frame after those read ahead: the reader's, which is refilled from the
        spill's head when it holds no whole frame (None: the rest is still in the socket).
        Order: read ahead -> reader -> spill (memory, then disk) -> socket."""
        f = self.reader.next_frame()
        spill = self.spill
        while f is None and spill is not None and spill.waiting:
            self.reader.feed(spill.pop(REFILL))
            f = self.reader.next_frame()
        return f

    def push_ahead(self, kind: int, payload: bytes) -> None:
        """A frame read ahead of processing (and logged): processed before the reader's."""
        self.ahead.append((kind, payload))
        self.ahead_bytes += len(payload)

    def has_frames(self) -> bool:
        return bool(self.ahead) or self.reader.buffered() > 0 or (self.spill is not None and self.spill.waiting > 0)


HELLO_MAX = 4096  #: a HELLO frame carries one channel id


def accept_inputs(listener: socket.socket, expected: dict[str, bool], secret: bytes,
                  timeout: float, material: Material | None = None, buffer: int = 0) -> dict[str, InputChannel]:
    """Accept one authenticated connection per expected channel id; each opens with a
    HELLO frame naming its channel. Connections that fail authentication, stall their
    handshake or send anything unexpected are closed and forgotten; only missing channels
    at ``timeout`` are an error."""
    channels: dict[str, InputChannel] = {}
    deadline = time.monotonic() + timeout
    pending: dict[socket.socket, auth.Incoming] = {}
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, None)

    def drop(p: auth.Incoming) -> None:
        sel.unregister(p.sock)
        del pending[p.sock]
        p.sock.close()

    try:
        while len(channels) < len(expected):
            now = time.monotonic()
            if now > deadline:
                missing = sorted(set(expected) - set(channels))
                raise ProtocolError(ProtocolErrorReason.HANDSHAKE_TIMEOUT,
                                    f"input channels {missing} did not connect within {timeout:.0f}s")
            for p in [p for p in pending.values() if p.hs.expired(now)]:
                drop(p)
            for key, _ in sel.select(timeout=min(0.5, max(0.0, deadline - now))):
                if key.data is None:
                    if (new := auth.admit(listener, secret, HELLO_MAX, pending, lambda s: drop(pending[s]),
                                               material)) is not None:
                        pending[new.sock] = new
                        sel.register(new.sock, selectors.EVENT_READ, new)
                    continue
                p = key.data
                try:
                    frame = p.on_readable()
                    if frame is None:
                        continue
                    kind, payload = frame
                    cid = codec.unpack(payload) if kind == codec.FrameKind.HELLO else None
                except (OSError, ProtocolError, ValueError):
                    drop(p)  # a stranger, or a peer that broke the protocol: not ours to fail on
                    continue
                if not isinstance(cid, str) or cid not in expected or cid in channels:
                    raise ProtocolError(ProtocolErrorReason.MALFORMED,
                                        f"an authenticated peer opened an unexpected data channel {cid!r}")
                sel.unregister(p.sock)
                del pending[p.sock]
                tune(p.sock, buffer)
                reader = codec.FrameReader()
                reader.feed(p.reader.take_rest())
                reader.feed(p.wire.take_rest())
                channels[cid] = InputChannel(cid, p.wire, reader, expected[cid])
    finally:
        sel.close()
        for p in pending.values():
            p.sock.close()
    return channels
