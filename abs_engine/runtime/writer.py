"""Writes snapshot files and acknowledges them, on a thread of its own: the task thread
only encodes its state (a consistent copy) and goes on processing.

Invariants: a snapshot file is written through ``remote.write_task_state`` (locally:
the ``chk-N`` directory must be a real directory, the file is created exclusively, nothing
planted in the checkpoint directory is followed or overwritten, and it is fsynced together
with its directory; remotely: one put, never over an existing object), and only then
acknowledged. The name must be a plain file name, refused before anything is written.
"""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol

from .. import fs, messages
from ..checkpoint.remote import write_task_state
from .control import ControlLink


class Writer(Protocol):
    """Where a task hands its snapshot files: a writer thread in a worker (SnapshotWriter),
    or at once on the task's own thread (memory.InlineWriter)."""

    def submit(self, job: Job) -> None: ...

    def spill(self, job: SpillJob) -> None: ...

    def wait_spills(self, limit: int) -> None: ...

    def flush(self) -> None: ...


class SnapshotWriter:
    """Writes snapshot files and sends the acknowledgements, off the task thread."""

    def __init__(self, control: ControlLink, task: str, root: str, on_error: Callable[[BaseException], None]):
        self.control = control
        self.task = task
        self.root = root  #: the checkpoint location: a local directory or a remote URI
        self.on_error = on_error
        self.jobs: queue.Queue[Job | SpillJob | None] = queue.Queue()
        #: Bytes of channel state handed over to spill and not written yet.
        self.spilling = 0
        self._spilled = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="snapshot-writer", daemon=True)
        self.thread.start()

    def submit(self, job: Job) -> None:
        """Write ``job.blob`` (or what ``job.blob()`` returns, called on this thread: it may
        wait for a forked encoder) as the task's state file, then acknowledge it with the
        time the task thread spent (``sync_ms``) and the time from here to the ack."""
        self.jobs.put(job)

    def spill(self, job: SpillJob) -> None:
        """Write ``job.blob()`` (``job.size`` bytes of records) as a spill file of its
        checkpoint and append (name, size, sha256) to ``job.refs``, on this thread, before
        any later submission: the state file that lists ``refs`` is built after every spill
        before it (checkpoint/spill.py). Nothing is acknowledged."""
        with self._spilled:
            self.spilling += job.size
        self.jobs.put(job)

    def wait_spills(self, limit: int) -> None:
        """Block until at most ``limit`` bytes handed over to spill are still unwritten: the
        task thread's back-pressure, so a slow disk or store cannot let them pile up."""
        with self._spilled:
            while self.spilling > limit and self.thread.is_alive():
                self._spilled.wait(1.0)  # notified after each spill; the timeout only re-checks liveness

    def flush(self) -> None:
        """Wait until every submitted snapshot is written and acknowledged."""
        self.jobs.join()

    def _run(self) -> None:
        if fs.is_remote(self.root):
            try:
                fs.Store(self.root)  # connect while the task starts, not in the first checkpoint
            except fs.StoreError:
                pass  # reported by the first write, with the checkpoint it failed
        while True:
            job = self.jobs.get()
            try:
                if job is None:
                    return
                if isinstance(job, SpillJob):
                    blob = job.blob()
                    write_task_state(self.root, job.checkpoint_id, job.name, blob)
                    job.refs.append((job.name, len(blob), hashlib.sha256(blob).hexdigest()))
                    del blob
                    with self._spilled:
                        self.spilling -= job.size
                        self._spilled.notify_all()
                    continue
                blob = job.blob() if callable(job.blob) else job.blob
                write_task_state(self.root, job.checkpoint_id, job.name, blob)
                self.control.send(ack_of(self.task, job, blob, hashlib.sha256(blob).hexdigest(), time.perf_counter()))
            except BaseException as e:  # noqa: BLE001 - reported to the driver, then the worker dies
                self.on_error(e)
            finally:
                self.jobs.task_done()


@dataclass(frozen=True)
class Job:
    """A state file to write and acknowledge: what the task hands its writer."""

    checkpoint_id: int
    name: str
    blob: bytes | Callable[[], bytes]
    alignment_ms: float
    logged: int
    finished: bool
    sync_ms: float
    submitted: float  #: the task clock's perf_counter() at submit
    base: int | None = None  #: incremental: the checkpoint this file's deltas apply to (None: full)
    known: int | None = None  #: incremental: the newest completion the task may build on
    unaligned: bool = False
    inflight_bytes: int = 0
    channel_state: int = 0
    first_seen: float = 0.0  #: wall time the checkpoint's first barrier (or trigger) reached the task


@dataclass(frozen=True)
class SpillJob:
    """Channel state of a checkpoint in progress, written ahead of its state file."""

    checkpoint_id: int
    name: str
    blob: Callable[[], bytes]
    refs: list[tuple[str, int, str]]  #: the session's spill files, appended to once written
    size: int = 0  #: bytes of records it holds


def ack_of(task: str, job: Job, blob: bytes, sha256: str, now: float) -> messages.Ack:
    """The acknowledgement of ``job``, written as ``blob`` (``now``: perf_counter())."""
    return messages.Ack(job.checkpoint_id, task, job.name, len(blob), sha256, job.alignment_ms, job.logged,
                        job.finished, sync_ms=job.sync_ms, async_ms=(now - job.submitted) * 1000, base=job.base,
                        known=job.known, unaligned=job.unaligned, inflight_bytes=job.inflight_bytes,
                        channel_state=job.channel_state, first_seen=job.first_seen)
