"""Stateless batch operators: map, flat_map, filter, identity (used for union)."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from .base import Operator


class Map(Operator):
    def __init__(self, fn: Callable[[Any], Any]):
        self.fn = fn

    def process(self, batch: list[Any]) -> list[Any]:
        return list(map(self.fn, batch))


class FlatMap(Operator):
    def __init__(self, fn: Callable[[Any], Iterable[Any]]):
        self.fn = fn

    def process(self, batch: list[Any]) -> list[Any]:
        fn = self.fn
        return [out for rec in batch for out in fn(rec)]


class Filter(Operator):
    def __init__(self, fn: Callable[[Any], bool]):
        self.fn = fn

    def process(self, batch: list[Any]) -> list[Any]:
        return list(filter(self.fn, batch))


class Identity(Operator):
    """Passes records through; the operator behind ``union``."""

    def process(self, batch: list[Any]) -> list[Any]:
        return batch
