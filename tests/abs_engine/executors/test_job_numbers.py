"""The numbers a run reports: records the sources read per attempt and in all, workers
lost, a resumed run credited only with its own work."""

from __future__ import annotations

from typing import Any

import pytest

from abs_engine import Dataflow
from abs_engine.testing import CapturingSink, GatedSource, KillOnCheckpoints, TestingSource
from tests.chaos_checks import assert_each_kill_restored

pytestmark = pytest.mark.slow

N = 400_000


def flow(sink: CapturingSink, parallelism: int = 2, gate: Any = None) -> Dataflow:
    """``gate``: each source subtask holds halfway until the file exists."""
    f = Dataflow("numbers", parallelism=parallelism)
    source: Any = TestingSource(range(N), batch_size=200)
    if gate is not None:
        source = GatedSource(source, gate, after=N // parallelism // 2)
    f.source(source, name="nums").key_by(lambda x: x % 100).count_final(
        name="count").sink(sink, name="sink", parallelism=1)
    return f


def test_counts_add_up_over_attempts_and_never_go_back(tmp_path):
    gate = tmp_path / "gate"  # held until both kills fell: they fall while the job runs, at any speed
    chaos = KillOnCheckpoints([2, 4], seed=3, open_gate=gate)
    res = flow(CapturingSink(tmp_path / "o"), gate=gate).run(checkpoint_interval=0.02, chaos=chaos, restart_delay=0)
    assert_each_kill_restored(res, chaos, min_kills=len(chaos.after))  # (all mid-job: held)
    assert res.kills >= 1 and res.restarts == res.kills
    assert res.workers_lost == res.kills  # each SIGKILLed worker was found dead once
    assert len(res.attempt_source_records) == res.restarts + 1
    assert res.source_records == sum(res.attempt_source_records)
    # The last attempt read from its restored offset to the end (exact: it finished); a
    # failed attempt counts what it had reported (a lower bound: the rest was lost work).
    assert 0 <= res.attempt_source_records[-1] < N


def test_a_resumed_finished_job_is_credited_with_no_work(tmp_path):
    ck = str(tmp_path / "ck")
    first = flow(CapturingSink(tmp_path / "o")).run(checkpoint_interval=0.05, checkpoint_dir=ck)
    assert first.source_records == N and first.attempt_source_records == [N]
    again = flow(CapturingSink(tmp_path / "o")).run(checkpoint_interval=0.05, checkpoint_dir=ck, resume=True)
    assert again.source_records == 0 and again.restored_from
