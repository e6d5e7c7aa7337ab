"""Back-edge input past ``loop_memory``: spilled to disk and read back in order.

A task reads its back-edge inputs even while it is blocked sending (task.py), so that a
loop of bounded channels cannot deadlock. What it reads and has not processed yet used to
stay in the channel's FrameReader, without bound: a loop that makes records faster than
it consumes them grew its workers until something outside killed them. Now each back-edge
InputChannel has a ``BackEdgeSpill`` between its socket and its reader: the reader takes
at most READER bytes (a small window onto the stream); what arrives beyond waits in the
spill, as the chunks read from the socket, in memory up to the channel's share of
``loop_memory``, then on disk in a ``SpillQueue`` (a FIFO of bytes in private temporary
files). The reader is refilled from the spill's head as it drains. ``LoopBudget`` counts
what a task's back-edges have on disk; past ``loop_disk`` the task fails with LoopOverflow
(fatal: a replay of the same loop overflows again).

The spill holds the channel's raw bytes (length-prefixed frames exactly as they came off
the wire, cut anywhere), not parsed frames: nothing is decoded or copied per frame, a
frame may straddle the reader and the spill, and barriers, watermarks and end of stream
travel through it like records.

Invariants:
- Per channel, the order of its bytes is: read ahead (``InputChannel.ahead``, whole
  frames) -> the reader -> the spill's memory chunks -> the spill's disk queue (head to
  tail) -> the socket. While the spill holds anything, every byte read from the socket
  goes to its tail (to memory only while its disk part is empty); the reader is refilled
  only from its head.
- Memory for a back-edge's unprocessed input: the reader's READER bytes (plus one refill
  and the frame being completed), the spill's chunks (at most its share of loop_memory),
  the disk queue's write buffer and one read chunk. Read-ahead for a checkpoint's log is
  bounded apart, by ``channel_state_memory`` (task.py).
- ``SpillQueue.bytes`` is exactly the bytes pushed and not yet popped. Disk space is
  released segment by segment as the head passes them (an emptied queue truncates its
  last segment), so the files use at most ``bytes`` plus one segment (and one write).
- The files are created already unlinked (``tempfile.TemporaryFile``) in ``loop_spill_dir``
  (or the system's temporary directory): private to the worker, gone when it exits however
  it exits. They are a buffer, not state: a restore never reads them (what was in flight
  at a checkpoint is in its channel-state logs, runtime/channel_state.py).
"""

from __future__ import annotations

import os
import tempfile
from collections import deque
from typing import Callable, Iterable

from ..errors import LoopOverflow

#: Bytes of one spill file; a new one is started when the last is full. The disk the
#: queue uses is at most its live bytes plus one segment (the head's consumed part).
SEGMENT = 64 << 20
#: Bytes pushed that are held in memory and written out together (fewer, larger writes).
WRITE_BUFFER = 1 << 20
#: Bytes a refill moves from the disk's head into the reader at a time.
REFILL = 1 << 20
#: Bytes of socket input a back-edge's reader takes before what arrives waits in its
#: spill: the reader stays a small window onto the stream (a large bytearray that is
#: consumed from the front and appended to is copied whole when it grows again).
READER = 1 << 20


class _Segment:
    """One unlinked file of the queue: bytes [pos, size) of it are still queued."""

    __slots__ = ("file", "fd", "size", "pos")

    def __init__(self, directory: str | None):
        self.file = tempfile.TemporaryFile(dir=directory, prefix="abs-loop-", buffering=0)
        self.fd = self.file.fileno()
        self.size = 0
        self.pos = 0

    def write(self, data: bytes | bytearray) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(self.fd, view, self.size)
            self.size += n
            view = view[n:]

    def read(self, limit: int) -> bytes:
        data = os.pread(self.fd, min(limit, self.size - self.pos), self.pos)
        if not data:  # the file is shorter than written: never, unless someone truncated it
            raise OSError(f"spill file of a back-edge ended at {self.pos} of {self.size} bytes")
        self.pos += len(data)
        return data

    def reset(self) -> None:
        """Every byte has been read: free the disk and start again at the beginning."""
        os.ftruncate(self.fd, 0)
        self.size = self.pos = 0

    def close(self) -> None:
        self.file.close()


class SpillQueue:
    """A FIFO of bytes on disk: ``push`` at the tail, ``pop`` at the head, in order.

    Bytes pushed are buffered in memory up to ``write_buffer``, then appended to the last
    segment file (a new one when it holds ``segment`` bytes). ``pop`` reads the oldest
    segment first and the unwritten buffer last. No file exists until the first write."""

    def __init__(self, directory: str | None = None, segment: int = SEGMENT, write_buffer: int = WRITE_BUFFER):
        if segment <= 0 or write_buffer <= 0:
            raise ValueError("segment and write_buffer must be > 0 bytes")
        self.directory = directory
        self.segment = segment
        self.write_buffer = write_buffer
        self._segments: deque[_Segment] = deque()
        self._tail = bytearray()  #: pushed, not written yet: after every segment's bytes
        self.bytes = 0  #: pushed and not popped
        self.pushed = 0  #: bytes ever pushed (statistics)
        self.closed = False

    def __len__(self) -> int:
        return self.bytes

    @property
    def files(self) -> int:
        """Spill files open (each already unlinked)."""
        return len(self._segments)

    @property
    def disk_bytes(self) -> int:
        """Bytes the files occupy now: queued ones and the head's consumed part."""
        return sum(s.size for s in self._segments)

    def push(self, data: bytes | bytearray | memoryview) -> None:
        if self.closed:
            raise ValueError("push to a closed SpillQueue")
        if not data:
            return
        self._tail += data
        self.bytes += len(data)
        self.pushed += len(data)
        if len(self._tail) >= self.write_buffer:
            self._write_tail()

    def _write_tail(self) -> None:
        last = self._segments[-1] if self._segments else None
        if last is None or last.size >= self.segment:
            last = _Segment(self.directory)
            self._segments.append(last)
        last.write(self._tail)
        self._tail = bytearray()  # a new object: the old buffer's memory is freed

    def pop(self, limit: int = REFILL) -> bytes:
        """Up to ``limit`` (> 0) of the oldest bytes (fewer at a segment's end; b"": empty)."""
        if limit <= 0:
            raise ValueError("pop needs a limit > 0")
        segments = self._segments
        while segments:
            head = segments[0]
            if head.pos < head.size:
                data = head.read(limit)
                self.bytes -= len(data)
                return data
            if len(segments) > 1:  # passed: its disk space is freed as it closes
                segments.popleft().close()
            else:
                head.reset()
                break
        data = bytes(self._tail[:limit])
        del self._tail[:limit]
        self.bytes -= len(data)
        return data

    def close(self) -> None:
        """Drop everything queued and close (so delete) the files. Idempotent."""
        self.closed = True
        while self._segments:
            self._segments.popleft().close()
        self._tail = bytearray()
        self.bytes = 0


class LoopBudget:
    """The back-edge inputs of one task: their shares of ``memory`` and, across them, the
    ``disk`` limit (None: no bound). ``held()`` says how many bytes of back-edge input the
    task holds in memory besides the spills' own (readers and read-ahead), for the error."""

    def __init__(self, task: str, operator: str, channels: Iterable[str], memory: int, disk: int | None,
                 directory: str | None = None, held: Callable[[], int] | None = None):
        self.task = task
        self.operator = operator
        self.channels = tuple(channels)
        if not self.channels:
            raise ValueError("a LoopBudget is for a task with back-edge inputs")
        self.memory = memory
        self.disk = disk
        self.directory = directory
        self.held = held or (lambda: 0)
        #: Bytes each back-edge may keep queued in memory before what arrives goes to disk.
        self.share = max(1, memory // len(self.channels))
        #: Small limits get small segments: the files use at most loop_disk plus a quarter.
        self.segment = SEGMENT if disk is None else min(SEGMENT, max(WRITE_BUFFER, disk // 4))
        self.spills: dict[str, BackEdgeSpill] = {}
        self.spilled = 0  #: bytes queued on disk over every back-edge (SpillQueue.bytes summed)
        self.peak_spilled = 0

    def channel(self, channel_id: str) -> "BackEdgeSpill":
        if channel_id not in self.channels:
            raise KeyError(f"{channel_id!r} is not a back-edge of task {self.task}")
        spill = self.spills[channel_id] = BackEdgeSpill(channel_id, SpillQueue(self.directory, self.segment,
                                                                                WRITE_BUFFER), self)
        return spill

    @property
    def in_memory(self) -> int:
        """Bytes the spills hold in memory (their queues' heads)."""
        return sum(s.memory_bytes for s in self.spills.values())

    def _spilled(self, n: int) -> None:
        self.spilled += n
        if self.spilled > self.peak_spilled:
            self.peak_spilled = self.spilled
        if self.disk is not None and self.spilled > self.disk:
            raise LoopOverflow(self.task, self.operator, self.channels, self.in_memory + self.held(), self.spilled,
                               self.memory, self.disk)

    def close(self) -> None:
        for s in self.spills.values():
            s.close()
        self.spilled = 0


class BackEdgeSpill:
    """One back-edge's queue between its socket and its reader: bytes the reader has no
    room for wait here, the oldest in memory (up to the channel's share of loop_memory),
    the rest on disk. Every byte in memory precedes every byte on disk: while the disk
    part holds anything, what arrives goes behind it."""

    __slots__ = ("channel", "memory", "memory_bytes", "queue", "budget")

    def __init__(self, channel: str, queue: SpillQueue, budget: LoopBudget):
        self.channel = channel
        #: Chunks as they were read from the socket (each freed whole once the reader has it).
        self.memory: deque[bytes] = deque()
        self.memory_bytes = 0
        self.queue = queue
        self.budget = budget

    @property
    def share(self) -> int:
        return self.budget.share

    @property
    def waiting(self) -> int:
        """Bytes waiting here, in memory and on disk."""
        return self.memory_bytes + self.queue.bytes

    def wants(self, buffered: int, incoming: int) -> bool:
        """Should ``incoming`` bytes from the socket wait here rather than go to the reader,
        which holds ``buffered``? Yes while anything waits here (order), or if the reader
        would hold more than READER bytes (it stays a small window onto the stream)."""
        return self.memory_bytes > 0 or self.queue.bytes > 0 or buffered + incoming > READER

    def push(self, data: bytes) -> None:
        """Queue bytes read from the socket; LoopOverflow past the task's ``loop_disk``."""
        if not self.queue.bytes and self.memory_bytes + len(data) <= self.budget.share:
            self.memory.append(data)
            self.memory_bytes += len(data)
            return
        try:
            self.queue.push(data)
        except OSError as e:  # ENOSPC, ENOENT, EACCES...: say where, and what to do
            raise OSError(e.errno, f"cannot spill back-edge {self.channel} of task {self.budget.task} to "
                                   f"{self.budget.directory or tempfile.gettempdir()} ({e.strerror or e}): it "
                                   "must be an existing directory this worker can write, with room for "
                                   "loop_disk bytes; fix it or point loop_spill_dir elsewhere") from e
        self.budget._spilled(len(data))

    def pop(self, limit: int = REFILL) -> bytes:
        """The oldest bytes waiting: a chunk from memory (as read, at most RECV_SIZE) or up
        to ``limit`` from disk; b"" if none."""
        if self.memory:
            data = self.memory.popleft()
            self.memory_bytes -= len(data)
            return data
        data = self.queue.pop(limit)
        self.budget.spilled -= len(data)
        return data

    def close(self) -> None:
        self.memory.clear()
        self.memory_bytes = 0
        self.queue.close()
