"""Keyed stateful operators. Their input arrives hash-partitioned by the same key, so each
subtask owns a disjoint set of keys and its state is a plain dict key -> value.

Running variants emit ``(key, value)`` for every input record; ``*Final`` variants emit
``(key, value)`` once per key at end of input (bounded jobs).

Incremental checkpoints (checkpoint/incremental.py): once the runtime calls
``track_changes``, every key a batch touches is added to ``changed`` (one C-level
``set.update`` per batch), and ``take_changes`` hands the set over at each snapshot. A key
in it whose value is unchanged costs a few bytes in the delta, never a wrong answer; a
key changed but missing from it would be lost, so every write to ``state`` must go
through a batch's keys.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

from .base import Operator, RecordError, check_on_error

KeyFn = Callable[[Any], Any] | None


class _Keyed(Operator):
    def __init__(self, key_fn: KeyFn = None):
        self.key_fn = key_fn
        self.state: dict[Any, Any] = {}
        self.changed: set[Any] | None = None  #: keys touched since take_changes (None: not tracked)

    def track_changes(self) -> None:
        self.changed = set()

    def untrack_changes(self) -> None:
        self.changed = None

    def take_changes(self) -> set[Any]:
        changed, self.changed = self.changed or set(), set()
        return changed

    def keys_of(self, batch: list[Any]) -> list[Any]:
        if self.key_fn is None:
            keys = batch
        else:
            keys = self._apply_key_fn(batch)
        if self.changed is not None:
            self.changed.update(keys)
        return keys

    def _apply_key_fn(self, batch: list[Any]) -> list[Any]:
        assert self.key_fn is not None
        try:
            return list(map(self.key_fn, batch))
        except Exception:
            key_fn = self.key_fn
            for record in batch:
                try:
                    key_fn(record)
                except Exception as e:
                    raise RecordError(record) from e
            raise

    def snapshot(self, checkpoint_id: int) -> Any:
        # No copy: the task encodes the returned state before it processes another record.
        return self.state

    def restore(self, state: Any) -> None:
        self.state = dict(state)
        if self.changed is not None:
            self.changed = set()

    def rescale_state(self, old: list[Any], index: int, parallelism: int, owns: Callable[[Any], bool]) -> Any:
        """The keys of every old subtask whose key group the new subtask owns (the old
        subtasks' keys are disjoint: each key lived where its key group was routed)."""
        mine: dict[Any, Any] = {}
        for state in old:
            if state:
                mine.update((k, v) for k, v in state.items() if owns(k))
        return mine


class Count(_Keyed):
    """Running count per key: emits (key, count so far) for every record."""

    def process(self, batch: list[Any]) -> list[Any]:
        state = self.state
        out = []
        for k in self.keys_of(batch):
            c = state.get(k, 0) + 1
            state[k] = c
            out.append((k, c))
        return out


class CountFinal(_Keyed):
    """Count per key for bounded input: emits (key, count) per key at end of input."""

    def __init__(self, key_fn: KeyFn = None):
        super().__init__(key_fn)
        self.state = Counter()

    def process(self, batch: list[Any]) -> list[Any]:
        self.state.update(self.keys_of(batch))  # Counter.update counts in C
        return []

    def finish(self) -> list[Any]:
        return list(self.state.items())

    def restore(self, state: Any) -> None:
        self.state = Counter(dict(state))
        if self.changed is not None:
            self.changed = set()


class Reduce(_Keyed):
    """Running reduce per key: acc = fn(acc, record); emits (key, acc) for every record.

    If ``fn`` raises, the state of that key is unchanged (provided ``fn`` does not mutate the
    accumulator in place before raising): with on_error="fail" (default) the task fails naming
    the record, with on_error="skip" the record is dropped and reported."""

    def __init__(self, fn: Callable[[Any, Any], Any], key_fn: KeyFn = None, on_error: str = "fail"):
        super().__init__(key_fn)
        self.fn = fn
        self.on_error = check_on_error(on_error)
        self.skipped: list[tuple[Any, BaseException]] = []

    def _failed(self, record: Any, e: Exception) -> None:
        if self.on_error == "skip":
            self.skipped.append((record, e))
            return
        raise RecordError(record) from e

    def process(self, batch: list[Any]) -> list[Any]:
        state, fn, out = self.state, self.fn, []
        for k, rec in zip(self.keys_of(batch), batch):
            try:
                acc = fn(state[k], rec) if k in state else rec
            except Exception as e:
                self._failed(rec, e)
                continue
            state[k] = acc
            out.append((k, acc))
        return out


class ReduceFinal(Reduce):
    """Reduce per key for bounded input: emits (key, acc) per key at end of input."""

    def process(self, batch: list[Any]) -> list[Any]:
        state, fn = self.state, self.fn
        for k, rec in zip(self.keys_of(batch), batch):
            try:
                state[k] = fn(state[k], rec) if k in state else rec
            except Exception as e:
                self._failed(rec, e)
        return []

    def finish(self) -> list[Any]:
        return list(self.state.items())
