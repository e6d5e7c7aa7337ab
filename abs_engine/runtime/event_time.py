"""A task's event time and timers: the watermarks of its regular inputs, the operators that
act on one, and processing-time timers.

Invariants: the task's watermark never decreases; operators see a watermark before it is
sent downstream (what they emit for it travels ahead of it); a watermark is not channel
state (it is regenerated after a restore, never logged); processing-time timers fire by
the task's clock, in each operator's order, with nothing gathered ahead of them.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from operators.base import Operator

from .. import codec
from .chain import Chain
from .clock import Clock
from .watermarks import MAX_WATERMARK, MIN_WATERMARK, Change, Step, WatermarkValve


class EventTime:
    """``emit(batch, i)``: ``batch`` through operators ``i``.. of the chain and out;
    ``broadcast(frame)``: a frame to every output (while the task has not finished);
    ``after_user_code()``: report what user code skipped."""

    def __init__(self, chain: Chain, regular: Iterable[str], clock: Clock, emit: Callable[[list[Any], int], None],
                 broadcast: Callable[[bytes], None], after_user_code: Callable[[], None]):
        self.chain, self.clock = chain, clock
        self.emit, self.broadcast, self.after_user_code = emit, broadcast, after_user_code
        self.valve = WatermarkValve(regular)
        self.source = chain.source if chain.source is not None and chain.source.emits_watermarks else None
        self.sent: float | None = MIN_WATERMARK  #: the source's last status sent: a watermark, or None (idle)
        self.watermark = MIN_WATERMARK  #: the last watermark the operators were given
        self.watermark_ops = [(i, op) for i, op in enumerate(chain.ops)
                              if type(op).on_watermark is not Operator.on_watermark]
        #: Operators with processing-time timers, and when the earliest is due (inf: none).
        self.timed_ops: list[tuple[int, Any]] = [(i, op) for i, op in enumerate(chain.ops) if op.processing_timers]
        self.next_timer = MAX_WATERMARK

    # ---- watermarks ------------------------------------------------------------------------

    def on_input(self, channel: str, payload: bytes) -> None:
        """A watermark (or idleness) frame of regular input ``channel``."""
        w = codec.parse_watermark(payload)
        self.on_step(self.valve.on_idle(channel) if w is None else self.valve.on_watermark(channel, w))

    def on_input_end(self, channel: str) -> None:
        self.on_step(self.valve.on_end(channel))

    def on_step(self, step: Step) -> None:
        if step.change is Change.IDLE:
            if step.watermark > self.watermark:
                self.advance(step.watermark)  # the valve's flush, before going idle
            self.broadcast(codec.watermark_frame(None))
        elif step.change is not Change.UNCHANGED:
            self.advance(step.watermark)

    def advance(self, watermark: float) -> None:
        """The task's watermark is ``watermark``: operators first, then downstream."""
        if watermark > self.watermark:
            self.watermark = watermark
            for i, op in self.watermark_ops:
                out = self.chain.call(self.chain.names[i], op.on_watermark, watermark)
                if out:
                    self.emit(out, i + 1)
            self.after_user_code()  # (a window that failed as it fired, skipped, emits nothing)
        self.broadcast(codec.watermark_frame(watermark))

    def source_status(self, read_something: bool) -> None:
        """After a source read: its watermark, or that it is idle, if that changed."""
        es = self.source
        assert es is not None
        status = es.watermark_status(read_something)
        if status != self.sent:
            self.sent = status
            if status is None:
                self.broadcast(codec.watermark_frame(None))
            else:
                self.advance(status)

    def end_of_input(self) -> None:
        """A source read all its input: every window fires."""
        if self.source is not None:
            self.advance(MAX_WATERMARK)

    # ---- processing-time timers -------------------------------------------------------------

    def schedule_timers(self) -> None:
        if self.timed_ops:
            due = [t for _, op in self.timed_ops if (t := op.next_processing_timer()) is not None]
            self.next_timer = min(due) if due else MAX_WATERMARK

    def fire_timers(self) -> None:
        """Timers that are due by the task's clock, in each operator's order."""
        if not self.timed_ops:
            return
        now = self.clock.time()
        if now < self.next_timer:
            return
        self.next_timer = MAX_WATERMARK  # rescheduled below (and after each emit)
        for i, op in self.timed_ops:
            out = self.chain.call(self.chain.names[i], op.on_processing_time, now)
            if out:
                self.emit(out, i + 1)
        self.after_user_code()
        self.schedule_timers()

    def timer_due(self) -> float | None:
        """When the earliest processing-time timer is due (None: there is none)."""
        return self.next_timer if self.timed_ops and self.next_timer != MAX_WATERMARK else None
