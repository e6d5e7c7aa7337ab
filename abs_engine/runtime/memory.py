"""The task's environment in memory: connections as byte queues, and a snapshot writer that
writes at once on the caller's thread.

The runtime's task (runtime/task.py) is written against its environment -- input and
output channels over a link, a control link, a snapshot writer and a clock -- and not
against sockets and threads. The worker process gives it TCP (or TLS) links, a writer
thread and the system clock; the deterministic simulation (abs_engine/simulation/) and the
in-process executor give it what this module holds, so they run the very same task code in
one thread (the simulation one step at a time, in an order a seeded scheduler picks).

Invariants:
- A ``MemoryLink`` is FIFO and unbounded: a send never blocks (so one thread can drive
  every task) and never loses or reorders bytes. Bytes are the same frames a socket
  carries (codec.frame / messages.encode): the wire format is exercised, not bypassed.
- ``InlineWriter`` writes a state file and sends its acknowledgement before it returns;
  spills are written in submission order before the state file that lists them, as the
  writer thread does (runtime/writer.py).
"""

from __future__ import annotations

import hashlib
from collections import deque
from typing import Callable

from .. import codec, messages
from .control import ControlLink
from .writer import Job, SpillJob, ack_of


class MemoryLink:
    """One end of an in-memory connection: reads from ``inbox``, sends to ``outbox``.

    The subset of ``wire.Wire`` the channels and the control link use, with no socket
    (``sock`` is None: nothing to select on; the driver of the tasks knows what is
    readable because it holds the queues)."""

    __slots__ = ("inbox", "outbox", "closed", "sock")

    def __init__(self, inbox: deque[bytes], outbox: deque[bytes]) -> None:
        self.inbox = inbox
        self.outbox = outbox
        self.closed = False  #: the peer went away: reads report it once the inbox is empty
        self.sock = None

    @staticmethod
    def pair() -> tuple["MemoryLink", "MemoryLink"]:
        """Two connected ends: what one sends, the other reads, in order."""
        a_to_b: deque[bytes] = deque()
        b_to_a: deque[bytes] = deque()
        return MemoryLink(b_to_a, a_to_b), MemoryLink(a_to_b, b_to_a)

    def read_nowait(self, chunk: int, limit: int | None = None) -> tuple[list[bytes], bool]:
        got: list[bytes] = []
        total = 0
        inbox = self.inbox
        while inbox and (limit is None or total < limit):
            data = inbox.popleft()
            if len(data) > chunk:
                data, rest = data[:chunk], data[chunk:]
                inbox.appendleft(rest)
            got.append(data)
            total += len(data)
        return got, self.closed and not inbox

    def recv(self, n: int, flags: int = 0) -> bytes | None:
        """Up to ``n`` bytes; b"" once the peer closed. Never blocks: an empty inbox of an
        open link is a caller's error (a single-threaded driver must not wait on itself)."""
        if not self.inbox:
            if self.closed:
                return b""
            raise BlockingIOError("nothing to read on an in-memory link (it would block for ever)")
        data = self.inbox.popleft()
        if len(data) > n:
            data, rest = data[:n], data[n:]
            self.inbox.appendleft(rest)
        return data

    def take_rest(self) -> bytes:
        return b""

    def seal(self, data: bytes | memoryview) -> bytes | memoryview:
        return data

    def sendall(self, data: bytes | memoryview) -> None:
        if data:
            self.outbox.append(bytes(data))

    def pending(self) -> int:
        """Bytes waiting to be read at this end."""
        return sum(len(b) for b in self.inbox)

    def close(self) -> None:
        self.closed = True


class InlineWriter:
    """``SnapshotWriter``'s interface, synchronous: ``put(checkpoint_id, name, blob)``
    stores a file (an in-memory blob store, or ``remote.write_task_state`` on a root)."""

    def __init__(self, control: ControlLink, task: str, put: Callable[[int, str, bytes], None],
                 clock: Callable[[], float]) -> None:
        self.control = control
        self.task = task
        self.put = put
        self.clock = clock

    def submit(self, job: Job) -> None:
        blob = job.blob() if callable(job.blob) else job.blob
        self.put(job.checkpoint_id, job.name, blob)
        self.control.send(ack_of(self.task, job, blob, hashlib.sha256(blob).hexdigest(), self.clock()))

    def spill(self, job: SpillJob) -> None:
        blob = job.blob()
        self.put(job.checkpoint_id, job.name, blob)
        job.refs.append((job.name, len(blob), hashlib.sha256(blob).hexdigest()))

    def wait_spills(self, limit: int) -> None:
        return None  # every spill is written before spill() returns

    def flush(self) -> None:
        return None  # every snapshot is written before submit() returns


def memory_control() -> tuple[ControlLink, DriverEnd]:
    """A task's control link and the driver's end of it."""
    task_end, driver_end = MemoryLink.pair()
    return ControlLink(task_end), DriverEnd(driver_end)


class DriverEnd:
    """The driver's end of a task's in-memory control link: messages in and out, through
    the same encoding (messages.encode/decode) and framing as over a socket."""

    def __init__(self, link: MemoryLink) -> None:
        self.link = link
        self.reader = codec.FrameReader()

    def send(self, msg: messages.Message) -> None:
        self.link.sendall(messages.encode(msg))

    def waiting(self) -> bool:
        """Something has arrived (maybe part of a message only: never, links carry whole frames)."""
        return bool(self.link.inbox) or self.reader.buffered() > 0

    def receive_one(self) -> messages.Message | None:
        """The oldest message that has arrived, if any."""
        while (f := self.reader.next_frame()) is None:
            if not self.link.inbox:
                return None
            self.reader.feed(self.link.inbox.popleft())
        return messages.decode(f[1])
