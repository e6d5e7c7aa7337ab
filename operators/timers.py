"""Keyed timers (event time and processing time), and ``KeyedTimedProcess``: your own keyed
operator with per-key state and timers (Flink's KeyedProcessFunction).

A timer is ``(domain, key, timestamp)``; registering one twice is registering it once. An
event-time timer fires when the task's watermark reaches its timestamp, a processing-time
timer when the wall clock (``time.time()``, seconds) does. Timers that are due fire in
``(timestamp, msgpack encoding of the key)`` order: the same order in every run, after every
restore and in every rescaled subtask, whatever order they were registered in. A timer
callback may register timers that are already due: they fire in the same pass.

Timers are state: a snapshot holds every live timer, so a restore fires them as the
uninterrupted run would; a rescale deals them out with their keys' key groups.

``KeyedTimedProcess``: subclass it and write ``process_key(key, record, state, ctx)`` and
``on_timer(key, timestamp, domain, state, ctx)``; ``state`` is the key's ``KeyState`` (as in
``KeyedProcess``), ``ctx`` a ``TimerContext`` (the record's timestamp, the watermark,
register and delete timers of the current key). A record whose timestamp is at or below
the watermark is late; what to do with it is the operator's choice (``ctx.is_late``).

Incremental checkpoints (checkpoint/incremental.py): a timed operator that tracks the keys
it touches (``tracks_keys``: windows, and ``KeyedTimedProcess`` unless a subclass overrides
its ``process``) records every key a record or a fired timer reached; a delta then holds,
for those keys only, their value (or its deletion) and all their timers, and the
watermark. Invariant: a key whose value or timers changed is a key a record of it was
processed for or a timer of it fired for (a callback changes only its own key's state
and timers).

User functions that raise (operators/base.py, ``Guarded``): the key function, the
timestamp function and ``process_key`` name the record; ``on_timer`` names the timer's
``(key, timestamp)`` as its record (a restore fires it again, so a repeat is a poison
record too). With ``apply_keyed(..., on_error="skip")`` the record (or the timer's
output) is dropped and reported, and the key's value is put back as it was before the
call; timers a failing call registered or deleted stay so (see operators/keyed_process.py).
"""

from __future__ import annotations

import heapq
from typing import Any, Callable, Iterable, Iterator

import msgpack

from abs_engine.codec import freeze

from .base import Operator, OperatorContext, function_label
from .eventtime import MIN_WATERMARK
from .state_layout import Part
from .keyed_process import _ABSENT, KeyState, process_key_label, put_back

EVENT, PROCESSING = 0, 1  #: timer domains: the ``domain`` of ``on_timer`` says which one fired
DOMAINS = {EVENT: "event time", PROCESSING: "processing time"}

#: What users of timers import (TimerService and TimedOperator are the engine's).
__all__ = ["EVENT", "PROCESSING", "KeyedTimedProcess", "TimerContext"]


def _key_bytes(key: Any) -> bytes:
    data: bytes = msgpack.packb(key, use_bin_type=True)
    return data


class TimerService:
    """Live timers per domain, bucketed by timestamp: ``buckets[domain][ts]`` maps a key's
    encoding to the key, and ``times[domain]`` is a heap of the timestamps that have a
    bucket (an emptied bucket's entry is dropped when it surfaces). Firing a bucket sorts
    its keys once: windows put many keys on few timestamps, so this is far cheaper than a
    heap of every timer."""

    def __init__(self) -> None:
        self.buckets: tuple[dict[float, dict[bytes, Any]], dict[float, dict[bytes, Any]]] = ({}, {})
        self.times: tuple[list[float], list[float]] = ([], [])

    def __len__(self) -> int:
        return sum(len(b) for buckets in self.buckets for b in buckets.values())

    def register(self, domain: int, key: Any, timestamp: float) -> None:
        buckets = self.buckets[domain]
        bucket = buckets.get(timestamp)
        if bucket is None:
            bucket = buckets[timestamp] = {}
            heapq.heappush(self.times[domain], timestamp)
        bucket[_key_bytes(key)] = key

    def delete(self, domain: int, key: Any, timestamp: float) -> None:
        buckets = self.buckets[domain]
        bucket = buckets.get(timestamp)
        if bucket is not None:
            bucket.pop(_key_bytes(key), None)
            if not bucket:  # (its heap entry goes when it surfaces; the heap is compacted if they pile up)
                del buckets[timestamp]
                times = self.times[domain]
                if len(times) > 2 * len(buckets) + 1024:
                    times[:] = sorted(buckets)  # (a sorted list is a heap)

    def next_due(self, domain: int) -> float | None:
        times, buckets = self.times[domain], self.buckets[domain]
        while times and not buckets.get(times[0]):
            buckets.pop(heapq.heappop(times), None)
        return times[0] if times else None

    def pop_due(self, domain: int, time: float) -> Iterator[tuple[Any, float]]:
        """(key, timestamp) of every live timer of ``domain`` at or before ``time``, in
        (timestamp, key encoding) order, each removed as it is yielded (so a callback may
        re-register it). A timer a callback registers that is already due fires in this
        pass too: after the rest of the keys of the timestamp being fired (then in order)."""
        times, buckets = self.times[domain], self.buckets[domain]
        while times and times[0] <= time:
            ts = times[0]
            bucket = buckets.get(ts)
            if not bucket:
                heapq.heappop(times)
                buckets.pop(ts, None)
                continue
            for kb in sorted(bucket):
                key = bucket.pop(kb, _GONE)
                if key is not _GONE:  # (a callback may have deleted it)
                    yield key, ts

    def snapshot(self) -> list[list[Any]]:
        """``[[domain, timestamp, [keys]], ...]``: a list a bucket (the task thread's share
        of a checkpoint: keep it small), in no particular order."""
        return [[d, ts, list(bucket.values())] for d in (EVENT, PROCESSING) for ts, bucket in self.buckets[d].items()
                if bucket]

    def restore(self, timers: Iterable[Any], owns: Callable[[Any], bool] | None = None) -> None:
        self.__init__()  # type: ignore[misc]
        for d, ts, keys in timers:
            for key in keys:
                key = freeze(key)  # a tuple key inside an array comes back from state as a list
                if owns is None or owns(key):
                    self.register(int(d), key, ts)


_GONE = object()


class TimerContext:
    """What ``process_key`` and ``on_timer`` see besides the key's state (valid during the
    call only): ``key``, ``timestamp`` and the timers of that key. The operator makes it
    (``op``: the operator whose timers these are)."""

    __slots__ = ("_op", "key", "timestamp")

    def __init__(self, op: "TimedOperator"):
        self._op = op
        self.key: Any = None
        self.timestamp: float | None = None  #: the record's (None without a timestamp function) or the timer's

    @property
    def watermark(self) -> float:
        """The operator's watermark: every record with a timestamp at or below it is late."""
        return self._op.watermark

    @property
    def is_late(self) -> bool:
        """The record's timestamp is at or below the watermark (False without a timestamp)."""
        return self.timestamp is not None and self.timestamp <= self._op.watermark

    def register_event_time(self, timestamp: float) -> None:
        """A timer of this key that fires when the watermark reaches ``timestamp``."""
        self._op.timers.register(EVENT, self.key, timestamp)

    def register_processing_time(self, timestamp: float) -> None:
        """A timer of this key that fires when ``time.time()`` reaches ``timestamp`` (seconds)."""
        self._op.timers.register(PROCESSING, self.key, timestamp)

    def delete_event_time(self, timestamp: float) -> None:
        """Delete this key's event-time timer at ``timestamp`` (none there: nothing happens)."""
        self._op.timers.delete(EVENT, self.key, timestamp)

    def delete_processing_time(self, timestamp: float) -> None:
        """Delete this key's processing-time timer at ``timestamp`` (none there: nothing happens)."""
        self._op.timers.delete(PROCESSING, self.key, timestamp)


class TimedOperator(Operator):
    """A keyed operator with a watermark and timers in its state. Subclasses implement
    ``fire(key, timestamp, domain)`` and keep their per-key data in ``keyed_state()`` /
    ``restore_keyed`` (a map key -> value, split by key group on a rescale)."""

    processing_timers = True
    #: what ``snapshot`` returns: keys and timers split by key group, the lowest watermark
    state_layout = {"keys": Part.KEYED, "timers": Part.KEYED_TIMERS, "watermark": Part.LOWEST}
    #: incremental deltas are of the "keys" map, with the changed keys' timers (see the module docstring)
    DELTA_FIELD = "keys"
    #: Subclasses whose ``process`` records every key it touches in ``changed`` set this:
    #: only they are checkpointed incrementally (``incremental``, read after ``open``).
    tracks_keys = False

    key_fn: Callable[[Any], Any] | None = None
    #: The keys touched since ``take_changes`` (None: not tracked).
    changed: set[Any] | None = None

    @property
    def incremental(self) -> bool:  # type: ignore[override]
        return self.tracks_keys

    def track_changes(self) -> None:
        self.changed = set()

    def untrack_changes(self) -> None:
        self.changed = None

    def take_changes(self) -> set[Any]:
        changed = self.changed if self.changed is not None else set()
        self.changed = set()
        return changed

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        if "timers" not in self.__dict__:
            self.timers = TimerService()
            self.watermark = MIN_WATERMARK

    # -- subclass hooks -----------------------------------------------------------------

    def fire(self, key: Any, timestamp: float, domain: int) -> list[Any]:
        raise NotImplementedError

    def keyed_state(self) -> dict[Any, Any]:
        raise NotImplementedError

    def restore_keyed(self, values: dict[Any, Any]) -> None:
        raise NotImplementedError

    # -- time -----------------------------------------------------------------------------

    def on_watermark(self, watermark: float) -> list[Any]:
        if watermark <= self.watermark:  # (a restored watermark may be ahead of the inputs' first)
            return []
        self.watermark = watermark
        out: list[Any] = []
        changed = self.changed
        for key, ts in self.timers.pop_due(EVENT, watermark):
            if changed is not None:
                changed.add(key)
            out.extend(self.fire(key, ts, EVENT))
        return out

    def next_processing_timer(self) -> float | None:
        return self.timers.next_due(PROCESSING)

    def on_processing_time(self, now: float) -> list[Any]:
        out: list[Any] = []
        changed = self.changed
        for key, ts in self.timers.pop_due(PROCESSING, now):
            if changed is not None:
                changed.add(key)
            out.extend(self.fire(key, ts, PROCESSING))
        return out

    # -- state ----------------------------------------------------------------------------

    def snapshot(self, checkpoint_id: int) -> Any:
        return {"keys": self.keyed_state(), "timers": self.timers.snapshot(), "watermark": self.watermark}

    def restore(self, state: Any) -> None:
        self.restore_keyed(dict(state["keys"]))
        self.timers.restore(state["timers"])
        self.watermark = state["watermark"]


class KeyedTimedProcess(TimedOperator):
    """Your keyed operator with timers: see the module docstring. ``apply_keyed`` gives it
    the stream's key function; ``timestamp`` (a function of the record) gives
    ``ctx.timestamp``."""

    timestamp_fn: Callable[[Any], float] | None = None

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        if "values" not in self.__dict__:
            self.values: dict[Any, Any] = {}
        self._ctx = TimerContext(self)
        self._view = KeyState(self.values)
        # Its process records the keys it touches; a subclass's own process may not.
        self.tracks_keys = type(self).process is KeyedTimedProcess.process

    def process_key(self, key: Any, record: Any, state: KeyState, ctx: TimerContext) -> Iterable[Any] | None:
        """One ``record`` of ``key``, with the key's ``state`` and ``ctx`` (its timestamp,
        timers): return the records to emit (None for none). Implement it."""
        raise NotImplementedError("implement process_key(key, record, state, ctx) in your KeyedTimedProcess")

    def on_timer(self, key: Any, timestamp: float, domain: int, state: KeyState,
                 ctx: TimerContext) -> Iterable[Any] | None:
        """A timer of ``key`` at ``timestamp`` fired (``domain``: EVENT or PROCESSING), with
        the key's ``state`` and ``ctx``: return the records to emit. Default: nothing."""
        return None

    def function(self, role: str, record: Any) -> str:
        """How a failure of ``role`` ("key", "timestamp", "process_key") on ``record``
        names the function (IntervalJoin names its inputs' functions)."""
        if role == "key":
            return function_label("key", self.key_fn)
        if role == "timestamp":
            return function_label("timestamp", self.timestamp_fn)
        return process_key_label(self)

    def process(self, batch: list[Any]) -> list[Any]:
        out: list[Any] = []
        key_fn, ts_fn, ctx, view, values = self.key_fn, self.timestamp_fn, self._ctx, self._view, self.values
        undo = self.on_error == "skip"  # (failing, the task restarts from a checkpoint: nothing to undo)
        for record in batch:
            if key_fn is None:
                key = record
            else:
                try:
                    key = key_fn(record)
                except Exception as e:
                    self.record_failed(record, self.function("key", record), e, self.key_on_error)
                    continue
            if ts_fn is None:
                ts = None
            else:
                try:
                    ts = ts_fn(record)
                except Exception as e:
                    self.record_failed(record, self.function("timestamp", record), e)
                    continue
            ctx.key = view.key = key
            ctx.timestamp = ts
            if self.changed is not None:
                self.changed.add(key)
            before = values.get(key, _ABSENT) if undo else None
            n = len(out)
            try:
                emitted = self.process_key(key, record, view, ctx)
                if emitted:
                    out.extend(emitted)
            except Exception as e:
                del out[n:]
                if undo:
                    put_back(values, key, before)
                self.record_failed(record, self.function("process_key", record), e)
        return out

    def fire(self, key: Any, timestamp: float, domain: int) -> list[Any]:
        ctx, view = self._ctx, self._view
        ctx.key = view.key = key
        ctx.timestamp = timestamp
        before = self.values.get(key, _ABSENT) if self.on_error == "skip" else None
        try:
            emitted = self.on_timer(key, timestamp, domain, view, ctx)
            return list(emitted) if emitted else []
        except Exception as e:
            if self.on_error == "skip":
                put_back(self.values, key, before)
            self.record_failed((key, timestamp), process_key_label(self, "on_timer"), e)
            return []

    def keyed_state(self) -> dict[Any, Any]:
        return self.values

    def restore_keyed(self, values: dict[Any, Any]) -> None:
        self.values = values
        self._view = KeyState(self.values)
