"""The operator ABCs.

An operator processes whole batches (lists of records) and returns a list of output
records: one Python call per batch per operator, never one per record per hop.

Checkpoint contract (ABS): ``snapshot(checkpoint_id)`` is called when the task has seen
barrier ``checkpoint_id`` on all its inputs and before it forwards the barrier; it returns
msgpack-encodable state that reflects exactly the records processed before the barrier.
``restore(state)`` is called instead of starting from scratch after a failure.
``notify_checkpoint_complete(id)`` tells the operator that every task's snapshot for ``id``
is durable (side effects such as publishing output may happen then, and must be
idempotent: after a crash the notification may come again, or restore() may come first).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ContextManager


@dataclass(frozen=True)
class OperatorContext:
    operator: str  #: the operator's name in the dataflow
    subtask_index: int
    parallelism: int
    attempt: int  #: 0 for the first run of the job, +1 on every restart
    restored: bool  #: state will be (or was) restored from a checkpoint
    #: The attempt's fence (abs_engine.checkpoint.fence.Fence) or None; use ``guard()``.
    fence: Any = None
    #: The job runs with ``tls`` on: a source that opens connections of its own to the
    #: driver (SparkSource) encrypts them too.
    tls: bool = False

    def guard(self) -> ContextManager[None]:
        """Hold this around every change a sink makes to its output (publish, truncate,
        delete): it excludes other writers and raises abs_engine.errors.FencedOut if this
        process belongs to an attempt that a newer one has replaced."""
        if self.fence is None:
            return contextlib.nullcontext()
        guard: ContextManager[None] = self.fence.hold()
        return guard


ON_ERROR = ("fail", "skip")


class RecordError(Exception):
    """An operator's function raised on ``record`` (the user's exception is the cause).
    Built-in operators raise it so that the failure names the record; the driver fails the
    job at once if the same record fails the same operator again after a restart."""

    def __init__(self, record: Any):
        super().__init__("a record made the operator's function raise")
        self.record = record


def check_on_error(on_error: str) -> str:
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    return on_error


class Operator(ABC):
    """A transformation of batches. Stateless unless snapshot/restore are overridden."""

    #: Records dropped by on_error="skip" since the runtime last looked: (record, exception).
    #: The runtime reports and clears them after each batch.
    skipped: list[tuple[Any, BaseException]]

    def open(self, ctx: OperatorContext) -> None:
        self.ctx = ctx

    @abstractmethod
    def process(self, batch: list[Any]) -> list[Any]:
        """Consume a batch, return the records to emit (possibly an empty list)."""

    def finish(self) -> list[Any]:
        """End of input on every input channel: emit final results (bounded jobs)."""
        return []

    def snapshot(self, checkpoint_id: int) -> Any:
        return None

    def restore(self, state: Any) -> None:
        pass

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        pass

    def close(self) -> None:
        pass


class Source(ABC):
    """A replayable source: ``snapshot`` returns the read offset, ``restore`` rewinds to it."""

    #: A source that reports this many records per read_batch is fine; batches should be
    #: large enough (thousands of records) to amortise the per-batch cost downstream.

    def open(self, ctx: OperatorContext) -> None:
        self.ctx = ctx

    def check(self) -> None:
        """Called in the driver before the job starts: raise InputError for a missing input."""

    def driver_start(self) -> None:
        """Called in the driver after check(), before the operator is shipped to the workers
        (it may set what the workers need, e.g. a server address). Once per job."""

    def driver_stop(self) -> None:
        """Called in the driver when the job has ended, however it ended."""

    @abstractmethod
    def read_batch(self) -> list[Any] | None:
        """Return the next batch (may be empty), or None when the input is exhausted."""

    @abstractmethod
    def snapshot(self, checkpoint_id: int) -> Any:
        """The read offset: everything before it has been emitted."""

    @abstractmethod
    def restore(self, state: Any) -> None:
        """Rewind to an offset returned by snapshot()."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        pass

    def close(self) -> None:
        pass


class Sink(Operator):
    """An operator at the end of the graph: it emits nothing downstream."""

    def check(self) -> None:
        """Called in the driver before the job starts: raise InputError for an unusable output."""
