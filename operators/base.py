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

Rescaling contract: when a job resumes with another parallelism for an operator,
``rescale_state(old, index, parallelism, owns)`` builds the state subtask ``index`` restores
from the states of *all* the operator's old subtasks (``old``, in subtask order), then
``restore`` gets it. Keyed operators keep only the keys whose key group the new subtask owns
(``owns(key)``); sources pool their unread splits and deal them out. The default accepts an
operator without state (every old state None) and refuses one with state
(RescaleError(STATEFUL_OPERATOR), naming it): override it to make user state rescalable.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Generic, TypeVar

T = TypeVar("T")  #: the records a source yields


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
    #: The job's key groups (abs_engine/keygroups.py).
    max_parallelism: int = 128

    def owns(self, key: Any) -> bool:
        """Whether this subtask owns ``key`` (its key group is in this subtask's range): the
        keys a keyed operator's subtask sees, and the ones it should report at the end."""
        from abs_engine.keygroups import key_group, key_group_range

        return key_group(key, self.max_parallelism) in key_group_range(self.max_parallelism, self.parallelism,
                                                                       self.subtask_index)

    def guard(self) -> ContextManager[None]:
        """Hold this around every change a sink makes to its output (publish, truncate,
        delete): it excludes other writers and raises abs_engine.errors.FencedOut if this
        process belongs to an attempt that a newer one has replaced."""
        if self.fence is None:
            return contextlib.nullcontext()
        guard: ContextManager[None] = self.fence.hold()
        return guard


Owns = Callable[[Any], bool]  #: key -> whether the new subtask owns the key's key group


def stateless_rescale(operator: str, old: list[Any]) -> None:
    """The state of a rescaled operator that keeps none: None, or RescaleError naming it."""
    from abs_engine.errors import RescaleError, RescaleErrorReason  # here: abs_engine imports this module

    if any(s is not None for s in old):
        raise RescaleError(RescaleErrorReason.STATEFUL_OPERATOR,
                           f"operator {operator!r} keeps state that has no rule to be split across another "
                           "parallelism: keep its parallelism when you resume (set it on the operator), or "
                           "override rescale_state() on it", operator)
    return None


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

    def on_watermark(self, watermark: float) -> list[Any]:
        """Event time has reached ``watermark`` (no record with a timestamp <= it is expected
        any more): fire what is due and return the records to emit. Called only when the
        watermark moves forward; +inf at the end of the input."""
        return []

    def take_side_output(self) -> list[Any]:
        """The records set aside for the side output since the last call (a window's late
        records): only an operator the dataflow gives a side output is asked."""
        return []

    def snapshot(self, checkpoint_id: int) -> Any:
        return None

    def restore(self, state: Any) -> None:
        pass

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        pass

    def rescale_state(self, old: list[Any], index: int, parallelism: int, owns: Owns) -> Any:
        """The state of subtask ``index`` of ``parallelism`` from all old subtasks' states
        (see the module docstring). Default: only an operator without state rescales."""
        return stateless_rescale(self.ctx.operator, old)

    def close(self) -> None:
        pass


class Source(ABC, Generic[T]):
    """A replayable source of records of type ``T``: ``snapshot`` returns the read offset,
    ``restore`` rewinds to it. ``Dataflow.source`` turns a ``Source[T]`` into a
    ``Stream[T]``."""

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
    def read_batch(self) -> list[T] | None:
        """Return the next batch (may be empty), or None when the input is exhausted."""

    @abstractmethod
    def snapshot(self, checkpoint_id: int) -> Any:
        """The read offset: everything before it has been emitted."""

    @abstractmethod
    def restore(self, state: Any) -> None:
        """Rewind to an offset returned by snapshot()."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        pass

    def rescale_state(self, old: list[Any], index: int, parallelism: int, owns: Owns) -> Any:
        """The offsets of subtask ``index`` of ``parallelism`` from all old subtasks'
        (see the module docstring): a source that can be rescaled pools its unread splits
        and deals them out. Default: refused, naming the source."""
        from abs_engine.errors import RescaleError, RescaleErrorReason

        raise RescaleError(RescaleErrorReason.STATEFUL_OPERATOR,
                           f"source {self.ctx.operator!r} cannot redistribute its offsets to another "
                           "parallelism: keep its parallelism when you resume (set it on the source)",
                           self.ctx.operator)

    def close(self) -> None:
        pass


class Sink(Operator):
    """An operator at the end of the graph: it emits nothing downstream."""

    def check(self) -> None:
        """Called in the driver before the job starts: raise InputError for an unusable output."""
