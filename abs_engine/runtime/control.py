"""The worker's end of the control connection to the driver (coordinator).

Sends may come from the task thread, the snapshot-writer thread and the watchdog thread,
so they are locked. Receives happen only on the task thread. The connection is mutually
authenticated (auth.py) before the first frame: a worker takes plan and code only from a
driver that knows this attempt's secret. With the job's TLS material it is mutual TLS
first (wire.py); sends seal and write under the one lock, so frames go out in order.
"""

from __future__ import annotations

import socket
import threading
from collections import deque

from typing import TYPE_CHECKING

from .. import auth, codec, messages
from ..tls import Material
from ..wire import Wire
from .channel import RECV_SIZE

if TYPE_CHECKING:
    from .memory import MemoryLink


CONNECT_TIMEOUT = 30.0  #: the driver accepts while it starts every worker of the attempt


class DriverGone(Exception):
    """The driver closed the control connection: the worker must stop."""


class ControlLink:
    """Messages to and from the driver over one link (``over``): a socket's ``Wire`` in a
    worker (``connect``), a ``memory.MemoryLink`` in the simulation."""

    def __init__(self, wire: Wire | MemoryLink):
        self.wire = wire
        self.sock: socket.socket | None = wire.sock  #: None over memory: nothing to select on
        self.reader = codec.FrameReader()
        self.reader.feed(self.wire.take_rest())
        self._lock = threading.Lock()
        self.inbox: deque[messages.Message] = deque()

    @classmethod
    def connect(cls, address: tuple[str, int], secret: bytes, material: Material | None = None) -> "ControlLink":
        """Connect to the driver and authenticate (auth.py) before anything else."""
        wire = Wire.connect(address, material, CONNECT_TIMEOUT)
        try:
            auth.client_handshake(wire, secret, CONNECT_TIMEOUT)
        except BaseException:
            wire.sock.close()
            raise
        wire.sock.settimeout(None)
        return cls(wire)

    def send(self, msg: messages.Message) -> None:
        data = messages.encode(msg)
        with self._lock:
            self.wire.sendall(data)

    def _drain_reader(self) -> None:
        while (f := self.reader.next_frame()) is not None:
            self.inbox.append(messages.decode(f[1]))

    def fill(self) -> None:
        data = self.wire.recv(RECV_SIZE)
        if data is None:
            return  # part of a TLS record
        if not data:
            raise DriverGone("the driver closed the control connection")
        self.reader.feed(data)
        self._drain_reader()

    def poll(self) -> list[messages.Message]:
        """Every message that has arrived, without blocking. MSG_DONTWAIT, not a blocking
        mode switch: the snapshot-writer thread may be sending on this socket meanwhile."""
        chunks, closed = self.wire.read_nowait(RECV_SIZE)
        for data in chunks:
            self.reader.feed(data)
            self._drain_reader()
        if closed:
            raise DriverGone("the driver closed the control connection")
        out = list(self.inbox)
        self.inbox.clear()
        return out

    def receive(self) -> messages.Message:
        """Block until a message arrives; return the oldest one."""
        while not self.inbox:
            self.fill()
        return self.inbox.popleft()
