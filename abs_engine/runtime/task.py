"""The protocol of one task: a chain of operators, its input and output channels.

Invariants:
- Records are processed a batch at a time; a batch crosses a process boundary as one
  msgpack frame.
- An aligned snapshot for checkpoint n reflects exactly the records before barrier n on
  every regular input (ABS): a blocked input is not processed, not even from our buffer.
- An unaligned snapshot (Chandy-Lamport) is taken at the first barrier n on any input or at
  the coordinator's trigger, whichever comes first; every record not yet processed then
  and before barrier n on its input is channel state. A barrier's payload says which kind
  it is; an aligned checkpoint whose alignment passes ``aligned_timeout`` turns unaligned.
- Order at a snapshot: operators snapshot -> state encoded (a consistent copy) -> barrier
  forwarded on every output -> channel state (back-edges; every input when unaligned)
  logged until barrier n arrives on each -> state + logs written and fsynced off the task
  thread -> acknowledgement. While a log waits on an input, that input is read ahead of
  processing up to its barrier, so the checkpoint completes when the bytes in flight have
  arrived, not when they have been processed (the point of unaligned checkpoints).
- Back-edge input past ``loop_memory`` spills to disk and is read back in order
  (runtime/overflow.py); past ``loop_disk`` spilled the task fails with LoopOverflow,
  naming the loop. A frame is processed in batches of at most ``GATHER_MAX`` records, so
  an operator that emits more than it takes in cannot grow batches (and the frames they
  become) trip after trip.
- The task never reads a socket, a thread or the system clock itself: a driver hands it
  frames (``take``), control messages (``on_control``) and source reads (``read_source``),
  and it reads time from its ``clock``. The worker's driver is runtime/task_loop.py; the
  deterministic simulation drives the same class over runtime/memory.py.
- A task whose regular inputs have all ended is triggered directly by the coordinator;
  one that has finished (end of stream everywhere) emits nothing more.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from operators.base import Operator
from operators.eventtime import EventTimeSource

from .. import codec, messages
from ..checkpoint import spill
from ..plan import TaskSpec
from . import snapshot_encoding
from .alignment import BarrierAligner, CollectingBarriers, Outcome
from .chain import Chain, record_repr
from .channel import InputChannel
from .channel_state import ChannelStateLog, Session
from .clock import SYSTEM, Clock
from .control import ControlLink
from .increments import Increments
from .output import Output
from .overflow import LoopBudget
from .watermarks import MAX_WATERMARK, MIN_WATERMARK, Change, Step, WatermarkValve
from .writer import Job, SpillJob, Writer

GATHER_MAX = 8192  # records gathered from buffered frames before they are processed
#: With unaligned checkpoints possible, a gathered batch is kept to about this much work
#: (measured per record), so a trigger waits for at most that: a slow stage's batch of
#: GATHER_MAX records could otherwise hold the task for a second.
BATCH_WORK = 0.01
#: Responsive, before a batch has been measured: a small first batch (a slow stage's first
#: batch of GATHER_MAX records could hold up the job's first unaligned checkpoint).
FIRST_BATCH = 64

__all__ = ["GATHER_MAX", "LoopNotQuiet", "Task", "TaskOptions", "record_repr"]


class LoopNotQuiet(Exception):
    """Records arrived on a back-edge after the loop was proven drained."""


@dataclass(frozen=True)
class TaskOptions:
    """How a task checkpoints and bounds its memory (the job's options, from Deploy)."""

    #: How snapshots are encoded: "auto", "fork" or "inline" (runtime/snapshot_encoding.py).
    snapshot_encoding: str = "inline"
    incremental: bool = False
    #: Seconds an aligned checkpoint may spend aligning before it turns unaligned (None: never).
    aligned_timeout: float | None = None
    unaligned: bool = False
    channel_state_memory: int | None = None
    #: Back-edge input past ``loop_memory`` spills to disk, up to ``loop_disk`` (None:
    #: memory without bound, as a loop of bounded channels needs; runtime/overflow.py).
    loop_memory: int | None = None
    loop_disk: int | None = None
    loop_spill_dir: str | None = None
    #: State files are named <task>.<tag>.state: a stale attempt's writer can never create
    #: or clobber a file this attempt's metadata references.
    file_tag: str = ""


class Task:
    """The protocol of one task, over its environment: it is handed each frame, control
    message and source read by a driver (runtime/task_loop.py over sockets, the simulation
    over memory), and decides what to process, log, snapshot and send. ``_park`` and
    ``_unpark`` tell the driver an input is blocked by alignment or free again."""

    def __init__(
        self,
        spec: TaskSpec,
        chain: Chain,
        outputs: list[Output],
        inputs: dict[str, InputChannel],
        control: ControlLink,
        writer: Writer,
        options: TaskOptions = TaskOptions(),
        *,
        replay: list[tuple[int, list[Any]]] | None = None,
        restored_finished: bool = False,
        clock: Clock = SYSTEM,
    ):
        self.spec = spec
        self.chain = chain
        self.op_names, self.ops = chain.names, chain.ops
        self.source, self.source_name = chain.source, chain.source_name
        self.activity = chain.activity  #: which operator's code runs, since when: read by the watchdog
        self.outputs = outputs
        self.inputs = inputs
        self.control = control
        self.writer = writer
        self.options = options
        self.clock = clock
        self.replay = replay or []
        #: Restored from a snapshot taken after the task had finished: its final output is
        #: already in that checkpoint, so finish() must not run again; only end of stream does.
        self.restored_finished = restored_finished
        self.aligner = BarrierAligner(c.id for c in inputs.values() if not c.back_edge)
        self.back = [c for c in inputs.values() if c.back_edge]
        self.backlog = ChannelStateLog((c.id for c in self.back), (c.id for c in inputs.values() if not c.back_edge),
                                       options.channel_state_memory)
        self.loop_budget: LoopBudget | None = None
        if self.back and options.loop_memory is not None:
            self.loop_budget = LoopBudget(spec.id, chain.names[0] if chain.names else spec.chain,
                                          (c.id for c in self.back), options.loop_memory, options.loop_disk,
                                          options.loop_spill_dir, self._back_edge_memory)
            for c in self.back:
                c.spill = self.loop_budget.channel(c.id)
        self.aligned_timeout = options.aligned_timeout
        #: Unaligned checkpoints can happen: look at the control connection between frames.
        self.responsive = options.unaligned or options.aligned_timeout is not None
        #: Inputs blocked by an alignment in progress (parked with the driver).
        self._blocked: list[InputChannel] = []
        #: Records gathered before they are processed: GATHER_MAX, or (responsive) what
        #: BATCH_WORK allows at the measured seconds per record.
        self.gather_max = FIRST_BATCH if self.responsive else GATHER_MAX
        self._per_record = 0.0
        self.finished = False
        self.inputs_ended = False  #: every regular input ended (reported once)
        self.loop_ended = False
        self.paused = False  #: stop-the-world: a source reads nothing until Resume
        self.stop = False
        #: Stopped with a savepoint: the driver holds every connection open until Shutdown.
        self.await_shutdown = False
        self.records_in = 0
        self.records_out = 0
        self.blocked_since: float | None = None
        self.last_snapshot = 0  #: a trigger for an id <= this is a duplicate (e.g. barrier then direct)
        #: Checkpoint id -> wall time its first barrier (or trigger) reached this task: the
        #: end of its start delay (Flink's), the time the barrier spent queued behind data.
        self.first_seen: dict[int, float] = {}
        #: Inputs with frames to process, in the order they get a turn.
        self.runnable: deque[InputChannel] = deque()
        self.gathered: list[Any] = []
        #: Incremental checkpoints: which file a snapshot builds on (runtime/increments.py).
        self.increments = Increments(chain.all_operators(), options.incremental)
        #: What may skip records and must have them reported (``_report_skipped``): the
        #: source, operators and out-edges (key functions) whose on_error is "skip", and
        #: operators that report records they drop (a window's late records).
        self.skippers: list[tuple[str, Any]] = [
            (n, g) for n, g in [*chain.all_operators(), *((o.label, o) for o in outputs)]
            if getattr(g, "reports_skipped", False)]
        #: An out-edge's key function may skip records: reported as soon as ``_emit`` is done.
        self.edges_skip = any(getattr(o, "reports_skipped", False) for o in outputs)
        # Event time (runtime/watermarks.py): the regular inputs' watermarks, the operators
        # that act on one, and the last watermark they were given (never decreases).
        self.valve = WatermarkValve(c.id for c in inputs.values() if not c.back_edge)
        self.event_source = chain.source if isinstance(chain.source, EventTimeSource) else None
        self.watermark = MIN_WATERMARK
        self.watermark_ops = [(i, op) for i, op in enumerate(chain.ops)
                              if type(op).on_watermark is not Operator.on_watermark]
        #: Operators with processing-time timers, and when the earliest is due (inf: none).
        self.timed_ops: list[tuple[int, Any]] = [(i, op) for i, op in enumerate(chain.ops)
                                                 if callable(getattr(op, "next_processing_timer", None))]
        self.next_timer = MAX_WATERMARK
        # Side outputs (late records of a window): only a chain's tail can have them.
        self.main_outputs = [o for o in outputs if not o.side]
        self.side_outputs = [o for o in outputs if o.side]
        self.side_op = chain.ops[-1] if self.side_outputs and chain.ops else None

    # ---- what a driver calls ------------------------------------------------------------

    def start(self) -> None:
        """Before any input: end of stream if restored finished, restored timers, and the
        channel state of the restored checkpoint (records in flight at its cut: round a
        loop, or on any input if it was unaligned), each batch into the operator it was
        logged for."""
        if self.restored_finished:
            self._end_outputs()
        if self.timed_ops:
            self._schedule_timers()  # restored processing-time timers are due without a record
        replay, self.replay = self.replay, []
        for start, batch in replay:
            if batch:
                self.records_in += len(batch)
                self._emit(self._process(batch, start))
        if self.source is None:
            self._maybe_finish()  # a task with no regular inputs at all

    def read_source(self) -> None:
        """One batch from the source through the chain (or end of input)."""
        source = self.source
        assert source is not None
        # A timestamps function's RecordError names its record here (poison records).
        batch = self.chain.call(self.source_name or "source", source.read_batch)
        if batch is None:
            if self.event_source is not None:
                self._advance_watermark(MAX_WATERMARK)  # end of input: every window fires
            self._finish()
            return
        if batch:
            self.records_in += len(batch)
            self._emit(self._process(batch, 0) if self.ops else batch)
        if self.skippers:
            self._report_skipped()  # the source's skips (a batch it emptied), the out-edges'
        if self.event_source is not None:
            self._source_status(bool(batch))
        if self.timed_ops:
            self._fire_timers()

    def may_take(self, ch: InputChannel) -> bool:
        """``ch``'s next frame may be processed now: it is not blocked by an alignment, nor
        a back-edge held by its log."""
        if ch.ended:
            return False
        return not self.backlog.is_held(ch.id) if ch.back_edge else not self.aligner.is_blocked(ch.id)

    def take(self, ch: InputChannel) -> bool:
        """Process ``ch``'s next buffered frame, if it may be (``may_take``) and has one."""
        if not self.may_take(ch):
            return False
        frame = ch.next_frame()
        if frame is None:
            return False
        self._on_frame(ch, frame[0], frame[1], frame[2])
        return True

    def flush(self) -> None:
        """Process the records gathered from the buffered frames of all channels as one batch.

        Invariant: called before any barrier or end of stream is handled, so every record
        gathered is processed on the same side of a snapshot as it would be alone. Gathering
        keeps batches large where hash exchanges split them (round a loop they would halve
        on every trip)."""
        if self.gathered:
            batch, self.gathered = self.gathered, []
            self.records_in += len(batch)
            if not self.responsive:
                self._emit(self._process(batch, 0))
                return
            clock = self.clock
            began = clock.perf_counter()
            self._emit(self._process(batch, 0))
            per = (clock.perf_counter() - began) / len(batch)
            self._per_record = per if not self._per_record else 0.8 * self._per_record + 0.2 * per
            self.gather_max = max(1, min(GATHER_MAX, int(BATCH_WORK / max(self._per_record, 1e-9))))
        if self.timed_ops and self.clock.time() >= self.next_timer:
            self._fire_timers()  # a busy task's processing-time timers

    def service(self) -> None:
        """Between frames of a busy task: control messages, read-ahead, aligned timeout."""
        if self.responsive:
            for msg in self.control.poll():
                self.on_control(msg)
        if self.backlog.logging:
            for ch in self.inputs.values():
                if not ch.ended and not ch.ahead_stopped and self.backlog.waiting_on(ch.id):
                    self._read_ahead(ch)
        self.check_aligned_timeout()

    def check_aligned_timeout(self) -> None:
        st = self.aligner.state
        if (self.aligned_timeout is not None and self.blocked_since is not None
                and isinstance(st, CollectingBarriers)
                and self.clock.perf_counter() - self.blocked_since >= self.aligned_timeout):
            self._trigger_unaligned(st.checkpoint_id, set())

    def alignment_deadline(self) -> float | None:
        """perf_counter() time the alignment in progress turns unaligned (None: no such)."""
        if self.aligned_timeout is None or self.blocked_since is None:
            return None
        return self.blocked_since + self.aligned_timeout

    def on_input_readable(self, ch: InputChannel) -> None:
        """``ch``'s bytes were moved into its reader: read ahead if a log waits on it."""
        if self.backlog.logging and not ch.ahead_stopped and self.backlog.waiting_on(ch.id):
            self._read_ahead(ch)

    def on_control(self, msg: messages.Message) -> None:
        if isinstance(msg, messages.Trigger):
            # Sources are triggered by the coordinator; other tasks once their regular inputs
            # ended, and every task for an unaligned checkpoint (Chandy and Lamport: a process
            # may record its state at any moment, then logs what arrives before each marker).
            if msg.checkpoint_id <= self.last_snapshot:
                return
            self._seen(msg.checkpoint_id)
            if self.source is not None or self.finished or self.inputs_ended:
                self.flush()
                self._snapshot(msg.checkpoint_id, unaligned=msg.unaligned)
            elif msg.unaligned:
                self._trigger_unaligned(msg.checkpoint_id, set())
        elif isinstance(msg, messages.Snapshot):
            if msg.checkpoint_id > self.last_snapshot:
                self._snapshot(msg.checkpoint_id, forward=False)
        elif isinstance(msg, messages.Pause):
            self.paused = True
        elif isinstance(msg, messages.Resume):
            self.paused = False
        elif isinstance(msg, messages.CountRequest):
            self.control.send(messages.Counts(
                self.spec.id, msg.wave,
                {ch.id: ch.records for out in self.outputs for ch in out.channels},
                {ch.id: ch.records for ch in self.inputs.values()},
            ))
        elif isinstance(msg, messages.NotifyComplete):
            self.increments.completed(msg.checkpoint_id)
            self.chain.notify_complete(msg.checkpoint_id)
            if msg.final or msg.stop:
                self.writer.flush()
                self.control.send(messages.Committed(self.spec.id))
                self.stop = True
            if msg.stop:  # stop with a savepoint: the driver holds every connection open until Shutdown
                self.await_shutdown = True
        elif isinstance(msg, messages.EndLoop):
            if not self.loop_ended:
                self.loop_ended = True
                for c in self.back:
                    if not c.ended:
                        for s in self.backlog.on_end_of_stream(c.id).completed:
                            self._write(s)
                self._maybe_finish()
        elif isinstance(msg, messages.Shutdown):
            self.stop = True

    def fire_timers(self) -> None:
        """Processing-time timers that are due (wall clock), in each operator's order.
        Called with nothing gathered (records before a timer are processed first)."""
        if self.timed_ops:
            self._fire_timers()

    # ---- what the driver is told -----------------------------------------------------------

    def _park(self, ch: InputChannel) -> None:
        """``ch`` is blocked by an alignment: the driver stops reading it."""

    def _unpark(self, ch: InputChannel) -> None:
        """``ch`` is free again (or ended): the driver may read it (if it has not ended)."""

    # ---- the chain ------------------------------------------------------------------

    def _process(self, batch: list[Any], start: int = 0) -> list[Any]:
        batch = self.chain.process(batch, start)
        if self.skippers:
            self._report_skipped()
        return batch

    def _report_skipped(self) -> None:
        """Every record the source, the operators and the out-edges skipped (or a window
        dropped as late) since the last call, one Skipped message each. Called after each
        call that may skip (``_emit`` for an out-edge's)."""
        for name, g in self.skippers:
            for record, err in g.take_skipped():
                self.control.send(messages.Skipped(self.spec.id, name, record_repr(record),
                                                   f"{type(err).__name__}: {err}"[:500]))

    def _emit(self, batch: list[Any]) -> None:
        if batch:
            self.records_out += len(batch)
            for out in self.main_outputs:
                out.emit(batch)
        if self.side_op is not None:
            side = self.side_op.take_side_output()
            if side:
                self.records_out += len(side)
                for out in self.side_outputs:
                    out.emit(side)
        if self.timed_ops:
            self._schedule_timers()
        if self.edges_skip:
            self._report_skipped()

    # ---- event time -------------------------------------------------------------------

    def _on_watermark_step(self, step: Step) -> None:
        if step.change is Change.IDLE:
            if step.watermark > self.watermark:
                self._advance_watermark(step.watermark)  # the valve's flush, before going idle
            self._broadcast_status(None)
        elif step.change is not Change.UNCHANGED:
            self._advance_watermark(step.watermark)

    def _advance_watermark(self, watermark: float) -> None:
        """The task's watermark is ``watermark``: operators first (what they emit is sent
        ahead of the watermark), then downstream."""
        if watermark > self.watermark:
            self.watermark = watermark
            for i, op in self.watermark_ops:
                out = self.chain.call(self.op_names[i], op.on_watermark, watermark)
                if out:
                    self._emit(self._process(out, i + 1))
            if self.skippers:
                self._report_skipped()  # (a window that failed as it fired, skipped, emits nothing)
        self._broadcast_status(watermark)

    def _broadcast_status(self, watermark: float | None) -> None:
        if not self.finished and self.outputs:
            frame = codec.watermark_frame(watermark)
            for out in self.outputs:
                out.broadcast(frame)

    def _source_status(self, read_something: bool) -> None:
        es = self.event_source
        assert es is not None
        status = es.status(read_something)
        if status != es.sent:
            es.sent = status
            if status is None:
                self._broadcast_status(None)
            else:
                self._advance_watermark(status)

    def _schedule_timers(self) -> None:
        due = [t for _, op in self.timed_ops if (t := op.next_processing_timer()) is not None]
        self.next_timer = min(due) if due else MAX_WATERMARK

    def _fire_timers(self) -> None:
        now = self.clock.time()
        if now < self.next_timer:
            return
        self.next_timer = MAX_WATERMARK  # rescheduled below (and by _emit)
        for i, op in self.timed_ops:
            out = self.chain.call(self.op_names[i], op.on_processing_time, now)
            if out:
                self._emit(self._process(out, i + 1))
        if self.skippers:
            self._report_skipped()
        self._schedule_timers()

    # ---- end of stream ----------------------------------------------------------------

    def _finish(self) -> None:
        """End of input: flush final results through the chain, then end of stream."""
        self._emit(self.chain.finish())
        if self.skippers:
            self._report_skipped()  # after _emit: the out-edges' skips too, before the end
        self._end_outputs()

    def _end_outputs(self) -> None:
        end = codec.frame(codec.FrameKind.END)
        for out in self.outputs:
            out.broadcast(end)
        self.finished = True
        self.control.send(messages.Finished(self.spec.id, self.records_in, self.records_out))

    def _maybe_finish(self) -> None:
        if self.finished or not self.aligner.all_ended:
            return
        if self.back and not self.loop_ended and any(not c.ended for c in self.back):
            if not self.inputs_ended:
                self.inputs_ended = True
                self.control.send(messages.InputsEnded(self.spec.id))
            return
        self._finish()

    def _back_edge_memory(self) -> int:
        """Bytes of back-edge input held in memory: readers and read-ahead (for LoopOverflow)."""
        return sum(c.reader.buffered() + c.ahead_bytes for c in self.back)

    # ---- frames -------------------------------------------------------------------------

    def _on_frame(self, ch: InputChannel, kind: int, payload: bytes, ahead: bool = False) -> None:
        """One frame of ``ch`` in order; ``ahead``: it was read ahead (and logged) already."""
        if kind == codec.FrameKind.RECORDS:
            if ch.back_edge and self.loop_ended:
                raise LoopNotQuiet(
                    f"records arrived on back-edge {ch.id} after the loop was proven drained: an operator "
                    "in the loop emitted records at end of input (finish()); loops must be quiet then"
                )
            if not ahead:
                # Logged now: if a snapshot was taken, these are processed after it.
                self.backlog.on_records(ch.id, payload)
                if self.backlog.due:
                    self._spill()
            batch = codec.unpack(payload)
            ch.records += len(batch)
            # At most GATHER_MAX records a batch, however many the frame holds: a loop whose
            # operators emit more than they take in would otherwise double its batches and
            # frames on every trip (measured: one batch of 800k records, 400 MB, in 8 s).
            # A frame that fits is gathered whole, as before.
            i, n = 0, len(batch)
            while len(self.gathered) + n - i > GATHER_MAX:
                j = i + GATHER_MAX - len(self.gathered)
                self.gathered.extend(batch[i:j])
                i = j
                self.flush()  # empties gathered
            self.gathered.extend(batch[i:] if i else batch)
            if len(self.gathered) >= self.gather_max:
                self.flush()
            return
        self.flush()
        if kind == codec.FrameKind.BARRIER:
            cid, unaligned = codec.parse_barrier(payload)
            if ch.back_edge and self.loop_ended:
                return
            if not ahead:
                self._seen(cid)
            if unaligned and cid > self.last_snapshot:  # the first barrier of an unaligned checkpoint
                self._trigger_unaligned(cid, {ch.id})
                return
            if ch.back_edge or cid <= self.last_snapshot:
                # A back-edge's barrier (held if it came first), or the barrier of a checkpoint
                # this task has taken already (unaligned, or directly): it closes a log.
                for s in self.backlog.on_barrier(ch.id, cid).completed:
                    self._write(s)
                return
            d = self.aligner.on_barrier(ch.id, cid)
            if d.outcome is Outcome.ABORTED_AND_BLOCKED:
                # The older checkpoint was abandoned upstream: what it blocked is free again.
                self._release_blocked()
                self.blocked_since = None
            if d.outcome in (Outcome.BLOCKED, Outcome.ABORTED_AND_BLOCKED):
                if self.blocked_since is None:
                    self.blocked_since = self.clock.perf_counter()
                self._park(ch)
                self._blocked.append(ch)
            elif d.outcome is Outcome.TRIGGERED:
                assert d.checkpoint_id is not None
                self._snapshot(d.checkpoint_id)
                self._release_blocked()
        elif kind == codec.FrameKind.WATERMARK:
            if not ch.back_edge:
                w = codec.parse_watermark(payload)
                self._on_watermark_step(self.valve.on_idle(ch.id) if w is None else self.valve.on_watermark(ch.id, w))
        elif kind == codec.FrameKind.END:
            ch.ended = True
            self._park(ch)
            for s in self.backlog.on_end_of_stream(ch.id).completed:
                self._write(s)
            if not ch.back_edge:
                self._on_watermark_step(self.valve.on_end(ch.id))
                d = self.aligner.on_end_of_stream(ch.id)
                if d.outcome is Outcome.TRIGGERED:
                    assert d.checkpoint_id is not None
                    self._snapshot(d.checkpoint_id)
                    self._release_blocked()
            self._maybe_finish()

    def _release_blocked(self) -> None:
        for b in self._blocked:
            if not b.ended:
                self._unpark(b)
            self.runnable.append(b)
        self._blocked.clear()

    # ---- checkpoints ------------------------------------------------------------------

    def _snapshot(self, checkpoint_id: int, forward: bool = True, unaligned: bool = False,
                  arrived: set[str] | None = None) -> None:
        """forward=False: stop-the-world, nothing is in flight and no barrier travels.
        unaligned: log every input's state, not only the back-edges'; ``arrived``: the
        inputs that delivered this barrier already."""
        self.last_snapshot = checkpoint_id
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
        if forward and not self.finished:
            barrier = codec.frame(codec.FrameKind.BARRIER, codec.barrier_payload(checkpoint_id, unaligned))
            for out in self.outputs:
                out.broadcast(barrier)
        alignment_ms = 0.0
        if self.blocked_since is not None:
            alignment_ms = (clock.perf_counter() - self.blocked_since) * 1000
            self.blocked_since = None
        payload = (encoding, alignment_ms, self.finished, sync_ms, base, deltas, self.increments.known, seen)
        if not forward:
            # Stop-the-world: nothing is in flight (proven by counting), so no back-edge
            # has anything to log, and no barrier will come round to close a session.
            self._write(Session(checkpoint_id, payload, set(), {}))
            return
        step = self.backlog.start(checkpoint_id, payload, unaligned, arrived or ())
        for cid in step.released:
            self.runnable.append(self.inputs[cid])
        for s in step.completed:
            self._write(s)
        session = self.backlog.sessions.get(checkpoint_id)
        if session is not None:
            # Frames read ahead for older logs are not processed yet: in flight for this one too.
            for cid in list(session.waiting):
                ch = self.inputs[cid]
                for kind, data in ch.ahead:
                    if kind == codec.FrameKind.RECORDS:
                        self.backlog.log_into(checkpoint_id, cid, data)
                if self.backlog.due:
                    self._spill()
                if ch.ahead and ch.ahead[-1][0] == codec.FrameKind.END:  # its end was read ahead
                    for s in self.backlog.end_ahead(cid).completed:
                        self._write(s)
            for cid in list(session.waiting):
                self._read_ahead(self.inputs[cid])

    def _read_ahead(self, ch: InputChannel) -> None:
        """Move ``ch``'s frames from its reader to its read-ahead queue, logging them, while a
        log waits on it: up to the barrier of the newest waiting log (barriers of older
        ones are handled on the way), a newer barrier, or end of stream."""
        try:
            self._read_ahead_frames(ch)
        finally:
            if ch.has_frames():
                self.runnable.append(ch)  # bytes read here raise no select event any more

    def _read_ahead_frames(self, ch: InputChannel) -> None:
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
                    self._spill()
            elif kind == codec.FrameKind.BARRIER:
                cid, _ = codec.parse_barrier(data)
                self._seen(cid)
                if cid > upto or (ch.back_edge and self.loop_ended):
                    ch.ahead_stopped = True  # handled in order when processed
                    return
                for s in log.on_barrier(ch.id, cid).completed:
                    self._write(s)
            elif kind == codec.FrameKind.WATERMARK:
                continue  # handled in order when processed; not channel state (docs/event-time.md)
            else:  # END (or anything else): nothing can be read past it
                ch.ahead_stopped = True
                if kind == codec.FrameKind.END:
                    for s in log.end_ahead(ch.id).completed:
                        self._write(s)
                return

    def _trigger_unaligned(self, checkpoint_id: int, arrived: set[str]) -> None:
        """Snapshot now for ``checkpoint_id`` (its first barrier came, the coordinator asked,
        or its alignment timed out): an alignment in progress is abandoned, what it
        blocked is released, and the inputs it had collected count as arrived."""
        self.flush()
        st = self.aligner.state
        if isinstance(st, CollectingBarriers) and st.checkpoint_id == checkpoint_id:
            arrived = arrived | set(st.arrived)
        self.aligner.abandon(checkpoint_id)
        self._snapshot(checkpoint_id, unaligned=True, arrived=arrived)
        self._release_blocked()

    def _seen(self, checkpoint_id: int) -> None:
        if checkpoint_id > self.last_snapshot and checkpoint_id not in self.first_seen:
            self.first_seen[checkpoint_id] = self.clock.time()

    def _state_file(self) -> str:
        tag = self.options.file_tag
        return f"{self.spec.id}.{tag}.state" if tag else f"{self.spec.id}.state"

    def _spill(self) -> None:
        """Sessions past ``channel_state_memory``: what they logged goes to spill files
        (written by the writer, in order, before their state files)."""
        limit = self.backlog.memory_limit or 0
        for s in self.backlog.due_to_spill():
            size = s.memory
            logs = self.backlog.take(s)
            self.writer.spill(SpillJob(s.checkpoint_id, spill.file_name(self._state_file(), s.spills - 1),
                                       lambda logs=logs: spill.encode(logs), s.spilled, size))  # type: ignore[misc]
            del logs
        # Channel state held is then at most the limit in the logs plus the limit queued.
        self.writer.wait_spills(limit)

    def _write(self, s: Session) -> None:
        encoding, alignment_ms, finished, sync_ms, base, deltas, known, seen = s.payload
        # By channel id: the same state file whatever order the log's sets iterate in.
        logs = {ch: codec.join_arrays(frames) if frames else codec.pack([]) for ch, frames in sorted(s.logs.items())}
        task, cid, spilled = self.spec.id, s.checkpoint_id, s.spilled

        def blob() -> bytes:  # on the writer thread, after the session's spills: waits for a forked encoder
            return snapshot_encoding.snapshot_file(task, cid, encoding.result(), logs, finished, base, deltas,
                                                   spilled)

        self.writer.submit(Job(s.checkpoint_id, self._state_file(), blob, alignment_ms, s.logged, finished, sync_ms,
                               self.clock.perf_counter(), base, known, s.unaligned, s.logged_bytes,
                               s.regular_logged, seen))
