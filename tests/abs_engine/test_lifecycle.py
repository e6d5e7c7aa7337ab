"""The job lifecycle (abs_engine/lifecycle.py): the table refuses what it does not list, and
real jobs (in process) go through the states they should -- a clean run, and a crash
recovered from a checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from abs_engine import Dataflow
from abs_engine.lifecycle import IllegalTransition, Lifecycle, Phase
from abs_engine.testing import CapturingSink, GatedSource, TestingSource


def test_the_table_refuses_a_transition_it_does_not_list() -> None:
    lc = Lifecycle()
    with pytest.raises(IllegalTransition, match="from CREATED to RUNNING"):
        lc.to(Phase.RUNNING)
    for p in (Phase.SCHEDULING, Phase.RUNNING, Phase.STOPPING, Phase.FINISHED):
        lc.to(p)
    assert lc.ended
    with pytest.raises(IllegalTransition):
        lc.to(Phase.FAILED)  # it has ended
    assert lc.history == [Phase.CREATED, Phase.SCHEDULING, Phase.RUNNING, Phase.STOPPING, Phase.FINISHED]


def flow(tmp_path: Path, items: list, fn=None, hold: int | None = None) -> Dataflow:  # type: ignore[no-untyped-def,type-arg]
    f = Dataflow("phases", parallelism=1)
    source = TestingSource(items, batch_size=10)
    s = f.source(GatedSource(source, tmp_path / "gate", after=hold) if hold is not None else source, name="src")
    if fn is not None:
        s = s.map(fn, name="fn")
    s.key_by(lambda r: r % 3).count(name="count").sink(CapturingSink(tmp_path / "out"), name="sink")
    return f


def test_phases_of_a_clean_run_and_of_a_crash_recovered_from_a_checkpoint(tmp_path: Path) -> None:
    res = flow(tmp_path / "a", list(range(100))).run(executor="inprocess", checkpoint_dir=str(tmp_path / "a/ck"))
    assert res.phases == ["CREATED", "SCHEDULING", "RUNNING", "FINISHED"]

    gate = tmp_path / "b" / "gate"
    items = list(range(200)) + [TestingSource.ABORT] + list(range(200, 300))
    res = flow(tmp_path / "b", items, hold=100).run(
        executor="inprocess", checkpoint_dir=str(tmp_path / "b/ck"), checkpoint_interval=0.01, restart_delay=0,
        stop_when=lambda r: r.checkpoints_completed >= 1 and gate.touch())  # opens the gate; never stops
    assert res.phases == ["CREATED", "SCHEDULING", "RUNNING", "RECOVERING", "SCHEDULING", "RESTORING", "RUNNING",
                          "FINISHED"]
