"""Keyed operators with an accumulator or a state of the user's: ``aggregate`` (Flink's
AggregateFunction), ``fold_final`` and ``stateful_map`` (Bytewax's). Their per-key state is
the runtime-owned map of operators/keyed.py: checkpointed, re-split by key group on
rescale, written incrementally.

Semantics (every one keyed: records of one key arrive at one subtask, in order per input):

- ``Aggregate(create, add, result)``: ``acc = add(acc, record)``, starting from ``create()``
  for a key's first record; emits ``(key, result(acc))`` (``acc`` if ``result`` is None)
  for every record. ``AggregateFinal`` emits it once per key at end of input.
- ``FoldFinal(create, fold)``: ``AggregateFinal`` without ``result``.
- Pre-aggregation (``aggregate_final(..., merge=m)``): ``PreAggregate`` runs in the
  upstream task, before the shuffle, and folds each *batch* into one partial accumulator per
  key, emitted as ``(key, partial)``; ``MergeFinal`` merges the partials per key with
  ``acc = m(acc, partial)``. It holds no state across batches (a barrier sees it empty), so
  it needs no checkpoint; the output equals ``AggregateFinal``'s when ``m`` is associative
  and ``m(fold of xs, fold of ys) == fold of xs + ys`` (Flink's AggregateFunction.merge
  contract). Partials cross a process, so ``m`` sees them as records arrive (a list as a
  tuple).
- ``StatefulMap(fn)``: ``state, out = fn(state, record)`` with ``state`` None for a key's
  first record (or after it was dropped); emits ``(key, out)``; returning state None drops
  the key's state.

If a user function raises, the key's state is unchanged (provided it did not mutate the
accumulator in place before raising): every function of a record (``create``, ``add``,
``result``) runs before anything is committed, and ``record_failed`` (operators/base.py)
applies: with on_error="fail" (default) the task fails naming the function and the record
(and the job fails if it fails again on it after a restart); with "skip" the record is
dropped and reported. At the end of input, a ``result`` that raises on a key's accumulator
names ``(key, accumulator)`` as the record (skipped: that key's result is left out).
Accumulators and states must be msgpack-encodable: after a restore a tuple comes back as a
list (records crossing a process go the other way: a list arrives as a tuple).

Changing an accumulator in place: ``add`` (``fold``, ``merge``) may update its accumulator
argument and return it instead of building a new one, if

- ``create`` returns a new object on every call (it runs once per key, and once per key
  and batch when pre-aggregating): a shared object would be every key's accumulator; and
- nothing emitted holds the accumulator. True of ``AggregateFinal``, ``FoldFinal`` and
  pre-aggregation (they emit at the end, or a batch's partials once it is done) and of
  ``Aggregate`` with a ``result`` that makes a new value. Not of ``Aggregate`` without
  ``result``: each pair it emits holds the accumulator itself, and pairs emitted earlier
  (in the same batch, or kept by an operator downstream in the same task) would change.

Checkpoints are safe either way: a snapshot is encoded (or forked) before another record is
processed. What a function changed in place before it (or ``result``) raised stays when the
record is skipped (``on_error="skip"``); with "fail" the restart restores the checkpoint.
``StatefulMap``'s state is the same: change it in place only if ``out`` does not share it.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Callable

from .base import Operator, check_on_error, function_label, raised_in
from .keyed import KeyFn, Reduce

#: What users may build (PreAggregate and MergeFinal are the engine's: ``aggregate_final``
#: with ``merge`` makes them).
__all__ = ["Aggregate", "AggregateFinal", "FoldFinal", "StatefulMap"]

_NONE = object()


class Aggregate(Reduce):
    """Running aggregate per key (see the module docstring): ``create()`` makes a key's
    first accumulator, ``add(acc, record)`` the next, ``result(acc)`` what is emitted (None:
    the accumulator). ``key_fn`` gives a record's key (None: the record itself); ``on_error``
    ("fail" or "skip") applies to all three."""

    ROLE = "add"

    def __init__(self, create: Callable[[], Any], add: Callable[[Any, Any], Any],
                 result: Callable[[Any], Any] | None = None, key_fn: KeyFn = None, on_error: str = "fail"):
        super().__init__(add, key_fn, on_error)
        self.create = create
        self.result = result
        # The emitted pairs carry the accumulator itself only without ``result``: then they
        # are the values to track (incremental checkpoints); else the keys are tracked.
        self.TRACKS_VALUES = result is None

    def _step(self, state: dict[Any, Any], k: Any, rec: Any) -> Any:
        """The key's accumulator with ``rec`` added (``create()`` first for a new key);
        nothing is stored. A ``create`` that raises is named by ``_step_failed``."""
        acc = state.get(k, _NONE)
        return self.fn(self.create() if acc is _NONE else acc, rec)

    def _step_failed(self, state: dict[Any, Any], k: Any, rec: Any, e: Exception) -> None:
        # create() runs only for a new key, and add() after it: a new key's failure with an
        # exception raised in create's own frame names create.
        if k not in state and raised_in(e, self.create):
            self._failed(rec, e, "create", self.create)
        else:
            self._failed(rec, e)

    def process(self, batch: list[Any]) -> list[Any]:
        state, result, out = self.state, self.result, []
        keys, batch = self.keys_of(batch)
        for k, rec in zip(keys, batch):
            try:
                acc = self._step(state, k, rec)
            except Exception as e:
                self._step_failed(state, k, rec, e)
                continue
            if result is None:
                emitted = acc
            else:
                try:
                    emitted = result(acc)
                except Exception as e:
                    self._failed(rec, e, "result", result)
                    continue
            state[k] = acc
            out.append((k, emitted))
        if self.changed is not None and self.TRACKS_VALUES:
            self.changed.update(out)  # the last pair of a key is its accumulator
        return out


class AggregateFinal(Aggregate):
    """Aggregate per key for bounded input: ``(key, result(acc))`` once per key at the end;
    ``create``, ``add``, ``result``, ``key_fn`` and ``on_error`` as in Aggregate."""

    def __init__(self, create: Callable[[], Any], add: Callable[[Any, Any], Any],
                 result: Callable[[Any], Any] | None = None, key_fn: KeyFn = None, on_error: str = "fail"):
        super().__init__(create, add, result, key_fn, on_error)
        self.TRACKS_VALUES = False  # emits nothing per record: tracks the keys it touches

    def process(self, batch: list[Any]) -> list[Any]:
        state = self.state
        keys, batch = self.keys_of(batch)
        for k, rec in zip(keys, batch):
            try:
                acc = self._step(state, k, rec)
            except Exception as e:
                self._step_failed(state, k, rec, e)
                continue
            state[k] = acc
        return []

    def finish(self) -> list[Any]:
        result = self.result
        if result is None:
            return list(self.state.items())
        out = []
        for k, acc in self.state.items():
            try:
                out.append((k, result(acc)))
            except Exception as e:
                self._failed((k, acc), e, "result", result)
        return out


class PreAggregate(Operator):
    """One partial accumulator per key and batch: ``(key, partial)`` pairs, no state (see
    the module docstring)."""

    def __init__(self, create: Callable[[], Any], add: Callable[[Any, Any], Any], key_fn: KeyFn = None,
                 on_error: str = "fail"):
        self.create = create
        self.add = add
        self.key_fn = key_fn
        self.on_error = check_on_error(on_error)
        self.skipped = []

    def process(self, batch: list[Any]) -> list[Any]:
        create, add, key_fn = self.create, self.add, self.key_fn
        partials: dict[Any, Any] = {}
        for rec in batch:
            if key_fn is None:
                k = rec
            else:
                try:
                    k = key_fn(rec)
                except Exception as e:
                    self.record_failed(rec, function_label("key", key_fn), e, self.key_on_error)
                    continue
            acc = partials.get(k, _NONE)
            try:
                partials[k] = add(create() if acc is _NONE else acc, rec)
            except Exception as e:
                role, fn = ("create", create) if acc is _NONE and raised_in(e, create) else ("add", add)
                self.record_failed(rec, function_label(role, fn), e)
        return list(partials.items())


class MergeFinal(AggregateFinal):
    """The keyed half of pre-aggregation: ``acc = merge(acc, partial)`` for each ``(key,
    partial)`` record; ``(key, result(acc))`` once per key at the end."""

    def __init__(self, merge: Callable[[Any, Any], Any], result: Callable[[Any], Any] | None = None,
                 on_error: str = "fail"):
        super().__init__(_no_create, merge, result, itemgetter(0), on_error)

    ROLE = "merge"

    def _step(self, state: dict[Any, Any], k: Any, rec: Any) -> Any:
        acc = state.get(k, _NONE)
        return rec[1] if acc is _NONE else self.fn(acc, rec[1])


def _no_create() -> Any:  # MergeFinal starts from a key's first partial
    raise AssertionError("MergeFinal never creates an accumulator")



class FoldFinal(AggregateFinal):
    """Fold per key for bounded input: ``acc = fold(acc, record)`` from ``create()``, with
    ``fold`` as Aggregate's ``add``; ``(key, acc)`` once per key at the end; ``key_fn`` and
    ``on_error`` as in Aggregate."""

    def __init__(self, create: Callable[[], Any], fold: Callable[[Any, Any], Any], key_fn: KeyFn = None,
                 on_error: str = "fail"):
        super().__init__(create, fold, None, key_fn, on_error)


class StatefulMap(Reduce):
    """``state, out = fn(state, record)`` per key, ``fn`` the user's function; emits ``(key,
    out)`` (see the module docstring); ``key_fn`` and ``on_error`` as in Aggregate."""

    ROLE = "stateful_map"

    TRACKS_VALUES = False  # it may drop a key's state: tracks keys (a dropped key becomes a delete)

    def process(self, batch: list[Any]) -> list[Any]:
        state, fn, out = self.state, self.fn, []
        keys, batch = self.keys_of(batch)
        for k, rec in zip(keys, batch):
            try:
                result = fn(state.get(k), rec)
                if not isinstance(result, tuple) or len(result) != 2:
                    raise TypeError(f"a stateful_map function must return (state, output), got {result!r}")
                new, emitted = result
            except Exception as e:
                self._failed(rec, e)
                continue
            if new is None:
                state.pop(k, None)
            else:
                state[k] = new
            out.append((k, emitted))
        return out
