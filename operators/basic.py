"""Stateless batch operators: map, flat_map, filter, identity (used for union).

The fast path applies the user's function to a whole batch in one expression. If it
raises, the batch is re-run one record at a time (these operators are stateless, so that
is safe) to find the record: with ``on_error="fail"`` (the default) a RecordError naming it
fails the task; with ``on_error="skip"`` failing records are dropped and reported, the rest
go on. A function that does not raise again on its own (not deterministic) fails as it did.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from .base import Operator, check_on_error, function_label


class _PerRecord(Operator):
    ROLE = ""  #: how a failure names the function ("map function 'parse'")

    def __init__(self, fn: Callable[[Any], Any], on_error: str = "fail"):
        self.fn = fn
        self.on_error = check_on_error(on_error)
        self.skipped = []

    def _one(self, record: Any, out: list[Any]) -> None:
        raise NotImplementedError

    def _isolate(self, batch: list[Any], first: BaseException) -> list[Any]:
        out: list[Any] = []
        label = function_label(self.ROLE, self.fn)
        for record in batch:
            try:
                self._one(record, out)  # appends only once the record succeeded
            except Exception as e:
                self.record_failed(record, label, e)  # raises, or (skip) notes it: dropped
        if self.on_error == "fail":
            raise first  # it did not fail on any single record: not reproducible
        return out


class Map(_PerRecord):
    """``fn(record)`` for every record (``Stream.map``). ``on_error``: "fail" (the default)
    fails the task naming a record ``fn`` raises on, "skip" drops and reports it; any other
    value is a ValueError."""

    ROLE = "map"

    def _one(self, record: Any, out: list[Any]) -> None:
        out.append(self.fn(record))

    def process(self, batch: list[Any]) -> list[Any]:
        try:
            return list(map(self.fn, batch))
        except Exception as e:
            first = e
        return self._isolate(batch, first)  # (outside the handler: the failure's traceback shows it once)


class FlatMap(_PerRecord):
    """Every record ``fn(record)`` yields, all of a record's or none (``Stream.flat_map``);
    ``on_error`` as in Map."""

    ROLE = "flat_map"

    def __init__(self, fn: Callable[[Any], Iterable[Any]], on_error: str = "fail"):
        super().__init__(fn, on_error)

    def _one(self, record: Any, out: list[Any]) -> None:
        out.extend(list(self.fn(record)))  # all or nothing: a generator may raise halfway

    def process(self, batch: list[Any]) -> list[Any]:
        fn = self.fn
        try:
            return [out for rec in batch for out in fn(rec)]
        except Exception as e:
            first = e
        return self._isolate(batch, first)


class Filter(_PerRecord):
    """The records for which ``fn(record)`` is true (``Stream.filter``); ``on_error`` as in Map."""

    ROLE = "filter"

    def __init__(self, fn: Callable[[Any], bool], on_error: str = "fail"):
        super().__init__(fn, on_error)

    def _one(self, record: Any, out: list[Any]) -> None:
        if self.fn(record):
            out.append(record)

    def process(self, batch: list[Any]) -> list[Any]:
        try:
            return list(filter(self.fn, batch))
        except Exception as e:
            first = e
        return self._isolate(batch, first)


class Identity(Operator):
    """Passes records through; the operator behind ``union``."""

    def process(self, batch: list[Any]) -> list[Any]:
        return batch
