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
MESSAGE_MAX = 200  #: characters of the user's exception a RecordError's message shows


class RecordError(Exception):
    """``record`` made the user function ``function`` raise (the user's exception is the
    cause). ``function`` is a label such as ``"timestamps function 'parse_ts'"``
    (``function_label``); for a window that fails when it fires, ``record`` is the window
    ``(key, start, end)``, for a timer ``(key, timestamp)``. The runtime turns it into a
    failure that names the operator, the function, the exception and the record, and the
    driver fails the job at once if the same record fails the same operator again after a
    restart (a poison record)."""

    def __init__(self, record: Any, function: str = ""):
        super().__init__(record, function)
        self.record = record
        self.function = function

    def __str__(self) -> str:
        what = f"the {self.function}" if self.function else "the operator's function"
        cause = self.__cause__
        if cause is None:
            return f"a record made {what} raise"
        try:
            text = f"{type(cause).__name__}: {cause}"
        except Exception:  # noqa: BLE001 - a broken __str__ must not hide the failure
            text = type(cause).__name__
        if len(text) > MESSAGE_MAX:
            text = text[:MESSAGE_MAX] + "..."
        return f"{what} raised {text}"


def check_on_error(on_error: str) -> str:
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    return on_error


def function_label(role: str, fn: Any) -> str:
    """How a failure names a user function: ``function_label("key", user)`` is
    ``"key function 'user'"`` (a callable without a name: its type's)."""
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return f"{role} function {name!r}"


def raised_in(e: BaseException, fn: Any) -> bool:
    """Whether ``e`` was raised inside ``fn`` (a frame of its code is in the traceback):
    which of two functions called one right after the other raised (``create`` or
    ``add``). Looked at on a failure only; a function without Python code never matches."""
    code = getattr(fn, "__code__", None)
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is code:
            return True
        tb = tb.tb_next
    return False


class Guarded:
    """The one rule for a user function that raises on a record, shared by every operator
    and source (and, through ``KeyFunction``, by key functions on the edges into keyed
    operators).

    An operator or source that calls user code per record catches what the call raises
    and calls ``record_failed(record, function, error)`` before it has changed any state
    for that record (compute first, then commit):

    - ``on_error="fail"`` (the default) raises ``RecordError(record, function)`` from the
      error: the task fails naming the operator, the function, the exception and the
      record, and the job fails at once if the record fails again after a restart;
    - ``on_error="skip"`` appends ``(record, error)`` to ``skipped`` and returns: the
      caller drops the record (its state and output stay as they were), and the runtime
      reports it (``JobResult.skipped_records``, one log line per record).

    ``on_error`` is the operator's; a key function has its own (``key_by(key,
    on_error=...)``: ``key_on_error``), passed as ``on_error`` to ``record_failed``."""

    #: "fail" or "skip": what a record that makes one of this operator's functions raise does.
    on_error: str = "fail"
    #: The same for the key function (``key_by(key, on_error=...)``) of a keyed operator.
    key_on_error: str = "fail"

    def record_failed(self, record: Any, function: str, error: BaseException, on_error: str | None = None) -> None:
        """``record`` made the user function ``function`` (a ``function_label``) raise
        ``error``: raise RecordError, or (skip) note it in ``skipped`` and return."""
        if (on_error or self.on_error) == "skip":
            skipped: list[tuple[Any, BaseException]] | None = getattr(self, "skipped", None)
            if skipped is None:
                skipped = []
                self.skipped = skipped  # (an operator whose __init__ made none)
            skipped.append((record, error))
            return
        raise RecordError(record, function) from error

    @property
    def reports_skipped(self) -> bool:
        """Whether the runtime looks at ``skipped`` after each call: an operator that skips
        records (or, like a window's late records, drops records it must report)."""
        return self.on_error == "skip" or self.key_on_error == "skip"

    def take_skipped(self) -> list[tuple[Any, BaseException]]:
        """The records skipped since the last call, with their exceptions (then none)."""
        skipped: list[tuple[Any, BaseException]] | None = getattr(self, "skipped", None)
        if not skipped:
            return []
        taken = list(skipped)
        skipped.clear()
        return taken


class KeyFunction:
    """A key function with its ``on_error`` (``key_by(key, on_error="skip")``) and the name
    failures give it: what the hash edge into a keyed operator applies (the runtime's
    ``Output`` unwraps it; it routes by ``fn``). Called, it is the key of a record."""

    __slots__ = ("fn", "on_error", "name")

    def __init__(self, fn: Callable[[Any], Any] | None, on_error: str = "fail", name: str | None = None):
        self.fn = fn
        self.on_error = check_on_error(on_error)
        self.name = name or (getattr(fn, "__name__", None) or type(fn).__name__ if fn is not None else "record")

    def __call__(self, record: Any) -> Any:
        return record if self.fn is None else self.fn(record)

    def __getstate__(self) -> tuple[Any, str, str]:
        return self.fn, self.on_error, self.name

    def __setstate__(self, state: tuple[Any, str, str]) -> None:
        self.fn, self.on_error, self.name = state


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
    #: Spark task slots it occupies while the job runs (a Spark source reads through jobs of its own).
    spark_slots: int = 0

    def open(self, ctx: OperatorContext) -> None:
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

    #: The source tracks event time: after each read the task asks ``watermark_status``
    #: what to send downstream (operators/eventtime.py). A capability the task reads, not probes.
    emits_watermarks: bool = False

    def watermark_status(self, read_something: bool) -> float | None:
        """With ``emits_watermarks``: the subtask's watermark now, or None when it is idle."""
        raise NotImplementedError(f"{type(self).__name__} does not track event time")

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


class WrappingSource(Source[T], Generic[T]):
    """A source around another, ``inner``, that changes what it reads (event time, a
    test's gate): the rest of the source protocol is ``inner``'s (a SparkSource inside keeps
    its Spark slots). Subclasses implement ``read_batch``, ``snapshot`` and ``restore``."""

    def __init__(self, inner: Source[T]):
        self.inner = inner
        self.spark_slots = inner.spark_slots

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
