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
- Every barrier decision is the barrier handler's (runtime/barriers.py); what a snapshot
  holds and in which order it is written, the snapshots' (runtime/snapshots.py); event
  time and timers, runtime/event_time.py's; how records are batched, runtime/batching.py's;
  what leaves the task, runtime/emitter.py's. The task carries out what they decide.
- Back-edge input past ``loop_memory`` spills to disk and is read back in order
  (runtime/overflow.py); past ``loop_disk`` spilled the task fails with LoopOverflow,
  naming the loop.
- The task never reads a socket, a thread or the system clock itself: a driver hands it
  frames (``take``), control messages (``on_control``) and source reads (``read_source``),
  and it reads time from its ``clock``. The worker's driver is runtime/task_loop.py; the
  deterministic simulation drives the same class over runtime/memory.py.
- A task whose regular inputs have all ended is triggered directly by the coordinator;
  one that has finished (end of stream everywhere) emits nothing more.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from .. import codec, messages
from ..plan import TaskSpec
from .batching import GATHER_MAX, Batcher
from .barriers import Action, BarrierHandler, Block, Release, Snapshot, Write
from .chain import Chain, record_repr
from .channel import InputChannel
from .clock import SYSTEM, Clock
from .control import ControlLink
from .emitter import Emitter
from .output import Output
from .overflow import LoopBudget
from .event_time import EventTime
from .latency import LatencyMarkers
from .snapshots import Snapshots
from .task_options import TaskOptions
from .writer import Writer

__all__ = ["GATHER_MAX", "LoopNotQuiet", "Task", "TaskOptions", "record_repr"]


class LoopNotQuiet(Exception):
    """Records arrived on a back-edge after the loop was proven drained."""


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
        self.back = [c for c in inputs.values() if c.back_edge]
        #: Every barrier decision: alignment, channel-state logs, aligned/unaligned (runtime/barriers.py).
        self.barriers = BarrierHandler((c.id for c in inputs.values() if not c.back_edge), (c.id for c in self.back),
                                       options.channel_state_memory, options.aligned_timeout)
        self.backlog = self.barriers.log  #: the channel-state sessions (read-ahead drives them too)
        self.loop_budget: LoopBudget | None = None
        if self.back and options.loop_memory is not None:
            self.loop_budget = LoopBudget(spec.id, chain.names[0] if chain.names else spec.chain,
                                          (c.id for c in self.back), options.loop_memory, options.loop_disk,
                                          options.loop_spill_dir, self._back_edge_memory)
            for c in self.back:
                c.spill = self.loop_budget.channel(c.id)
        #: Unaligned checkpoints can happen: look at the control connection between frames.
        self.responsive = options.unaligned or options.aligned_timeout is not None
        #: Inputs blocked by an alignment in progress (parked with the driver).
        self._blocked: list[InputChannel] = []
        #: Records gathered from frames before they are processed (runtime/batching.py).
        self.batcher = Batcher(self.responsive, clock)
        self.inputs_ended = False  #: every regular input ended (reported once)
        self.paused = False  #: stop-the-world: a source reads nothing until Resume
        self.stop = False
        #: Stopped with a savepoint: the driver holds every connection open until Shutdown.
        self.await_shutdown = False
        self.records_in = 0
        #: Inputs with frames to process, in the order they get a turn.
        self.runnable: deque[InputChannel] = deque()
        #: The output side: chain, out-edges, skipped records, end of stream (runtime/emitter.py).
        self.emitter = Emitter(spec.id, chain, outputs, control)
        self._process, self._emit, self._broadcast = self.emitter.process, self.emitter.emit, self.emitter.broadcast
        self.skippers = self.emitter.skippers
        #: Snapshots, channel-state logs, read-ahead, what reaches the writer (runtime/snapshots.py).
        self.snapshots = Snapshots(spec.id, chain, self.barriers, writer, options, clock, inputs, self._broadcast,
                                   self.runnable)
        #: Watermarks and timers (runtime/event_time.py).
        self.time = EventTime(chain, (c.id for c in inputs.values() if not c.back_edge), clock,
                              lambda batch, i: self._emit(self._process(batch, i)), self._broadcast,
                              self.emitter.after_user_code)
        #: Latency markers: sent (a source task), passed on, or reported (runtime/latency.py).
        self.latency = LatencyMarkers(spec.id, self.emitter, control, clock, options.latency_interval)
        self.marking = self.source is not None and options.latency_interval > 0
        #: Some operator has processing-time timers: the hot path asks about them only then.
        self.timed = bool(self.time.timed_ops)
        if self.timed:
            self.emitter.after_emit = self.time.schedule_timers

    @property
    def finished(self) -> bool:
        """End of stream was sent on every out-edge: nothing more leaves the task."""
        return self.emitter.finished

    @property
    def records_out(self) -> int:
        return self.emitter.records_out

    @property
    def last_snapshot(self) -> int:
        """The newest checkpoint this task has snapshotted (a trigger for an id <= it is a duplicate)."""
        return self.barriers.last_snapshot

    @property
    def loop_ended(self) -> bool:
        return self.barriers.loop_ended

    # ---- what a driver calls ------------------------------------------------------------

    def start(self) -> None:
        """Before any input: end of stream if restored finished, restored timers, and the
        channel state of the restored checkpoint (records in flight at its cut: round a
        loop, or on any input if it was unaligned), each batch into the operator it was
        logged for."""
        if self.restored_finished:
            self._end_outputs()
        self.time.schedule_timers()  # restored processing-time timers are due without a record
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
            self.time.end_of_input()
            self._finish()
            return
        if batch:
            self.records_in += len(batch)
            self._emit(self._process(batch, 0) if self.ops else batch)
        if self.skippers:
            self.emitter.report_skipped()  # the source's skips (a batch it emptied), the out-edges'
        if self.time.source is not None:
            self.time.source_status(bool(batch))
        if self.timed:
            self.time.fire_timers()
        if self.marking:
            self.latency.tick()

    def may_take(self, ch: InputChannel) -> bool:
        """``ch``'s next frame may be processed now: it is not blocked by an alignment, nor
        a back-edge held by its log."""
        return not ch.ended and self.barriers.may_take(ch.id, ch.back_edge)

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
        if self.batcher.gathered:
            self.records_in += len(self.batcher.gathered)
            self.batcher.run(self._process_all)
        if self.timed:
            self.time.fire_timers()  # a busy task's processing-time timers, if due

    def _process_all(self, batch: list[Any]) -> None:
        self._emit(self._process(batch, 0))

    def service(self) -> None:
        """Between frames of a busy task: control messages, read-ahead, aligned timeout."""
        if self.responsive:
            for msg in self.control.poll():
                self.on_control(msg)
        if self.backlog.logging:
            for ch in self.inputs.values():
                if not ch.ended and not ch.ahead_stopped and self.backlog.waiting_on(ch.id):
                    self.snapshots.read_ahead(ch)
        self.check_aligned_timeout()

    def check_aligned_timeout(self) -> None:
        actions = self.barriers.on_timeout(self.clock.perf_counter())
        if actions:
            self.flush()
            self._carry_out(actions)

    def alignment_deadline(self) -> float | None:
        """perf_counter() time the alignment in progress turns unaligned (None: no such)."""
        return self.barriers.alignment_deadline()

    def on_input_readable(self, ch: InputChannel) -> None:
        """``ch``'s bytes were moved into its reader: read ahead if a log waits on it."""
        if self.backlog.logging and not ch.ahead_stopped and self.backlog.waiting_on(ch.id):
            self.snapshots.read_ahead(ch)

    def on_control(self, msg: messages.Message) -> None:
        if isinstance(msg, messages.Trigger):
            # Sources are triggered by the coordinator; other tasks once their regular inputs
            # ended, and every task for an unaligned checkpoint (Chandy and Lamport: a process
            # may record its state at any moment, then logs what arrives before each marker).
            if msg.checkpoint_id <= self.last_snapshot:
                return
            self.snapshots.seen(msg.checkpoint_id)
            direct = self.source is not None or self.finished or self.inputs_ended
            actions = self.barriers.on_trigger(msg.checkpoint_id, msg.unaligned, direct)
            if actions:
                self.flush()
                self._carry_out(actions)
        elif isinstance(msg, messages.Snapshot):
            self._carry_out(self.barriers.stop_the_world(msg.checkpoint_id))
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
            self.snapshots.increments.completed(msg.checkpoint_id)
            self.chain.notify_complete(msg.checkpoint_id)
            if msg.final or msg.stop:
                self.writer.flush()
                self.control.send(messages.Committed(self.spec.id))
                self.stop = True
            if msg.stop:  # stop with a savepoint: the driver holds every connection open until Shutdown
                self.await_shutdown = True
        elif isinstance(msg, messages.EndLoop):
            if not self.loop_ended:
                self._carry_out(self.barriers.end_loop(c.id for c in self.back if not c.ended))
                self._maybe_finish()
        elif isinstance(msg, messages.Shutdown):
            self.stop = True

    def fire_timers(self) -> None:
        """Processing-time timers that are due, in each operator's order. Called with
        nothing gathered (records before a timer are processed first)."""
        self.time.fire_timers()

    def timer_due(self) -> float | None:
        """When the task's earliest processing-time timer is due by its clock (None: none)."""
        return self.time.timer_due()

    # ---- what the driver is told -----------------------------------------------------------

    def _park(self, ch: InputChannel) -> None:
        """``ch`` is blocked by an alignment: the driver stops reading it."""

    def _unpark(self, ch: InputChannel) -> None:
        """``ch`` is free again (or ended): the driver may read it (if it has not ended)."""

    # ---- end of stream ----------------------------------------------------------------

    def _finish(self) -> None:
        """End of input: final results through the chain, then end of stream."""
        self.emitter.finish(self.records_in)

    def _end_outputs(self) -> None:
        self.emitter.end(self.records_in)

    def _maybe_finish(self) -> None:
        if self.finished or not self.barriers.regular_ended:
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
                    self.snapshots.spill()
            batch = codec.unpack(payload)
            ch.records += len(batch)
            self.batcher.add(batch, self.flush)
            return
        self.flush()
        if kind == codec.FrameKind.BARRIER:
            cid, unaligned = codec.parse_barrier(payload)
            if not ahead and not (ch.back_edge and self.loop_ended):
                self.snapshots.seen(cid)
            self._carry_out(self.barriers.on_barrier(ch.id, ch.back_edge, cid, unaligned, self.clock.perf_counter()))
        elif kind == codec.FrameKind.WATERMARK:
            if not ch.back_edge:
                self.time.on_input(ch.id, payload)
        elif kind == codec.FrameKind.LATENCY:
            if not ch.back_edge:
                self.latency.on_marker(codec.parse_latency(payload))
        elif kind == codec.FrameKind.END:
            ch.ended = True
            self._park(ch)
            if not ch.back_edge:
                self.time.on_input_end(ch.id)
            self._carry_out(self.barriers.on_end_of_stream(ch.id, ch.back_edge))
            self._maybe_finish()

    def _carry_out(self, actions: list[Action]) -> None:
        """What the barrier handler decided, in its order."""
        for a in actions:
            if isinstance(a, Snapshot):
                self._snapshot(a.checkpoint_id, forward=a.barrier, unaligned=a.unaligned, arrived=set(a.arrived))
            elif isinstance(a, Block):
                ch = self.inputs[a.channel]
                self._park(ch)
                self._blocked.append(ch)
            elif isinstance(a, Release):
                self._release_blocked()
            elif isinstance(a, Write):
                for s in a.sessions:
                    self.snapshots.write(s)

    def _release_blocked(self) -> None:
        for b in self._blocked:
            if not b.ended:
                self._unpark(b)
            self.runnable.append(b)
        self._blocked.clear()

    # ---- checkpoints ------------------------------------------------------------------

    def _snapshot(self, checkpoint_id: int, forward: bool = True, unaligned: bool = False,
                  arrived: set[str] | None = None) -> None:
        self.snapshots.take(checkpoint_id, self.finished, forward, unaligned, arrived)
