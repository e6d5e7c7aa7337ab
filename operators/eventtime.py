"""Event time at a source: a timestamp function and a watermark strategy.

``Dataflow.source(src, timestamps=fn, watermarks=BoundedOutOfOrderness(delay, idle_timeout))``
wraps ``src`` in an ``EventTimeSource``: after every batch it reads, the source subtask's
watermark is ``max timestamp seen - delay - 1`` (Flink's rule: watermark ``w`` promises no
more records with a timestamp ``<= w``; ``delay=0`` suits sources whose timestamps only
grow). A subtask that reads nothing for ``idle_timeout`` seconds (wall clock) declares itself
idle, so that the job's watermark does not wait for it; it is active again with its next
record. At the end of its input a subtask's watermark is +inf: every window fires.

A timestamp is a number (milliseconds by convention; every event-time operator of a job
must use the same unit) computed from the record by a function: the event time is a field
of the record, as in Spark Structured Streaming's ``withWatermark(column, ...)``, and each
event-time operator (window, join, timer) takes the function that reads it from *its* input
records.

State: the source's offsets and the highest timestamp it has seen, snapshotted together, so
a restored subtask resumes with the watermark it had (a checkpoint's watermark state).

A timestamps function that raises on a record, or returns something that is not a number,
goes through ``record_failed`` (operators/base.py, ``Guarded``) with the source's
``on_error`` (``Dataflow.source(..., on_error=...)``): "fail" names the source, the function
and the record (and a repeat after a restart fails the job at once); "skip" leaves the
record out of the batch (it is reported, and never counts towards the watermark).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Generic

from .base import OperatorContext, Owns, Source, T, WrappingSource, check_on_error, function_label

MIN_WATERMARK = float("-inf")
MAX_WATERMARK = float("inf")

TimestampFn = Callable[[Any], float]

#: What users import (EventTimeSource is the engine's: ``Dataflow.source`` makes it).
__all__ = ["BoundedOutOfOrderness", "ascending"]


@dataclass(frozen=True)
class BoundedOutOfOrderness:
    """Records may come up to ``max_delay`` (timestamp units) later than the newest seen;
    ``idle_timeout`` seconds (wall clock) without a record make the subtask idle (None:
    never)."""

    max_delay: float = 0
    idle_timeout: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_delay, (int, float)) or isinstance(self.max_delay, bool) or self.max_delay < 0:
            raise ValueError(f"max_delay must be a number >= 0, got {self.max_delay!r}")
        if self.idle_timeout is not None and (not isinstance(self.idle_timeout, (int, float))
                                              or self.idle_timeout <= 0):
            raise ValueError(f"idle_timeout must be a number of seconds > 0 or None, got {self.idle_timeout!r}")


def ascending(idle_timeout: float | None = None) -> BoundedOutOfOrderness:
    """Timestamps that never decrease within a subtask (Flink's monotonous timestamps):
    ``BoundedOutOfOrderness(0, idle_timeout)``, ``idle_timeout`` as there."""
    return BoundedOutOfOrderness(0, idle_timeout)


class EventTimeSource(WrappingSource[T], Generic[T]):
    """``inner`` with a watermark: see the module docstring. The task asks
    ``watermark_status`` after every read (and while the source has nothing) what to send
    downstream."""

    emits_watermarks = True

    def __init__(self, inner: Source[T], timestamps: TimestampFn, strategy: BoundedOutOfOrderness,
                 on_error: str = "fail"):
        super().__init__(inner)
        self.timestamps = timestamps
        self.strategy = strategy
        self.on_error = check_on_error(on_error)
        self.skipped = []
        self.max_ts: float = MIN_WATERMARK
        self.last_record = 0.0
        self.clock: Callable[[], float] = time.monotonic  #: the task's (open)

    # -- the source protocol: the rest is the inner source's (WrappingSource) ---------------

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self.clock = ctx.monotonic()
        self.last_record = self.clock()

    def read_batch(self) -> list[T] | None:
        batch = self.inner.read_batch()
        if batch:
            self.last_record = self.clock()
            first = None
            try:  # the fast path: one pass over the batch
                newest = max(map(self.timestamps, batch))
                later = newest > self.max_ts  # (a timestamp that is no number fails here)
            except Exception as e:
                first = e
            if first is not None:  # (outside the handler: the failure's traceback shows it once)
                batch, newest = self._isolate(batch, first)
                later = bool(batch) and newest > self.max_ts
            if later:
                self.max_ts = newest
        return batch

    def _isolate(self, batch: list[T], first: Exception) -> tuple[list[T], Any]:
        """The slow path, after the batch's timestamps failed: record by record, each
        record that fails goes through record_failed (skip: it is left out of the batch).
        Returns the records kept and their newest timestamp."""
        ts, label = self.timestamps, function_label("timestamps", self.timestamps)
        kept: list[T] = []
        newest: Any = MIN_WATERMARK
        for record in batch:
            try:
                t = ts(record)
            except Exception as e:
                self.record_failed(record, label, e)  # raises, or (skip) notes it: left out
                continue
            try:
                later = t > newest
            except TypeError:
                self.record_failed(record, label, TypeError(f"a timestamp must be a number, got {type(t).__name__} "
                                                            f"{t!r}"))
                continue
            kept.append(record)
            if later:
                newest = t
        if len(kept) == len(batch) and self.on_error == "fail":
            raise first  # no single record fails again: not reproducible
        return kept, newest

    def snapshot(self, checkpoint_id: int) -> Any:
        return {"offsets": self.inner.snapshot(checkpoint_id), "max_ts": self.max_ts}

    def restore(self, state: Any) -> None:
        self.inner.restore(state["offsets"])
        self.max_ts = state["max_ts"]

    def rescale_state(self, old: list[Any], index: int, parallelism: int, owns: Owns) -> Any:
        """The inner source's rule for the offsets; the watermark restarts at the lowest of
        the old subtasks' (a split may move to a subtask that was ahead: never behind it)."""
        offsets = self.inner.rescale_state([s["offsets"] if s else None for s in old], index, parallelism, owns)
        marks = [s["max_ts"] for s in old if s]
        return {"offsets": offsets, "max_ts": min(marks) if marks else MIN_WATERMARK}

    # -- watermarks -------------------------------------------------------------------------

    def watermark(self) -> float:
        return self.max_ts - self.strategy.max_delay - 1 if self.max_ts != MIN_WATERMARK else MIN_WATERMARK

    def watermark_status(self, read_something: bool) -> float | None:
        """What the subtask's status is now: its watermark, or None when idle."""
        timeout = self.strategy.idle_timeout
        if not read_something and timeout is not None and self.clock() - self.last_record >= timeout:
            return None
        return self.watermark()
