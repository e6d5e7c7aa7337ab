"""Columnar operators (operators/arrow.py): each against a plain Python computation of the
same thing, and a vectorized keyed aggregation exact across a crash and restore (in
process; the SIGKILL test is in tests/operators/test_arrow_sources.py)."""

from __future__ import annotations

import collections
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from abs_engine import Dataflow
from abs_engine.errors import GraphError, JobFailed
from abs_engine.testing import CapturingSink, GatedSource, TestingSource
from operators.arrow import FilterBatches, MapBatches, MergeAggregates, PreAggregateBatches, Rows, ToBatches
from operators.base import OperatorContext, RecordError


def opened(op: Any) -> Any:
    op.open(OperatorContext("op", 0, 1, 0, False))
    return op


def events(n: int, seed: int = 1) -> list[tuple[Any, Any, Any]]:
    """(user, item, price) with null users and prices among them."""
    rng = random.Random(seed)
    return [(None if rng.random() < 0.02 else f"u{rng.randrange(40)}", rng.randrange(5),
             None if rng.random() < 0.05 else rng.randrange(-50, 1000)) for _ in range(n)]


def batch_of(rows: list[tuple[Any, Any, Any]]) -> pa.RecordBatch:
    users, items, prices = zip(*rows)
    return pa.record_batch({"user": pa.array(users, pa.string()), "item": pa.array(items, pa.int64()),
                            "price": pa.array(prices, pa.int64())})


def oracle(rows: list[tuple[Any, Any, Any]]) -> dict[Any, tuple[Any, ...]]:
    """Per (user, item): count(*), sum, min, max of non-null prices (None if none), count(price)."""
    groups: dict[Any, list[Any]] = collections.defaultdict(list)
    for u, i, p in rows:
        groups[(u, i)].append(p)
    out = {}
    for k, ps in groups.items():
        vals = [p for p in ps if p is not None]
        out[k] = (len(ps), sum(vals) if vals else None, min(vals, default=None), max(vals, default=None), len(vals))
    return out


AGGS = [("*", "count"), ("price", "sum"), ("price", "min"), ("price", "max"), ("price", "count")]


def test_pre_aggregation_then_merge_equals_the_plain_computation_with_nulls() -> None:
    rows = events(3_000)
    pre = opened(PreAggregateBatches(["user", "item"], AGGS))
    merge = opened(MergeAggregates([f for _, f in AGGS], final=True))
    for part in range(0, len(rows), 700):  # several batches: partials of one key merge
        merge.process(pre.process([batch_of(rows[part:part + 700])]))
    assert dict(merge.finish()) == oracle(rows)


def test_a_count_by_one_column_takes_the_value_counts_path_and_counts_null_keys() -> None:
    b = pa.record_batch({"w": ["a", "b", None, "a", None]})
    pre = opened(PreAggregateBatches(["w"], [("*", "count")]))
    assert sorted(pre.process([b]), key=repr) == sorted([("a", 2), ("b", 1), (None, 2)], key=repr)


def test_the_running_merge_emits_each_keys_new_value_per_batch_and_tracks_it() -> None:
    merge = opened(MergeAggregates(["count"], final=False))
    merge.track_changes()
    assert merge.process([("a", 2), ("b", 1)]) == [("a", 2), ("b", 1)]
    assert merge.process([("a", 3)]) == [("a", 5)]
    assert merge.take_changes() == {"a": 5, "b": 1}
    assert merge.finish() == []


def test_a_restored_merge_state_of_lists_merges_as_tuples() -> None:
    merge = opened(MergeAggregates(["sum", "max"], final=True))
    merge.restore({"k": [3, 7]})  # (what msgpack gives back)
    merge.process([("k", (None, 9)), ("j", (1, None))])
    assert dict(merge.finish()) == {"k": (3, 9), "j": (1, None)}


def test_map_batches_takes_batches_tables_and_none() -> None:
    b = pa.record_batch({"x": [1, 2, 3]})
    out = opened(MapBatches(lambda r: pa.table({"y": pc.multiply(r.column("x"), 2)}))).process([b, b])
    assert [o.column("y").to_pylist() for o in out] == [[2, 4, 6], [2, 4, 6]]
    assert opened(MapBatches(lambda r: None)).process([b]) == []
    assert opened(MapBatches(lambda r: r.slice(0, 0))).process([b]) == []  # empty: nothing


def test_map_batches_on_rows_names_the_fix() -> None:
    with pytest.raises(RecordError) as info:
        opened(MapBatches(lambda r: r)).process([1])
    assert "pyarrow.RecordBatch" in str(info.value.__cause__) and "to_batches()" in str(info.value.__cause__)


def test_a_batch_function_returning_rows_is_named() -> None:
    with pytest.raises(RecordError) as info:
        opened(MapBatches(lambda r: r.to_pylist())).process([pa.record_batch({"x": [1]})])
    assert "must return a pyarrow.RecordBatch" in str(info.value.__cause__)


def test_skip_drops_the_failing_batch_and_keeps_the_others() -> None:
    good, bad = pa.record_batch({"x": [1, 2]}), pa.record_batch({"x": [0]})
    op = opened(MapBatches(lambda r: pa.record_batch({"y": [10 // v for v in r.column("x").to_pylist()]}),
                           on_error="skip"))
    out = op.process([good, bad, good])
    assert [o.column("y").to_pylist() for o in out] == [[10, 5], [10, 5]]
    assert [r.equals(bad) for r, _ in op.take_skipped()] == [True]


def test_filter_rows_and_to_batches_round_trip() -> None:
    b = pa.record_batch({"k": ["a", "b", "c", "d"], "v": [1, 5, 2, 8]})
    kept = opened(FilterBatches(lambda r: pc.greater(r.column("v"), 1))).process([b])
    rows = opened(Rows()).process(kept)
    assert rows == [("b", 5), ("c", 2), ("d", 8)]
    again = opened(ToBatches(["k", "v"])).process(rows)
    assert len(again) == 1 and again[0].to_pylist() == [{"k": "b", "v": 5}, {"k": "c", "v": 2}, {"k": "d", "v": 8}]
    assert opened(Rows()).process([pa.record_batch({"only": [1, 2]})]) == [1, 2]  # one column: its values


def test_to_batches_names_a_record_that_does_not_fit_or_skips_it() -> None:
    with pytest.raises(RecordError) as info:
        opened(ToBatches(["k", "v"])).process([("a", 1), ("b",)])
    assert info.value.record == ("b",)
    op = opened(ToBatches(["k", "v"], on_error="skip"))
    (b,) = op.process([("a", 1), ("b",), ("c", 3)])
    assert b.to_pylist() == [{"k": "a", "v": 1}, {"k": "c", "v": 3}] and len(op.take_skipped()) == 1


@pytest.mark.parametrize("aggs", [[("price", "avg")], [("*", "sum")], [("price",)]])
def test_a_bad_aggregation_is_a_graph_error_naming_the_choices(aggs: Any) -> None:
    flow = Dataflow("bad")
    with pytest.raises(GraphError, match="count, sum, min, max"):
        flow.source(TestingSource([batch_of(events(5))])).aggregate_batches("user", aggs)


def test_the_plan_shows_the_pre_aggregation_chained_before_the_shuffle() -> None:
    flow = Dataflow("plan", parallelism=2)
    flow.source(TestingSource([batch_of(events(5))]), name="src").aggregate_batches(
        ["user", "item"], [("price", "sum")], name="agg").sink(CapturingSink("/tmp/unused-out"), name="sink")
    text = flow.explain()
    assert "src [TestingSource] -> agg_pre [pre_aggregate_batches(by=user, item, sum(price))]" in text
    assert "agg_pre -> agg  [hash]" in text


def job(tmp_path: Path, batches: list[Any], final: bool, hold: int) -> tuple[Any, list[Any]]:
    gate = tmp_path / "gate"
    flow = Dataflow("columnar", parallelism=2)
    src = GatedSource(TestingSource(batches, batch_size=1), gate, after=hold)
    flow.source(src, name="src").filter_batches(lambda b: pc.is_valid(b.column("user")), name="known").aggregate_batches(
        ["user", "item"], AGGS, final=final, name="agg").sink(CapturingSink(tmp_path / "out"), name="sink",
                                                               parallelism=1)
    res = flow.run(executor="inprocess", checkpoint_dir=str(tmp_path / "ck"), checkpoint_interval=0.01,
                   restart_delay=0, stop_when=lambda r: r.checkpoints_completed >= 1 and gate.touch())
    return res, [(tuple(k), tuple(v)) for k, v in CapturingSink(tmp_path / "out").records()]


@pytest.mark.parametrize("final", [True, False])
def test_a_crash_restores_the_vectorized_aggregation_exactly_once(tmp_path: Path, final: bool) -> None:
    rows = events(6_000, seed=4)
    parts = [batch_of(rows[i:i + 200]) for i in range(0, len(rows), 200)]
    with_abort = parts[:20] + [TestingSource.ABORT] + parts[20:]
    res, out = job(tmp_path, with_abort, final, hold=5)
    assert res.restarts == 1 and res.restored_from and res.restored_from[0] >= 1
    expected = {k: v for k, v in oracle(rows).items() if k[0] is not None}
    if final:
        assert collections.Counter(out) == collections.Counter(expected.items())
    else:  # running: every key's last emitted value is its total, and no value is emitted twice
        last: dict[Any, Any] = {}
        for k, v in out:
            last[k] = v
        assert last == expected
        assert len(out) == len(set(out))  # (count(*) grows with every emission)


def test_a_row_stream_into_a_batch_operator_fails_the_job_naming_it(tmp_path: Path) -> None:
    flow = Dataflow("rows", parallelism=1)
    flow.source(TestingSource([1, 2, 3]), name="src").map_batches(lambda b: b, name="vec").sink(
        CapturingSink(tmp_path / "o"), name="sink")
    with pytest.raises(JobFailed) as info:
        flow.run(executor="inprocess", restart_attempts=0)
    assert info.value.operator == "vec" and "pyarrow.RecordBatch" in str(info.value)
