"""The worked example of connectors of your own (examples/custom_connectors.py,
docs/writing-connectors.md): its SQLite table equals the batch computation in process, and
under SIGKILLs of workers at checkpoints (the source held by a gate until the kills are
done, so the job cannot end first); a missing input fails before the job starts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from abs_engine import Dataflow
from abs_engine.errors import InputError
from abs_engine.testing import GatedSource, KillOnCheckpoints
from examples import custom_connectors as ex


def test_in_process_the_table_equals_the_batch_computation(tmp_path: Path) -> None:
    orders, db = str(tmp_path / "orders.jsonl"), str(tmp_path / "totals.db")
    ex.write_orders(orders, 20_000)
    ex.build_flow(orders, db).run(executor="inprocess", checkpoint_dir=str(tmp_path / "ck"), checkpoint_interval=0.01)
    assert ex.table(db) == ex.oracle(orders) and sum(ex.table(db).values()) == 20_000


def test_a_missing_input_fails_before_the_job_starts(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        ex.build_flow(str(tmp_path / "nope.jsonl"), str(tmp_path / "t.db")).run(executor="inprocess")


@pytest.mark.slow
def test_sigkills_at_checkpoints_leave_the_table_equal_to_the_batch_computation(tmp_path: Path) -> None:
    orders, db, gate = str(tmp_path / "orders.jsonl"), str(tmp_path / "totals.db"), tmp_path / "gate"
    ex.write_orders(orders, 60_000)
    flow = Dataflow("custom-connectors", parallelism=2)
    (flow.source(GatedSource(ex.JsonLinesSource(orders), gate, after=20_000), "orders", parallelism=1)
     .map(lambda o: (o["customer"], o["amount"]), "amounts", parallelism=1)
     .key_by(lambda ca: ca[0]).reduce(ex.add, "totals").map(lambda kv: kv[1], "rows")
     .sink(ex.SqliteSink(db), "sqlite"))
    chaos = KillOnCheckpoints([2, 4], seed=4, open_gate=gate)
    res = flow.run(checkpoint_dir=str(tmp_path / "ck"), checkpoint_interval=0.05, chaos=chaos)
    assert len(chaos.killed) == 2 and res.restarts == 2
    assert ex.table(db) == ex.oracle(orders)


@pytest.mark.slow
def test_the_script_says_the_table_is_exact(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ex.main(["--orders", "20000", "--kills", "0", "--dir", str(tmp_path)]) == 0
    assert "the table equals the batch computation" in capsys.readouterr().out
    assert os.path.exists(tmp_path / "totals.db")
