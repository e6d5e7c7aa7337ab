"""The table-format sinks, DeltaSink and IcebergSink, against real tables on the local disk
(Iceberg: a SQL catalog on SQLite), read back with each format's own reader (deltalake,
pyiceberg scans), never with the sinks' code. Append and merge/upsert equal the batch oracle
after a restore in process, after SIGKILLs at random checkpoints and right before and after
a commit; a replayed epoch is skipped by what the commit recorded (Delta's application
transaction, Iceberg's snapshot summary); a fresh run is not mistaken for an old one; a
table without the schema's fields fails before the job starts."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest

from abs_engine import Dataflow
from abs_engine.testing import GatedSource, KillOnCheckpoints, TestingSource, fail_at
from operators.base import OperatorContext
from operators.delta import DeltaSink
from operators.epoch_sink import EpochSink, TableAheadError
from operators.iceberg import IcebergSink

from .sink_kills import KillAtStep, run_killing_drivers

pa = pytest.importorskip("pyarrow")
SCHEMA = pa.schema([("k", pa.string()), ("n", pa.int64()), ("label", pa.string())])
KINDS = ["delta", "iceberg"]

#: Real external systems (a server, a table format): the whole suite runs them, not the fast tier.
pytestmark = pytest.mark.slow


def catalog(tmp_path: Path) -> dict[str, str]:
    return {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/warehouse"}


def sink(kind: str, tmp_path: Path, merge: bool = False, cls: type | None = None, **kw: Any) -> EpochSink:
    if kind == "delta":
        pytest.importorskip("deltalake")
        from operators.delta import DeltaSink

        return (cls or DeltaSink)(str(tmp_path / "table"), SCHEMA, **({"mode": "merge", "key": ["k"]} if merge else {}),
                                  **kw)
    pytest.importorskip("pyiceberg")
    from operators.iceberg import IcebergSink

    return (cls or IcebergSink)(catalog(tmp_path), "shop.events", SCHEMA,
                                **({"mode": "upsert", "key": ["k"]} if merge else {}), **kw)


def rows_in(kind: str, tmp_path: Path) -> list[tuple[Any, ...]]:
    if kind == "delta":
        import deltalake

        t = deltalake.DeltaTable(str(tmp_path / "table")).to_pyarrow_table()
    else:
        from pyiceberg.catalog import load_catalog

        t = load_catalog("default", **catalog(tmp_path)).load_table("shop.events").scan().to_arrow()
    return list(zip(*(t.column(c).to_pylist() for c in ("k", "n", "label"))))


def events(n: int, keys: int = 50) -> list[tuple[str, int, str]]:
    return [(f"k{i % keys}", i, f"e{i}") for i in range(n)]


def flow_into(target: EpochSink, items: list[Any], *maps: Any, parallelism: int = 2, name: str = "tables",
              gate: Path | None = None, hold_after: int = 0) -> Dataflow:
    flow = Dataflow(name)
    source: Any = TestingSource(items, batch_size=200)
    if gate is not None:
        source = GatedSource(source, gate, after=hold_after)
    s = flow.source(source, "read", parallelism=parallelism)
    for fn in maps:
        s = s.map(fn)
    s.key_by(lambda r: r[0]).map(lambda r: r, "route", parallelism=2).sink(target, "table", parallelism=2)
    return flow


@pytest.mark.parametrize("kind", KINDS)
def test_append_with_a_crash_in_process_equals_the_oracle(tmp_path: Path, kind: str) -> None:
    items = events(4_000)
    res = flow_into(sink(kind, tmp_path), items, fail_at(1_500)).run(
        executor="inprocess", checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / "ck"))
    assert res.restarts == 1
    assert collections.Counter(rows_in(kind, tmp_path)) == collections.Counter(items)


@pytest.mark.parametrize("kind", KINDS)
def test_merge_keeps_the_last_row_of_each_key(tmp_path: Path, kind: str) -> None:
    items = events(3_000, keys=41)
    flow_into(sink(kind, tmp_path, merge=True), items, fail_at(1_000), parallelism=1).run(
        executor="inprocess", checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / "ck"))
    last = {k: (k, n, label) for k, n, label in items}
    assert sorted(rows_in(kind, tmp_path)) == sorted(last.values())


def ctx(attempt: int, restored: bool) -> OperatorContext:
    return OperatorContext("table", 0, 1, attempt, restored, job="j")


@pytest.mark.parametrize("kind", KINDS)
def test_a_replayed_epoch_is_skipped_and_a_fresh_run_is_not_an_old_one(tmp_path: Path, kind: str) -> None:
    first = sink(kind, tmp_path)
    first.check()
    first.open(ctx(0, False))
    first.process([("a", 1, "x")])
    state1 = first.snapshot(1)
    first.notify_checkpoint_complete(1)
    first.process([("b", 2, "y")])
    state2 = first.snapshot(2)
    first.notify_checkpoint_complete(2)  # committed; the worker dies before the next checkpoint
    again = sink(kind, tmp_path)
    again.open(ctx(1, True))
    again.restore(state2)  # both epochs are in the table already: nothing is written
    assert sorted(rows_in(kind, tmp_path)) == [("a", 1, "x"), ("b", 2, "y")]
    older = sink(kind, tmp_path)  # checkpoint 1, older than what the table holds: refused
    older.open(ctx(2, True))
    with pytest.raises(TableAheadError, match="newer than the checkpoint restored"):
        older.restore(state1)
    fresh = sink(kind, tmp_path)  # a run started afresh counts from checkpoint 1 again
    fresh.open(ctx(0, False))
    fresh.process([("c", 3, "z")])
    fresh.snapshot(1)
    fresh.notify_checkpoint_complete(1)
    assert sorted(rows_in(kind, tmp_path)) == [("a", 1, "x"), ("b", 2, "y"), ("c", 3, "z")]


@pytest.mark.parametrize("kind", KINDS)
def test_a_table_without_the_fields_fails_before_the_job_starts(tmp_path: Path, kind: str) -> None:
    other = pa.table({"k": ["a"], "price": [1.0]})
    target = sink(kind, tmp_path)
    if kind == "delta":
        import deltalake

        deltalake.write_deltalake(str(tmp_path / "table"), other)
    else:
        from pyiceberg.catalog import load_catalog

        c = load_catalog("default", **catalog(tmp_path))
        c.create_namespace("shop")
        c.create_table("shop.events", schema=other.schema)
    flow = Dataflow("bad")
    flow.source(TestingSource([("a", 1, "x")]), "read").sink(target, "table")
    with pytest.raises(Exception) as info:
        flow.run(executor="inprocess", checkpoint_dir=str(tmp_path / "ck"))
    err = info.value
    assert type(err).__name__.endswith("SinkError") and err.problem.name == "SCHEMA_MISMATCH"  # type: ignore[attr-defined]
    assert "['n', 'label']" in str(err) and getattr(err, "fatal", False)


@pytest.mark.parametrize("kind", KINDS)
def test_a_record_that_is_not_a_row_fails_naming_it(tmp_path: Path, kind: str) -> None:
    flow = Dataflow("bad-row")
    flow.source(TestingSource([("a", 1, "x"), ("b", 2)]), "read").sink(sink(kind, tmp_path), "table")
    with pytest.raises(Exception, match=r"\('b', 2\)"):
        flow.run(executor="inprocess", checkpoint_dir=str(tmp_path / "ck"))


class KillingDeltaSink(KillAtStep, DeltaSink):
    pass


class KillingIcebergSink(KillAtStep, IcebergSink):
    pass


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("step", ["before", "after"])
def test_a_sigkill_before_and_after_a_commit_loses_and_duplicates_nothing(tmp_path: Path, kind: str,
                                                                          step: str) -> None:
    gate = tmp_path / "gate"
    items = events(10_000)
    sink(kind, tmp_path)  # (skips if the format's library is missing)
    cls = KillingDeltaSink if kind == "delta" else KillingIcebergSink
    target = sink(kind, tmp_path, cls=cls, step=step, gate=str(gate))
    res = flow_into(target, items, name=f"step-{step}", gate=gate, hold_after=2_000).run(
        checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / "ck"))
    assert res.restarts >= 1 and gate.exists()
    assert collections.Counter(rows_in(kind, tmp_path)) == collections.Counter(items)


# (each format's commit path is killed before and after above; here one append and one merge job)
@pytest.mark.parametrize("kind,merge", [("delta", False), ("iceberg", True)])
def test_sigkills_of_workers_leave_the_table_equal_to_the_oracle(tmp_path: Path, kind: str, merge: bool) -> None:
    gate = tmp_path / "gate"
    items = events(20_000, keys=300)
    chaos = KillOnCheckpoints([2, 5], seed=5, open_gate=gate)
    # (merge: one source subtask, so that a key's rows reach its sink subtask in the list's order)
    res = flow_into(sink(kind, tmp_path, merge=merge), items, name="kills", gate=gate, hold_after=3_000,
                    parallelism=1 if merge else 2).run(
        checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / "ck"), chaos=chaos)
    assert len(chaos.killed) == 2 and res.restarts == 2
    if merge:
        last = {k: (k, n, label) for k, n, label in items}
        assert sorted(rows_in(kind, tmp_path)) == sorted(last.values())
    else:
        assert collections.Counter(rows_in(kind, tmp_path)) == collections.Counter(items)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", KINDS)
def test_sigkills_of_the_supervised_driver_leave_the_table_equal_to_the_oracle(tmp_path: Path, kind: str) -> None:
    """The driver SIGKILLed twice, each time once a newer checkpoint completed (the source
    held by its gate meanwhile); its workers go with it and a new driver resumes. The table,
    read by the format's own reader, equals the input."""
    gate, ck = tmp_path / "gate", str(tmp_path / "ck")
    items = events(20_000)
    flow = flow_into(sink(kind, tmp_path), items, name="driver", gate=gate, hold_after=3_000)
    run_killing_drivers(flow, ck, gate)
    assert collections.Counter(rows_in(kind, tmp_path)) == collections.Counter(items)


@pytest.mark.parametrize("kind", KINDS)
def test_record_batches_are_held_and_written_whole(tmp_path: Path, kind: str) -> None:
    """The columnar path: RecordBatch records are kept as Arrow in the checkpoint and
    written as they are (with a crash and a restore between), extra columns left out."""
    items = events(6_000)
    batches = [pa.RecordBatch.from_pylist([{"k": k, "n": n, "label": label, "extra": 1.5}
                                           for k, n, label in items[i:i + 500]]) for i in range(0, 6_000, 500)]
    flow = Dataflow("batches")
    (flow.source(TestingSource(batches, batch_size=1), "read", parallelism=2).map(fail_at(5), "crash")
     .sink(sink(kind, tmp_path), "table", parallelism=2))
    res = flow.run(executor="inprocess", checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / "ck"))
    assert res.restarts == 1
    assert collections.Counter(rows_in(kind, tmp_path)) == collections.Counter(items)


@pytest.mark.parametrize("kind", KINDS)
def test_a_batch_without_the_schemas_fields_fails_naming_them(tmp_path: Path, kind: str) -> None:
    flow = Dataflow("bad-batch")
    flow.source(TestingSource([pa.RecordBatch.from_pylist([{"k": "a", "n": 1}])]), "read").sink(
        sink(kind, tmp_path), "table")
    with pytest.raises(Exception, match=r"without the column\(s\) \['label'\]"):
        flow.run(executor="inprocess", checkpoint_dir=str(tmp_path / "ck"))


def test_a_delta_merge_key_may_be_any_column_name(tmp_path: Path) -> None:
    pytest.importorskip("deltalake")
    from operators.delta import DeltaSink

    schema = pa.schema([("user-id", pa.string()), ("total n", pa.int64())])
    items = [(f"u{i % 7}", i) for i in range(100)]
    flow = Dataflow("quoted")
    flow.source(TestingSource(items), "read").sink(
        DeltaSink(str(tmp_path / "t"), schema, mode="merge", key=["user-id"]), "table")
    flow.run(executor="inprocess", checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / "ck"))
    import deltalake

    t = deltalake.DeltaTable(str(tmp_path / "t")).to_pyarrow_table()
    got = sorted(zip(t.column("user-id").to_pylist(), t.column("total n").to_pylist()))
    assert got == sorted({k: (k, n) for k, n in items}.values())
