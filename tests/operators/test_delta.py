"""DeltaSink against real Delta tables on the local disk, read back with deltalake's own
reader (never the sink's code): append and merge equal the batch oracle after a restore in
process, after SIGKILLs at random checkpoints and before and after a commit; a replayed
epoch is skipped by its application transaction; a fresh run is not mistaken for an old
one; a table without the schema's fields fails before the job starts."""

from __future__ import annotations

import collections
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from abs_engine import Dataflow
from abs_engine.testing import GatedSource, KillOnCheckpoints, TestingSource, fail_at
from operators.base import OperatorContext

deltalake = pytest.importorskip("deltalake")
pa = pytest.importorskip("pyarrow")

from operators.delta import DeltaProblem, DeltaSink, DeltaSinkError  # noqa: E402

SCHEMA = pa.schema([("k", pa.string()), ("n", pa.int64()), ("label", pa.string())])


def events(n: int, keys: int = 50) -> list[tuple[str, int, str]]:
    return [(f"k{i % keys}", i, f"e{i}") for i in range(n)]


def rows_in(uri: str) -> list[tuple[Any, ...]]:
    t = deltalake.DeltaTable(uri).to_pyarrow_table()
    return list(zip(*(t.column(c).to_pylist() for c in ("k", "n", "label"))))


def flow_into(sink: DeltaSink, items: list[Any], *maps: Any, parallelism: int = 2, name: str = "delta",
              gate: Path | None = None, hold_after: int = 0) -> Dataflow:
    flow = Dataflow(name)
    source: Any = TestingSource(items, batch_size=200)
    if gate is not None:
        source = GatedSource(source, gate, after=hold_after)
    s = flow.source(source, "read", parallelism=parallelism)
    for fn in maps:
        s = s.map(fn)
    s.key_by(lambda r: r[0]).map(lambda r: r, "route", parallelism=2).sink(sink, "delta", parallelism=2)
    return flow


def test_append_with_a_crash_in_process_equals_the_oracle(tmp_path: Path) -> None:
    uri = str(tmp_path / "table")
    items = events(4_000)
    res = flow_into(DeltaSink(uri, SCHEMA), items, fail_at(1_500)).run(
        executor="inprocess", checkpoint_interval=0.01, checkpoint_dir=str(tmp_path / "ck"))
    assert res.restarts == 1
    assert collections.Counter(rows_in(uri)) == collections.Counter(items)
    # one commit per subtask and checkpoint that had rows, each with its transaction version
    history = deltalake.DeltaTable(uri).history()
    assert all(h["operation"] in ("WRITE", "CREATE TABLE") for h in history)


def test_merge_keeps_the_last_row_of_each_key(tmp_path: Path) -> None:
    uri = str(tmp_path / "table")
    items = events(3_000, keys=41)
    sink = DeltaSink(uri, SCHEMA, mode="merge", key=["k"])
    flow_into(sink, items, fail_at(1_000), parallelism=1).run(
        executor="inprocess", checkpoint_interval=0.01, checkpoint_dir=str(tmp_path / "ck"))
    last = {k: (k, n, label) for k, n, label in items}
    assert sorted(rows_in(uri)) == sorted(last.values())


def ctx(attempt: int, restored: bool) -> OperatorContext:
    return OperatorContext("delta", 0, 1, attempt, restored, job="j")


def test_a_replayed_epoch_is_skipped_and_a_fresh_run_is_not_an_old_one(tmp_path: Path) -> None:
    uri = str(tmp_path / "table")
    first = DeltaSink(uri, SCHEMA)
    first.check()
    first.open(ctx(0, False))
    first.process([("a", 1, "x")])
    state1 = first.snapshot(1)
    first.notify_checkpoint_complete(1)
    first.process([("b", 2, "y")])
    state2 = first.snapshot(2)
    first.notify_checkpoint_complete(2)  # committed; the worker dies before the next checkpoint
    again = DeltaSink(uri, SCHEMA)
    again.open(ctx(1, True))
    again.restore(state2)  # both epochs are in the table already: nothing is written
    again.restore(state1)
    assert sorted(rows_in(uri)) == [("a", 1, "x"), ("b", 2, "y")]
    # a run started afresh counts its checkpoints from 1 again: its epochs are written
    fresh = DeltaSink(uri, SCHEMA)
    fresh.open(ctx(0, False))
    fresh.process([("c", 3, "z")])
    fresh.snapshot(1)
    fresh.notify_checkpoint_complete(1)
    assert sorted(rows_in(uri)) == [("a", 1, "x"), ("b", 2, "y"), ("c", 3, "z")]


def test_a_table_without_the_fields_fails_before_the_job_starts(tmp_path: Path) -> None:
    uri = str(tmp_path / "table")
    deltalake.write_deltalake(uri, pa.table({"k": ["a"], "price": [1.0]}))
    flow = Dataflow("bad")
    flow.source(TestingSource([("a", 1, "x")]), "read").sink(DeltaSink(uri, SCHEMA), "delta")
    with pytest.raises(DeltaSinkError) as info:
        flow.run(executor="inprocess", checkpoint_dir=str(tmp_path / "ck"))
    assert info.value.problem is DeltaProblem.SCHEMA_MISMATCH and "['n', 'label']" in str(info.value)


def test_a_record_that_is_not_a_row_fails_naming_it(tmp_path: Path) -> None:
    flow = Dataflow("bad-row")
    flow.source(TestingSource([("a", 1, "x"), ("b", 2)]), "read").sink(DeltaSink(str(tmp_path / "t"), SCHEMA),
                                                                     "delta")
    with pytest.raises(Exception, match=r"\('b', 2\)"):
        flow.run(executor="inprocess", checkpoint_dir=str(tmp_path / "ck"))


class KillAtStep(DeltaSink):
    """SIGKILLs its worker at ``step`` of its first commit in the first attempt; the next
    attempt opens ``gate``, which holds the source until then."""

    def __init__(self, *args: Any, step: str, gate: str, **kw: Any):
        super().__init__(*args, **kw)
        self.kill_step, self.gate = step, gate

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        if ctx.attempt > 0:
            Path(self.gate).touch()

    def _step(self, step: str) -> None:
        if step == self.kill_step and self.ctx.attempt == 0:
            os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.parametrize("step", ["before", "after"])
def test_a_sigkill_before_and_after_a_commit_loses_and_duplicates_nothing(tmp_path: Path, step: str) -> None:
    uri, gate = str(tmp_path / "table"), tmp_path / "gate"
    items = events(10_000)
    sink = KillAtStep(uri, SCHEMA, step=step, gate=str(gate))
    res = flow_into(sink, items, name=f"step-{step}", gate=gate, hold_after=2_000).run(
        checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / "ck"))
    assert res.restarts >= 1 and gate.exists()
    assert collections.Counter(rows_in(uri)) == collections.Counter(items)


class KillThenOpen(KillOnCheckpoints):
    def __init__(self, after: list[int], gate: Path, seed: int):
        super().__init__(after, seed)
        self.gate = gate

    def on_checkpoint(self, checkpoint_id: int, pids: dict[str, int]) -> str | None:
        killed = super().on_checkpoint(checkpoint_id, pids)
        if len(self.killed) == len(self.after):
            self.gate.touch()
        return killed


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["append", "merge"])
def test_sigkills_of_workers_leave_the_table_equal_to_the_oracle(tmp_path: Path, mode: str) -> None:
    uri, gate = str(tmp_path / "table"), tmp_path / "gate"
    items = events(20_000, keys=300)
    kw: dict[str, Any] = {"mode": "merge", "key": ["k"]} if mode == "merge" else {}
    chaos = KillThenOpen([2, 5], gate, seed=5)
    res = flow_into(DeltaSink(uri, SCHEMA, **kw), items, name="kills", gate=gate, hold_after=3_000,
                    parallelism=1 if mode == "merge" else 2).run(
        checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / "ck"), chaos=chaos)
    assert len(chaos.killed) == 2 and res.restarts == 2
    if mode == "merge":
        last = {k: (k, n, label) for k, n, label in items}
        assert sorted(rows_in(uri)) == sorted(last.values())
    else:
        assert collections.Counter(rows_in(uri)) == collections.Counter(items)
