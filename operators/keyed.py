"""Keyed stateful operators. Their input arrives hash-partitioned by the same key, so each
subtask owns a disjoint set of keys and its state is a plain dict key -> value.

Running variants emit ``(key, value)`` for every input record; ``*Final`` variants emit
``(key, value)`` once per key at end of input (bounded jobs).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

from .base import Operator

KeyFn = Callable[[Any], Any] | None


class _Keyed(Operator):
    def __init__(self, key_fn: KeyFn = None):
        self.key_fn = key_fn
        self.state: dict[Any, Any] = {}

    def keys_of(self, batch: list[Any]) -> list[Any]:
        return batch if self.key_fn is None else list(map(self.key_fn, batch))

    def snapshot(self, checkpoint_id: int) -> Any:
        # No copy: the task encodes the returned state before it processes another record.
        return self.state

    def restore(self, state: Any) -> None:
        self.state = dict(state)


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


class Reduce(_Keyed):
    """Running reduce per key: acc = fn(acc, record); emits (key, acc) for every record."""

    def __init__(self, fn: Callable[[Any, Any], Any], key_fn: KeyFn = None):
        super().__init__(key_fn)
        self.fn = fn

    def process(self, batch: list[Any]) -> list[Any]:
        state, fn, out = self.state, self.fn, []
        for k, rec in zip(self.keys_of(batch), batch):
            acc = fn(state[k], rec) if k in state else rec
            state[k] = acc
            out.append((k, acc))
        return out


class ReduceFinal(Reduce):
    """Reduce per key for bounded input: emits (key, acc) per key at end of input."""

    def process(self, batch: list[Any]) -> list[Any]:
        state, fn = self.state, self.fn
        for k, rec in zip(self.keys_of(batch), batch):
            state[k] = fn(state[k], rec) if k in state else rec
        return []

    def finish(self) -> list[Any]:
        return list(self.state.items())
