"""FIFO channels between tasks: one TCP connection per (producer, consumer) pair.

Bounded by the kernel's socket buffers: a consumer that stops reading (a slow task, or one
blocking an input during barrier alignment) makes its producers' ``sendall`` block, which
back-pressures all the way to the sources. Frames are length-prefixed (codec.HEADER).
TCP (not a pipe) so the same worker code can run on several machines under Spark.
"""

from __future__ import annotations

import socket
from typing import Any, Callable

from .. import codec

RECV_SIZE = 1 << 20


def tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class OutputChannel:
    __slots__ = ("id", "sock", "while_blocked", "records")

    def __init__(self, channel_id: str, address: tuple[str, int]):
        self.id = channel_id
        self.sock = socket.create_connection(address)
        tune(self.sock)
        self.sock.sendall(codec.frame(codec.FrameKind.HELLO, codec.pack(channel_id)))
        #: Set on tasks with back-edge inputs: called with this socket while a send would
        #: block; it waits until the socket is writable while draining the back-edges, so a
        #: loop of full channels cannot deadlock.
        self.while_blocked: Callable[[socket.socket], None] | None = None
        self.records = 0  #: records sent (stop-the-world counts them to prove quiescence)

    def send(self, data: bytes) -> None:
        if self.while_blocked is None:
            self.sock.sendall(data)
            return
        view = memoryview(data)
        sock = self.sock
        sock.setblocking(False)
        try:
            while view:
                try:
                    view = view[sock.send(view):]
                except (BlockingIOError, InterruptedError):
                    self.while_blocked(sock)
        finally:
            sock.setblocking(True)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class ChannelClosed(Exception):
    """The producer's end disconnected before end of stream: it died."""

    def __init__(self, message: str, producer: str | None = None):
        super().__init__(message)
        self.producer = producer


class InputChannel:
    __slots__ = ("id", "sock", "reader", "back_edge", "ended", "records")

    def __init__(self, channel_id: str, sock: socket.socket, reader: codec.FrameReader, back_edge: bool):
        self.id = channel_id
        self.sock = sock
        self.reader = reader
        self.back_edge = back_edge
        self.ended = False
        self.records = 0  #: records taken in for processing

    def fill(self) -> None:
        """Read what the socket has (call when it is readable)."""
        data = self.sock.recv(RECV_SIZE)
        if not data:
            raise ChannelClosed(
                f"input channel {self.id} closed before end of stream (its producer died)", self.id.split("->")[0]
            )
        self.reader.feed(data)

    def next_frame(self) -> tuple[int, bytes] | None:
        return self.reader.next_frame()


def accept_inputs(listener: socket.socket, expected: dict[str, bool], timeout: float) -> dict[str, InputChannel]:
    """Accept one connection per expected channel id; each opens with a HELLO frame."""
    channels: dict[str, InputChannel] = {}
    listener.settimeout(timeout)
    while len(channels) < len(expected):
        sock, _ = listener.accept()
        sock.settimeout(timeout)
        tune(sock)
        reader = codec.FrameReader()
        frame: Any = None
        while frame is None:
            data = sock.recv(RECV_SIZE)
            if not data:
                raise ChannelClosed("a producer disconnected during the handshake")
            reader.feed(data)
            frame = reader.next_frame()
        kind, payload = frame
        cid = codec.unpack(payload)
        if kind != codec.FrameKind.HELLO or cid not in expected or cid in channels:
            raise ChannelClosed(f"unexpected handshake on a data connection: {cid!r}")
        sock.settimeout(None)
        channels[cid] = InputChannel(cid, sock, reader, expected[cid])
    return channels
