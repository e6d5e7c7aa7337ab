"""Columnar operators: streams whose records are ``pyarrow.RecordBatch`` (docs/dataflows.md,
"Columnar batches").

A record batch is one record to the runtime: it is never split, so a barrier falls
between two batches and a restore replays whole batches from the source's offset, never
half of one. Between processes a batch travels as Arrow IPC (abs_engine/arrow_ipc.py).

- ``MapBatches(fn)``: ``fn(batch)`` -> a RecordBatch, a Table (its batches) or None (nothing).
- ``FilterBatches(fn)``: ``fn(batch)`` -> a boolean mask; the rows where it is true.
- ``Rows``: a batch's rows as tuples (``Stream.rows()``), to hand on to row operators.
- ``ToBatches(columns)``: an engine batch of tuples as one RecordBatch (``Stream.to_batches()``).
- ``PreAggregateBatches(by, aggregations)``: the pre-aggregation of a keyed aggregation,
  before the shuffle: each batch is grouped with ``pyarrow``'s hash aggregation and only one
  partial ``(key, accumulator)`` per distinct key of the batch leaves it. Stateless (nothing
  is held across batches, so a barrier sees it empty).
- ``MergeAggregates(kinds, final)``: the keyed side: merges the partials of a key
  (count and sum add, min and max keep the least and greatest; nulls are skipped as in
  SQL). Its state is the keyed map of operators/keyed.py: checkpointed incrementally,
  re-split by key group on a rescale.

A user function that raises on a batch follows the operators' rule (operators/base.py,
``Guarded``): on_error="fail" fails the task naming it, "skip" drops the whole batch and
reports it.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from abs_engine.arrow_ipc import is_record_batch

from .basic import _PerRecord
from .keyed import _Keyed

#: What the columnar operators import: preloaded by the fork server (operators/base.py).
PYARROW = ("pyarrow", "pyarrow.compute")

#: The aggregation functions a keyed batch aggregation takes, and how partials merge.
AGGREGATIONS = ("count", "sum", "min", "max")


def not_a_batch(role: str, record: Any) -> TypeError:
    return TypeError(f"{role} takes pyarrow.RecordBatch records, got {type(record).__name__}: put it after a "
                     "columnar source (ArrowTextSource, ParquetSource, SparkSource(batches=True)) or after "
                     "to_batches()")


def batches_of(result: Any, role: str) -> list[Any]:
    """What a batch function returned, as a list of non-empty RecordBatches."""
    if result is None:
        return []
    if is_record_batch(result):
        return [result] if result.num_rows else []
    t = type(result)
    if t.__name__ == "Table" and t.__module__.startswith("pyarrow"):
        return [b for b in result.to_batches() if b.num_rows]
    raise TypeError(f"a {role} function must return a pyarrow.RecordBatch, a pyarrow.Table or None, "
                    f"not {type(result).__name__}")


class _PerBatch(_PerRecord):
    """An operator on RecordBatch records, a batch at a time (``_one``); a batch its
    function raises on goes through ``_isolate`` (fail naming it, or skip it)."""

    preload = PYARROW

    def process(self, batch: list[Any]) -> list[Any]:
        out: list[Any] = []
        try:
            for b in batch:
                self._one(b, out)
            return out
        except Exception as e:
            first = e
        return self._isolate(batch, first)


class MapBatches(_PerBatch):
    ROLE = "map_batches"

    def _one(self, record: Any, out: list[Any]) -> None:
        if not is_record_batch(record):
            raise not_a_batch("map_batches", record)
        out.extend(batches_of(self.fn(record), self.ROLE))


class FilterBatches(_PerBatch):
    ROLE = "filter_batches"

    def _one(self, record: Any, out: list[Any]) -> None:
        if not is_record_batch(record):
            raise not_a_batch("filter_batches", record)
        kept = record.filter(self.fn(record))
        if kept.num_rows:
            out.append(kept)


class Rows(_PerRecord):
    """A batch's rows as tuples (one column: the values themselves, as ``SparkSource``'s
    ``column``), in order."""

    preload = PYARROW
    ROLE = "rows"

    def __init__(self) -> None:
        super().__init__(_rows)

    def _one(self, record: Any, out: list[Any]) -> None:
        out.extend(_rows(record))

    def process(self, batch: list[Any]) -> list[Any]:
        if len(batch) == 1:
            return _rows(batch[0])
        out: list[Any] = []
        for b in batch:
            out.extend(_rows(b))
        return out


def _rows(batch: Any) -> list[Any]:
    if not is_record_batch(batch):
        raise not_a_batch("rows()", batch)
    if batch.num_columns == 1:
        values: list[Any] = batch.column(0).to_pylist()
        return values
    return list(zip(*(c.to_pylist() for c in batch.columns)))


class ToBatches(_PerRecord):
    """The tuples of an engine batch as one RecordBatch with ``columns`` (a record that is
    not a tuple of that many values fails, naming it). Types are inferred by pyarrow unless
    ``schema`` (a pyarrow.Schema) is given."""

    preload = PYARROW
    ROLE = "to_batches"

    def __init__(self, columns: Sequence[str], schema: Any = None, on_error: str = "fail"):
        super().__init__(_rows, on_error)
        self.columns = list(columns)
        self.schema = schema

    def _check(self, record: Any) -> None:
        if not isinstance(record, tuple) or len(record) != len(self.columns):
            raise TypeError(f"to_batches({self.columns}) takes tuples of {len(self.columns)} values, "
                            f"got {record!r:.200}")

    def _build(self, records: list[Any]) -> Any:
        import pyarrow as pa

        for r in records:
            self._check(r)
        cols = [list(c) for c in zip(*records)] if records else [[] for _ in self.columns]
        if self.schema is not None:
            return pa.record_batch(cols, schema=self.schema)
        return pa.record_batch(cols, names=self.columns)

    def _one(self, record: Any, out: list[Any]) -> None:
        out.append(self._build([record]))

    def process(self, batch: list[Any]) -> list[Any]:
        if not batch:
            return []
        try:
            return [self._build(batch)]
        except Exception as e:
            first = e
        kept = self._isolate(batch, first)  # skip: one-row batches of the records that did not fail
        return [self._merge(kept)] if kept else []

    @staticmethod
    def _merge(batches: list[Any]) -> Any:
        import pyarrow as pa

        return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


class PreAggregateBatches(_PerBatch):
    """Per input batch: ``(key, accumulator)`` for each distinct key (``by``: one column,
    the key is its value; several, a tuple). The accumulator is the value of the one
    aggregation, or a tuple of them in order. Null keys form a group, as in SQL."""

    ROLE = "aggregate_batches"

    def __init__(self, by: Sequence[str], aggregations: Sequence[tuple[str, str]]):
        super().__init__(_rows)
        self.by = list(by)
        self.aggregations = [(c, f) for c, f in aggregations]
        # pyarrow's names for them: "count" counts the non-null values of a column ("count_all" rows).
        self._arrow = [([], "count_all") if c == "*" else (c, f) for c, f in self.aggregations]
        self._count_only = len(self.by) == 1 and self.aggregations == [("*", "count")]

    def _one(self, record: Any, out: list[Any]) -> None:
        out.extend(self._partials(record))

    def _partials(self, batch: Any) -> list[Any]:
        if not is_record_batch(batch):
            raise not_a_batch("aggregate_batches", batch)
        if not batch.num_rows:
            return []
        import pyarrow as pa
        import pyarrow.compute as pc

        if self._count_only:  # one key column, rows counted: the hash kernel alone
            vc = pc.value_counts(batch.column(self.by[0]))
            return list(zip(vc.field(0).to_pylist(), vc.field(1).to_pylist()))
        grouped = pa.Table.from_batches([batch]).group_by(self.by, use_threads=False).aggregate(self._arrow)
        n, m = len(self.by), len(self._arrow)
        # The keys come first (pyarrow 13+) or last (before): by their names.
        first = grouped.schema.names[:n] == self.by
        keys = [grouped.column(i if first else m + i).to_pylist() for i in range(n)]
        accs = [grouped.column(n + i if first else i).to_pylist() for i in range(m)]
        key_list = keys[0] if n == 1 else list(zip(*keys))
        values = accs[0] if len(accs) == 1 else list(zip(*accs))
        return list(zip(key_list, values))


def _merge_one(kind: str) -> Callable[[Any, Any], Any]:
    if kind in ("count", "sum"):
        return _add
    return _least if kind == "min" else _greatest


def _add(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else a + b


def _least(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else min(a, b)


def _greatest(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else max(a, b)


class MergeAggregates(_Keyed):
    """Merges ``(key, partial)`` pairs per key (see the module docstring). Running
    (``final=False``): emits ``(key, accumulator)`` for every partial, that is once per key
    per upstream batch; final: once per key at the end of the input."""

    def __init__(self, kinds: Sequence[str], final: bool):
        super().__init__(None)
        self.kinds = list(kinds)
        self.final = final
        self.TRACKS_VALUES = not final  # running: the emitted pairs are the values
        self._merges = [_merge_one(k) for k in self.kinds]
        #: one count: partials are never null, so the merge is a plain addition
        self._counting = self.kinds == ["count"]

    def _merge(self, a: Any, b: Any) -> Any:
        if len(self._merges) == 1:
            return self._merges[0](a, b)
        return tuple(m(x, y) for m, x, y in zip(self._merges, a, b))

    def process(self, batch: list[Any]) -> list[Any]:
        state = self.state
        if self._counting:
            get = state.get
            if self.final:
                for k, v in batch:
                    state[k] = get(k, 0) + v
            else:
                out = []
                for k, v in batch:
                    v = state[k] = get(k, 0) + v
                    out.append((k, v))
        else:
            merge = self._merge
            out = []
            for k, v in batch:
                if k in state:
                    v = merge(state[k], v)
                elif type(v) is list:
                    v = tuple(v)
                state[k] = v
                if not self.final:
                    out.append((k, v))
        changed = self.changed
        if changed is not None:
            if self.final:
                changed.update(k for k, _ in batch)
            else:
                changed.update(out)
        return [] if self.final else out

    def finish(self) -> list[Any]:
        return list(self.state.items()) if self.final else []

    def restore(self, state: Any) -> None:
        # Restored tuples come back as lists (msgpack arrays); merges and output use tuples.
        self.state = {k: tuple(v) if type(v) is list else v for k, v in dict(state).items()}
        if self.changed is not None:
            self.track_changes()
