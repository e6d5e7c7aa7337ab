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

Rescaling contract: when a job resumes with another parallelism for an operator, the
runtime asks it for each new subtask's state, ``rescale_state(old, index, parallelism,
owns)``, built from the states of *all* its old subtasks (``old``, in subtask order), then
``restore`` gets it. A keyed operator only declares the shape of its state
(``state_layout``: keys, timers, a watermark): the default then keeps the keys whose key
group the new subtask owns, one implementation for every operator family
(operators/state_layout.py). Sources pool their unread splits and deal them out. Without a
layout the default accepts an operator without state (every old state None) and refuses
one with state (RescaleError(STATEFUL_OPERATOR), naming it): declare a layout or override
``rescale_state`` to make user state rescalable.
"""

from __future__ import annotations

import contextlib
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, ContextManager, Generic, TypeVar

# The rule for a user function that raises on a record: its own module, part of this interface.
from .record_errors import MESSAGE_MAX as MESSAGE_MAX
from .record_errors import ON_ERROR as ON_ERROR
from .record_errors import Guarded as Guarded
from .record_errors import KeyFunction as KeyFunction
from .record_errors import RecordError as RecordError
from .record_errors import check_on_error as check_on_error
from .record_errors import function_label as function_label
from .record_errors import raised_in as raised_in

# The shape of keyed state, by which the runtime splits it on a rescale: part of this interface.
from .progress import SourceProgress
from .state_layout import Layout
from .state_layout import Owns as Owns
from .state_layout import Part as Part
from .state_layout import redistribute

T = TypeVar("T")  #: the records a source yields


@dataclass(frozen=True)
class OperatorContext:
    """What ``open(ctx)`` gives an operator or a source: which subtask it is, of what job and
    attempt. The runtime makes it; its fields are read-only."""

    operator: str  #: the operator's name in the dataflow
    subtask_index: int  #: this subtask's number, 0 to ``parallelism - 1``
    parallelism: int  #: the operator's subtasks in this attempt
    attempt: int  #: 0 for the first run of the job, +1 on every restart
    restored: bool  #: state will be (or was) restored from a checkpoint
    #: The attempt's fence (abs_engine.checkpoint.fence.Fence) or None; use ``guard()``.
    fence: Any = None
    #: The job runs with ``tls`` on: a source that opens connections of its own to the
    #: driver (SparkSource) encrypts them too.
    tls: bool = False
    #: The job's key groups (abs_engine/keygroups.py).
    max_parallelism: int = 128
    #: The task's clock (abs_engine/runtime/clock.py: ``monotonic``, ``perf_counter``,
    #: ``time``); None: the system's. Operators that measure time read it through ``monotonic``,
    #: so a simulated run moves their time too.
    clock: Any = None
    #: The dataflow's name (the same in every attempt and resume): what an external system's
    #: bookkeeping (a sink's progress table) knows this job by.
    job: str = ""

    def monotonic(self) -> Callable[[], float]:
        """The task's monotonic clock, as a function to call."""
        return time.monotonic if self.clock is None else self.clock.monotonic

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


def stateless_rescale(operator: str, old: list[Any]) -> None:
    """The state of a rescaled operator that keeps none: None if every state in ``old`` (the
    old subtasks') is None, else RescaleError(STATEFUL_OPERATOR) naming ``operator``."""
    from abs_engine.errors import RescaleError, RescaleErrorReason  # here: abs_engine imports this module

    if any(s is not None for s in old):
        raise RescaleError(RescaleErrorReason.STATEFUL_OPERATOR,
                           f"operator {operator!r} keeps state that has no rule to be split across another "
                           "parallelism: keep its parallelism when you resume (set it on the operator), or "
                           "override rescale_state() on it", operator)
    return None


class Operator(Guarded, ABC):
    """A transformation of batches. Stateless unless snapshot/restore are overridden. A
    user function that raises on a record goes through ``record_failed`` (``Guarded``)."""

    #: Records dropped by on_error="skip" (or reported, like a window's late records) since
    #: the runtime last looked: (record, exception). The runtime reports and clears them
    #: after each call (``take_skipped``).
    skipped: list[tuple[Any, BaseException]]

    #: Capabilities the runtime reads (declared, never probed):
    #: it has processing-time timers: the task asks ``next_processing_timer`` and calls
    #: ``on_processing_time`` when one is due (operators/timers.py).
    processing_timers: bool = False
    #: its keyed state can be checkpointed incrementally: ``track_changes``,
    #: ``take_changes`` and ``untrack_changes`` (operators/keyed.py, runtime/increments.py).
    incremental: bool = False
    #: the shape of its keyed state, by which ``rescale_state``'s default splits it on a
    #: rescale (operators/state_layout.py); None: no keyed state (or a rule of its own).
    state_layout: ClassVar[Layout | None] = None
    #: Spark task slots it occupies while the job runs (a Spark source reads through jobs of its own).
    spark_slots: int = 0
    #: Modules its workers need, imported once before workers are forked instead of in
    #: each (runtime/fork_server.py): only fork-safe ones (pyarrow is).
    preload: tuple[str, ...] = ()

    def open(self, ctx: OperatorContext) -> None:
        """Called in the worker before anything else (``restore`` comes after it): keeps
        ``ctx`` as ``self.ctx``. An override calls ``super().open(ctx)``."""
        self.ctx = ctx

    def check(self) -> None:
        """Called in the driver before the job starts: raise an error naming a missing input
        or a bad setting (a sink's output, a source's files)."""

    def driver_start(self) -> None:
        """Called in the driver after check(), before the operator is shipped (once per job)."""

    def driver_stop(self) -> None:
        """Called in the driver when the job has ended, however it ended."""

    def next_processing_timer(self) -> float | None:
        """With ``processing_timers``: when the earliest is due (None: there is none)."""
        return None

    def on_processing_time(self, now: float) -> list[Any]:
        """With ``processing_timers``: fire what is due at ``now``; the records to emit."""
        return []

    @abstractmethod
    def process(self, batch: list[Any]) -> list[Any]:
        """Consume ``batch`` (a list of records), return the records to emit (possibly an
        empty list). Implement it."""

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
        """The operator's state at checkpoint ``checkpoint_id`` (msgpack-encodable; see the
        module docstring). It is encoded before another batch is processed, so it may be the
        live object. Default: None (stateless)."""
        return None

    def restore(self, state: Any) -> None:
        """Start from ``state``, what ``snapshot`` returned (or ``rescale_state`` built),
        instead of from scratch. Default: nothing."""
        pass

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Every task's snapshot for ``checkpoint_id`` is durable: publish what it covers
        (idempotently: see the module docstring). Default: nothing."""
        pass

    def rescale_state(self, old: list[Any], index: int, parallelism: int, owns: Owns) -> Any:
        """The state of subtask ``index`` of ``parallelism`` from all old subtasks' states
        ``old`` (see the module docstring); ``owns(key)`` says whether the new subtask owns
        a key. Default: the keys (and timers) of its declared ``state_layout`` that the new
        subtask owns; without one, only an operator without state rescales."""
        if self.state_layout is not None:
            return redistribute(self.state_layout, old, owns)
        return stateless_rescale(self.ctx.operator, old)

    def close(self) -> None:
        """Release what ``open`` took (files, connections), however the task ended; an
        exception here is ignored. Default: nothing."""
        pass


class Source(Guarded, ABC, Generic[T]):
    """A replayable source of records of type ``T``: ``snapshot`` returns the read offset,
    ``restore`` rewinds to it. ``Dataflow.source`` turns a ``Source[T]`` into a
    ``Stream[T]``. A user function it calls per record (a timestamps function) goes
    through ``record_failed`` (``Guarded``): a record it skips is left out of the batch."""

    #: Records left out of a batch by on_error="skip": (record, exception); see Operator.
    skipped: list[tuple[Any, BaseException]]

    #: Spark task slots it occupies while the job runs (a Spark source reads through jobs of its own).
    spark_slots: int = 0
    incremental: bool = False  #: (sources keep offsets, written whole)
    #: The most subtasks it can be read by (None: any): ``Dataflow.source`` gives it this many
    #: when no parallelism is asked for, and refuses more (a replication slot is one stream).
    max_subtasks: int | None = None
    preload: tuple[str, ...] = ()  #: as Operator.preload

    #: The source tracks event time: after each read the task asks ``watermark_status``
    #: what to send downstream (operators/eventtime.py). A capability the task reads, not probes.
    emits_watermarks: bool = False

    def watermark_status(self, read_something: bool) -> float | None:
        """With ``emits_watermarks``: the subtask's watermark now, or None when it is idle;
        ``read_something``: the last ``read_batch`` returned records."""
        raise NotImplementedError(f"{type(self).__name__} does not track event time")

    def progress(self) -> SourceProgress | None:
        """How far this subtask has read (operators/progress.py), from its offset; None:
        the source does not say. Runs on another thread than ``read_batch``: read
        attributes only, no I/O."""
        return None

    #: A source that reports this many records per read_batch is fine; batches should be
    #: large enough (thousands of records) to amortise the per-batch cost downstream.

    def open(self, ctx: OperatorContext) -> None:
        """As Operator.open: keeps ``ctx``, before ``restore``; subtask ``ctx.subtask_index``
        of ``ctx.parallelism`` reads its own share."""
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
        """The read offset at checkpoint ``checkpoint_id``: everything before it has been
        emitted (msgpack-encodable)."""

    @abstractmethod
    def restore(self, state: Any) -> None:
        """Rewind to ``state``, an offset returned by snapshot()."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Every task's snapshot for ``checkpoint_id`` is durable: the offsets it holds will
        never be read again (a source may release what lies before them, e.g. confirm a
        replication slot). Default: nothing."""

    def rescale_state(self, old: list[Any], index: int, parallelism: int, owns: Owns) -> Any:
        """The offsets of subtask ``index`` of ``parallelism`` from all old subtasks' (``old``;
        see the module docstring; ``owns`` as in Operator): a source that can be rescaled
        pools its unread splits and deals them out. Default: refused, naming the source."""
        from abs_engine.errors import RescaleError, RescaleErrorReason

        raise RescaleError(RescaleErrorReason.STATEFUL_OPERATOR,
                           f"source {self.ctx.operator!r} cannot redistribute its offsets to another "
                           "parallelism: keep its parallelism when you resume (set it on the source)",
                           self.ctx.operator)

    def close(self) -> None:
        """As Operator.close: release what ``open`` took, however the task ended."""
        pass


class WrappingSource(Source[T], Generic[T]):
    """A source around another, ``inner``, that changes what it reads (event time, a
    test's gate): the rest of the source protocol is ``inner``'s (a SparkSource inside keeps
    its Spark slots). Subclasses implement ``read_batch``, ``snapshot`` and ``restore``."""

    def __init__(self, inner: Source[T]):
        self.inner = inner
        self.spark_slots = inner.spark_slots
        self.preload = inner.preload
        self.max_subtasks = inner.max_subtasks

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self.inner.open(ctx)

    def check(self) -> None:
        self.inner.check()

    def driver_start(self) -> None:
        self.inner.driver_start()

    def driver_stop(self) -> None:
        self.inner.driver_stop()

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.inner.notify_checkpoint_complete(checkpoint_id)

    def progress(self) -> SourceProgress | None:
        return self.inner.progress()

    def close(self) -> None:
        self.inner.close()


class Sink(Operator):
    """An operator at the end of the graph: it emits nothing downstream."""

    def check(self) -> None:
        """Called in the driver before the job starts: raise InputError for an unusable output."""

    def outputs(self) -> list[str]:
        """The files, directories or URIs this sink writes (as given): two sinks of one
        dataflow whose outputs resolve to the same place, or one inside the other, are
        refused when the second is added (each would truncate or roll back the other's
        output). Default: none (a sink that writes nowhere shared)."""
        return []
