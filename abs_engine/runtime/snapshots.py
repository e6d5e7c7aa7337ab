"""A task's snapshots: its state captured at a checkpoint, the channel state logged after
it, and the files that reach the writer.

Order at a snapshot (the task's invariant): operators snapshot -> state encoded (a
consistent copy: inline, or by a forked child) -> barrier forwarded on every output ->
channel state (back-edges; every input when unaligned) logged until barrier n arrives on
each -> state + logs written and fsynced off the task thread -> acknowledgement. While a
log waits on an input, that input is read ahead of processing up to its barrier, so the
checkpoint completes when the bytes in flight have arrived, not when they have been
processed (the point of unaligned checkpoints). Logs past ``channel_state_memory`` spill
to files of the checkpoint, written before the state file that lists them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable

from .. import codec
from ..checkpoint import snapshot_file
from ..checkpoint import spill
from . import snapshot_encoding
from .barriers import BarrierHandler
from .chain import Chain
from .channel import InputChannel
from .channel_state import Session
from .clock import Clock
from .increments import Increments
from .task_options import TaskOptions
from .writer import Job, SpillJob, Writer


@dataclass(frozen=True)
class Captured:
    """What a task captured at its snapshot, held by its channel-state session until the
    session completes and its state file is written."""

    encoding: snapshot_encoding.Encoding  #: the operators' states, encoded inline or by a forked child
    alignment_ms: float
    finished: bool  #: the task had sent end of stream when it snapshotted
    sync_ms: float  #: the task thread's share: operators' snapshot() and the copy
    base: int | None  #: incremental: the checkpoint the deltas apply to (None: a full file)
    deltas: list[str]  #: incremental: the operators written as deltas
    known: int | None  #: incremental: the newest completion the task may build on (None: it writes no deltas)
    first_seen: float  #: wall time the checkpoint's first barrier (or trigger) reached the task


class Snapshots:
    """``broadcast(frame)``: a frame to every output of the task (unless it has finished);
    ``runnable``: the task's queue of inputs with frames to process."""

    def __init__(self, task_id: str, chain: Chain, barriers: BarrierHandler, writer: Writer, options: TaskOptions,
                 clock: Clock, inputs: dict[str, InputChannel], broadcast: Callable[[bytes], None],
                 runnable: deque[InputChannel]):
        self.task_id, self.chain, self.barriers, self.writer = task_id, chain, barriers, writer
        self.backlog = barriers.log
        self.options, self.clock, self.inputs = options, clock, inputs
        self.broadcast, self.runnable = broadcast, runnable
        #: Incremental checkpoints: which file a snapshot builds on (runtime/increments.py).
        self.increments = Increments(chain.all_operators(), options.incremental)
        #: Checkpoint id -> wall time its first barrier (or trigger) reached this task: the
        #: end of its start delay (Flink's), the time the barrier spent queued behind data.
        self.first_seen: dict[int, float] = {}

    def take(self, checkpoint_id: int, finished: bool, forward: bool = True, unaligned: bool = False,
             arrived: set[str] | None = None) -> None:
        """forward=False: stop-the-world, nothing is in flight and no barrier travels.
        unaligned: log every input's state, not only the back-edges'; ``arrived``: the
        inputs that delivered this barrier already."""
        clock = self.clock
        began = clock.perf_counter()
        seen = self.first_seen.pop(checkpoint_id, 0.0) or clock.time()
        for old in [c for c in self.first_seen if c < checkpoint_id]:
            del self.first_seen[old]
        states = self.chain.snapshot(checkpoint_id)
        # Incremental: only the keys changed since the base (built here: O(changes)).
        base, deltas, entries = self.increments.prepare(checkpoint_id, states)
        # The consistent copy: encoded here if small, else by a forked child (copy-on-write).
        encoding = snapshot_encoding.start(states, self.options.snapshot_encoding, entries)
        del states
        sync_ms = (clock.perf_counter() - began) * 1000
        if forward:
            self.broadcast(codec.frame(codec.FrameKind.BARRIER, codec.barrier_payload(checkpoint_id, unaligned)))
        alignment_ms = 0.0
        if self.barriers.aligning_since is not None:
            alignment_ms = (clock.perf_counter() - self.barriers.aligning_since) * 1000
            self.barriers.aligning_since = None
        payload = Captured(encoding, alignment_ms, finished, sync_ms, base, deltas, self.increments.known, seen)
        if not forward:
            # Stop-the-world: nothing is in flight (proven by counting), so no back-edge
            # has anything to log, and no barrier will come round to close a session.
            self.write(Session(checkpoint_id, payload, set(), {}))
            return
        released, completed = self.barriers.started(checkpoint_id, payload, unaligned, arrived or ())
        for cid in released:
            self.runnable.append(self.inputs[cid])
        for s in completed:
            self.write(s)
        session = self.backlog.sessions.get(checkpoint_id)
        if session is not None:
            # Frames read ahead for older logs are not processed yet: in flight for this one too.
            for cid in list(session.waiting):
                ch = self.inputs[cid]
                for kind, data in ch.ahead:
                    if kind == codec.FrameKind.RECORDS:
                        self.backlog.log_into(checkpoint_id, cid, data)
                if self.backlog.due:
                    self.spill()
                if ch.ahead and ch.ahead[-1][0] == codec.FrameKind.END:  # its end was read ahead
                    for s in self.backlog.end_ahead(cid).completed:
                        self.write(s)
            for cid in list(session.waiting):
                self.read_ahead(self.inputs[cid])

    def read_ahead(self, ch: InputChannel) -> None:
        """Move ``ch``'s frames from its reader to its read-ahead queue, logging them, while a
        log waits on it: up to the barrier of the newest waiting log (barriers of older
        ones are handled on the way), a newer barrier, or end of stream."""
        try:
            self.read_ahead_frames(ch)
        finally:
            if ch.has_frames():
                self.runnable.append(ch)  # bytes read here raise no select event any more

    def read_ahead_frames(self, ch: InputChannel) -> None:
        log = self.backlog
        fetched = False
        limit = log.memory_limit
        while not ch.ahead_stopped:
            upto = log.waiting_on(ch.id)
            if not upto:
                return
            if limit is not None and sum(c.ahead_bytes for c in self.inputs.values()) >= limit:
                # Memory bound: what is read ahead waits to be processed, so reading on would
                # only move the backlog from the kernel's buffers into ours, checkpoint after
                # checkpoint. Reading resumes (service) as processing frees room.
                return
            f = ch.read_frame()  # the reader's, refilled from the spill: the channel's order
            if f is None:
                if fetched or ch.ended:
                    return
                ch.fill_nowait()
                fetched = True
                continue
            kind, data = f
            ch.push_ahead(kind, data)
            if kind == codec.FrameKind.RECORDS:
                log.on_records(ch.id, data)
                if log.due:
                    self.spill()
            elif kind == codec.FrameKind.BARRIER:
                cid, _ = codec.parse_barrier(data)
                self.seen(cid)
                if cid > upto or (ch.back_edge and self.barriers.loop_ended):
                    ch.ahead_stopped = True  # handled in order when processed
                    return
                for s in log.on_barrier(ch.id, cid).completed:
                    self.write(s)
            elif kind in (codec.FrameKind.WATERMARK, codec.FrameKind.LATENCY):
                continue  # handled in order when processed; not channel state (docs/event-time.md)
            else:  # END (or anything else): nothing can be read past it
                ch.ahead_stopped = True
                if kind == codec.FrameKind.END:
                    for s in log.end_ahead(ch.id).completed:
                        self.write(s)
                return

    def seen(self, checkpoint_id: int) -> None:
        if checkpoint_id > self.barriers.last_snapshot and checkpoint_id not in self.first_seen:
            self.first_seen[checkpoint_id] = self.clock.time()

    def state_file(self) -> str:
        tag = self.options.file_tag
        return f"{self.task_id}.{tag}.state" if tag else f"{self.task_id}.state"

    def spill(self) -> None:
        """Sessions past ``channel_state_memory``: what they logged goes to spill files
        (written by the writer, in order, before their state files)."""
        limit = self.backlog.memory_limit or 0
        for s in self.backlog.due_to_spill():
            size = s.memory
            logs = self.backlog.take(s)
            self.writer.spill(SpillJob(s.checkpoint_id, spill.file_name(self.state_file(), s.spills - 1),
                                       lambda logs=logs: spill.encode(logs), s.spilled, size))  # type: ignore[misc]
            del logs
        # Channel state held is then at most the limit in the logs plus the limit queued.
        self.writer.wait_spills(limit)

    def write(self, s: Session) -> None:
        c: Captured = s.payload
        # By channel id: the same state file whatever order the log's sets iterate in.
        logs = {ch: codec.join_arrays(frames) if frames else codec.pack([]) for ch, frames in sorted(s.logs.items())}
        task, cid, spilled = self.task_id, s.checkpoint_id, s.spilled

        def blob() -> bytes:  # on the writer thread, after the session's spills: waits for a forked encoder
            return snapshot_file.encode(task, cid, c.encoding.result(), logs, c.finished, c.base, c.deltas,
                                        spilled)

        self.writer.submit(Job(s.checkpoint_id, self.state_file(), blob, c.alignment_ms, s.logged, c.finished,
                               c.sync_ms, self.clock.perf_counter(), c.base, c.known, s.unaligned, s.logged_bytes,
                               s.regular_logged, c.first_seen))
