"""Keyed stateful operators. Their input arrives hash-partitioned by the same key, so each
subtask owns a disjoint set of keys and its state is a plain dict key -> value.

Running variants emit ``(key, value)`` for every input record; ``*Final`` variants emit
``(key, value)`` once per key at end of input (bounded jobs).

Incremental checkpoints (checkpoint/incremental.py): once the runtime calls
``track_changes``, the running variants record each key's latest value in ``changed`` (a
dict updated from the batch's output pairs: one C-level ``dict.update`` per batch, no
per-record cost) and the final variants the keys a batch touches (a set, one
``set.update``); ``take_changes`` hands it over at each snapshot. Invariant: every write
to ``state`` is reflected in ``changed`` by the end of the batch (a value recorded is the
value the state holds; a key recorded but unchanged costs a few bytes, never a wrong
answer); nothing is ever deleted from a state here.

User functions that raise (operators/base.py, ``Guarded``): a key function that raises on
a record goes through ``record_failed`` with ``key_by``'s ``on_error`` (``key_on_error``):
skipped, the record is left out of the batch before any state is touched. A reduce,
aggregate or stateful_map function's result is committed only once every function of that
record has returned.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

from .base import Operator, check_on_error, function_label
from .state_layout import Part

KeyFn = Callable[[Any], Any] | None

#: The keyed operators users may build themselves (apply_key_fn is the engine's).
__all__ = ["Count", "CountFinal", "Reduce", "ReduceFinal"]


def apply_key_fn(op: Operator, key_fn: Callable[[Any], Any], batch: list[Any]) -> tuple[list[Any], list[Any]]:
    """``(keys, records)`` of ``batch`` under ``key_fn``, in operator ``op``: a record the
    key function raises on goes through ``op.record_failed`` with key_by's on_error (the
    task fails naming it, or it is skipped and left out of both lists)."""
    try:
        return list(map(key_fn, batch)), batch  # the fast path: one map over the batch
    except Exception as e:
        first = e
    # Record by record (outside the handler: the failure's traceback shows it once).
    keys, kept = [], []
    label = function_label("key", key_fn)
    for record in batch:
        try:
            k = key_fn(record)
        except Exception as e:
            op.record_failed(record, label, e, op.key_on_error)  # raises, or skips it
            continue
        keys.append(k)
        kept.append(record)
    if len(kept) == len(batch) and op.key_on_error == "fail":
        raise first  # it did not fail on any single record: not reproducible
    return keys, kept


class _Keyed(Operator):
    #: Incremental checkpoints: track key -> value (from the output pairs) instead of keys.
    incremental = True  #: track_changes / take_changes / untrack_changes below
    #: its state (``snapshot``) is the map key -> value itself
    state_layout = Part.KEYED
    TRACKS_VALUES = False

    def __init__(self, key_fn: KeyFn = None):
        self.key_fn = key_fn
        self.state: dict[Any, Any] = {}
        #: Changed since take_changes: key -> value (TRACKS_VALUES) or keys; None: not tracked.
        self.changed: dict[Any, Any] | set[Any] | None = None

    def track_changes(self) -> None:
        self.changed = {} if self.TRACKS_VALUES else set()

    def untrack_changes(self) -> None:
        self.changed = None

    def take_changes(self) -> dict[Any, Any] | set[Any]:
        changed = self.changed
        self.track_changes()
        return changed if changed is not None else self.changed  # type: ignore[return-value]

    def keys_of(self, batch: list[Any]) -> tuple[list[Any], list[Any]]:
        """``(keys, records)``: the key of every record of ``batch`` and the records they
        are of (``batch`` itself unless the key function skipped some: on_error of
        ``key_by``, through ``record_failed``). Records the keys the batch touches."""
        if self.key_fn is None:
            keys = batch
        else:
            keys, batch = self._apply_key_fn(batch)
        if self.changed.__class__ is set:
            self.changed.update(keys)
        return keys, batch

    def _apply_key_fn(self, batch: list[Any]) -> tuple[list[Any], list[Any]]:
        assert self.key_fn is not None
        return apply_key_fn(self, self.key_fn, batch)

    def snapshot(self, checkpoint_id: int) -> Any:
        # No copy: the task encodes the returned state before it processes another record.
        return self.state

    def restore(self, state: Any) -> None:
        self.state = dict(state)
        if self.changed is not None:
            self.track_changes()


class Count(_Keyed):
    """Running count per key: emits (key, count so far) for every record. ``key_fn`` gives a
    record's key (None: the record is its key); ``KeyedStream.count`` passes key_by's."""

    TRACKS_VALUES = True

    def process(self, batch: list[Any]) -> list[Any]:
        state = self.state
        out = []
        keys, _ = self.keys_of(batch)
        for k in keys:
            c = state.get(k, 0) + 1
            state[k] = c
            out.append((k, c))
        if self.changed is not None:
            self.changed.update(out)  # the last pair of a key is its value
        return out


class CountFinal(_Keyed):
    """Count per key for bounded input: emits (key, count) per key at end of input;
    ``key_fn`` as in Count."""

    def __init__(self, key_fn: KeyFn = None):
        super().__init__(key_fn)
        self.state = Counter()

    def process(self, batch: list[Any]) -> list[Any]:
        self.state.update(self.keys_of(batch)[0])  # Counter.update counts in C
        return []

    def finish(self) -> list[Any]:
        return list(self.state.items())

    def restore(self, state: Any) -> None:
        self.state = Counter(dict(state))
        if self.changed is not None:
            self.track_changes()


class Reduce(_Keyed):
    """Running reduce per key: acc = fn(acc, record); emits (key, acc) for every record;
    ``key_fn`` as in Count.

    If ``fn`` raises, the state of that key is unchanged (provided ``fn`` does not mutate the
    accumulator in place before raising): ``record_failed`` applies (``on_error="fail"``, the
    default, fails the task naming the function and the record; "skip" drops and reports it).
    ``fn`` should return a new value: a key's first accumulator is its first record, and
    each emitted pair holds the accumulator itself."""

    ROLE = "reduce"  #: how a failure names ``fn``

    TRACKS_VALUES = True

    def __init__(self, fn: Callable[[Any, Any], Any], key_fn: KeyFn = None, on_error: str = "fail"):
        super().__init__(key_fn)
        self.fn = fn
        self.on_error = check_on_error(on_error)
        self.skipped: list[tuple[Any, BaseException]] = []

    def _failed(self, record: Any, e: Exception, role: str = "", fn: Any = None) -> None:
        """``record`` made this operator's function (or the function ``fn`` of ``role``)
        raise ``e``, before anything of it was committed (compute first, then commit)."""
        self.record_failed(record, function_label(role or self.ROLE, fn or self.fn), e)

    def process(self, batch: list[Any]) -> list[Any]:
        state, fn, out = self.state, self.fn, []
        keys, batch = self.keys_of(batch)
        for k, rec in zip(keys, batch):
            try:
                acc = fn(state[k], rec) if k in state else rec
            except Exception as e:
                self._failed(rec, e)
                continue
            state[k] = acc
            out.append((k, acc))
        if self.changed is not None:
            self.changed.update(out)  # the last pair of a key is its value
        return out


class ReduceFinal(Reduce):
    """Reduce per key for bounded input: emits (key, acc) per key at end of input; ``fn``,
    ``key_fn`` and ``on_error`` as in Reduce."""

    TRACKS_VALUES = False  #: emits nothing per record: tracks the keys it touches

    def process(self, batch: list[Any]) -> list[Any]:
        state, fn = self.state, self.fn
        keys, batch = self.keys_of(batch)
        for k, rec in zip(keys, batch):
            try:
                state[k] = fn(state[k], rec) if k in state else rec
            except Exception as e:
                self._failed(rec, e)
        return []

    def finish(self) -> list[Any]:
        return list(self.state.items())
