"""What leaves a task: batches through its operator chain and out on its edges, the records
its code skipped reported, and end of stream.

Invariants:
- Every record a batch's processing or emission skipped (``on_error="skip"``, a window's
  late records) is reported, one ``Skipped`` message each, before the next batch is taken:
  after the chain ran and again after the out-edges' key functions ran.
- Only the chain's tail has side outputs (a window's late records); they go out right
  after the main output of the same batch.
- Once ``end`` ran (end of stream sent on every edge, ``Finished`` reported) nothing more
  leaves the task: ``broadcast`` is a no-op, so no barrier or watermark follows an END.
"""

from __future__ import annotations

from typing import Any, Callable

from .. import codec, messages
from .chain import Chain, record_repr
from .control import ControlLink
from .output import Output
from .task_health import late_by_operator, progress_of

__all__ = ["Emitter"]


class Emitter:
    """A task's output side. ``after_emit`` (None: nothing) is called after every
    emission: the task's processing-time timers may have changed."""

    def __init__(self, task: str, chain: Chain, outputs: list[Output], control: ControlLink,
                 after_emit: Callable[[], None] | None = None):
        self.task, self.chain, self.outputs, self.control = task, chain, outputs, control
        self.after_emit = after_emit
        self.records_out = 0
        self.finished = False
        #: What may skip records and must have them reported: the source, operators and
        #: out-edges (key functions) whose on_error is "skip", and operators that report
        #: records they drop (a window's late records).
        self.skippers: list[tuple[str, Any]] = [
            (n, g) for n, g in [*chain.all_operators(), *((o.label, o) for o in outputs)]
            if g.reports_skipped]
        #: An out-edge's key function may skip records: reported as soon as ``emit`` is done.
        self.edges_skip = any(o.reports_skipped for o in outputs)
        self.main_outputs = [o for o in outputs if not o.side]
        self.side_outputs = [o for o in outputs if o.side]
        self.side_op = chain.ops[-1] if self.side_outputs and chain.ops else None

    def process(self, batch: list[Any], start: int = 0) -> list[Any]:
        """``batch`` through operators ``start``.. of the chain."""
        batch = self.chain.process(batch, start)
        if self.skippers:
            self.report_skipped()
        return batch

    def report_skipped(self) -> None:
        """Every record skipped since the last call, one Skipped message each."""
        for name, g in self.skippers:
            for record, err in g.take_skipped():
                self.control.send(messages.Skipped(self.task, name, record_repr(record),
                                                   f"{type(err).__name__}: {err}"[:500]))

    def emit(self, batch: list[Any]) -> None:
        """The chain's output ``batch`` (and its tail's side output) to the out-edges."""
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
        if self.after_emit is not None:
            self.after_emit()
        if self.edges_skip:
            self.report_skipped()

    def broadcast(self, frame: bytes) -> None:
        """A frame to every output, unless the task has ended them."""
        if not self.finished:
            for out in self.outputs:
                out.broadcast(frame)

    def after_user_code(self) -> None:
        if self.skippers:
            self.report_skipped()

    def finish(self, records_in: int) -> None:
        """End of input: final results through the chain, then end of stream."""
        self.emit(self.chain.finish())
        if self.skippers:
            self.report_skipped()  # after emit: the out-edges' skips too, before the end
        self.end(records_in)

    def end(self, records_in: int) -> None:
        """End of stream on every out-edge; the task has finished."""
        end = codec.frame(codec.FrameKind.END)
        for out in self.outputs:
            out.broadcast(end)
        self.finished = True
        self.control.send(messages.Finished(self.task, records_in, self.records_out, *progress_of(self.chain),
                                            late_by_operator(self.chain)))
