"""Region failover (executors/regions.py): in a pipeline without a shuffle, a failed lane
restarts alone from the latest completed checkpoint while the other lanes keep their
worker processes; outputs exact against their batch oracles, in aligned and unaligned
mode; the failure manager's rules hold (a poison record still fails the job); what is not
a lane (a shuffle) still restarts the whole pipeline."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from abs_engine import Dataflow, JobFailed
from abs_engine.checkpoint.remote import open_storage
from abs_engine.executors.config import JobConfig
from abs_engine.executors.regions import failover_regions
from abs_engine.testing import CapturingSink, GatedSource
from operators.generators import RangeSource

from .procs import run_in_thread, wait_for
from .test_pipelined import workers

N = 30_000


def lanes(tmp_path: Any, gate: str | None, parallelism: int = 3, poison: int | None = None) -> tuple[Dataflow, CapturingSink]:
    """Two sources joined lane by lane (a union: forward edges only) into a map that is a
    chain of its own, then a sink: each lane is left#k, right#k, merge#k (union, map, sink)."""
    flow = Dataflow("lanes", parallelism=parallelism)

    def source(name: str, lo: int) -> Any:
        inner = RangeSource(lo, lo + N, batch_size=200)
        return flow.source(inner if gate is None else GatedSource(inner, gate, after=N // 10), name=name)

    def double(x: int) -> int:
        if x == poison:
            raise ValueError(f"poison {x}")
        return 2 * x

    sink = CapturingSink(tmp_path / "out")
    source("left", 0).union(source("right", N), name="merge").map(double, name="joined").sink(sink, name="sink")
    return flow, sink


def test_only_pipelines_without_a_shuffle_have_lanes_to_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    flow, _ = lanes(tmp_path, None)
    plan = flow.compile()
    regions = failover_regions(plan, JobConfig())
    assert regions is not None and regions["merge#1"] == frozenset({"left#1", "right#1", "merge#1"})
    assert failover_regions(plan, JobConfig(failover="job")) is None
    assert failover_regions(plan, JobConfig(mode="stop-the-world")) is None
    assert failover_regions(plan, JobConfig(incremental_checkpoints=True)) is None
    shuffled = Dataflow("shuffled", parallelism=3)
    shuffled.source(RangeSource(0, 9)).key_by(lambda x: x).count().sink(CapturingSink(tmp_path / "s"))
    assert failover_regions(shuffled.compile(), JobConfig()) is None  # one region: the whole pipeline


def killing_lanes(tmp_path, killed: tuple[int, ...], check, **run):  # type: ignore[no-untyped-def]
    """The lanes job, gated: once two checkpoints completed, SIGKILL the merge worker of
    each lane in ``killed``; when those lanes run in new workers, ``check(before, after,
    ck)`` (pids by task); then let the job end. Its result, its output checked exact."""
    gate, ck = str(tmp_path / "gate"), str(tmp_path / "ck")
    flow, sink = lanes(tmp_path, gate)
    n = len(flow.compile().tasks)
    thread, box = run_in_thread(lambda: flow.run(checkpoint_dir=ck, checkpoint_interval=0.1, **run))
    tasks = tuple(f"{op}#{k}" for k in killed for op in ("left", "right", "merge"))
    try:
        wait_for(lambda: len(open_storage(ck).completed_ids()) >= 2, 60, "checkpoints")
        before = wait_for(lambda: workers(n), 30, "every worker")
        for k in killed:
            os.kill(before[f"merge#{k}"], signal.SIGKILL)
        after = wait_for(lambda: workers(n, before, tasks), 60, f"lanes {killed} running again")
        check(before, after, ck)
    finally:
        open(gate, "w").close()
    thread.join(120)
    assert sorted(sink.records()) == sorted(2 * x for x in range(2 * N))
    return box["result"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["aligned", "unaligned"])
def test_a_killed_lane_restarts_alone_and_the_output_is_exact(tmp_path, mode):
    lane = ("left#1", "right#1", "merge#1")

    def check(before, after, ck):  # type: ignore[no-untyped-def]
        assert {t: after[t] for t in before if t not in lane} == {t: before[t] for t in before if t not in lane}
        last = max(open_storage(ck).completed_ids())
        wait_for(lambda: max(open_storage(ck).completed_ids()) > last, 60, "a checkpoint of every lane after it")

    res = killing_lanes(tmp_path, (1,), check, mode=mode)
    assert res.restarts == 1 and res.phases == ["CREATED", "SCHEDULING", "RUNNING", "FINISHED"]
    (rec,) = res.recoveries
    assert rec.failed_task == "merge#1" and rec.restored_from is not None and rec.running_after_s is not None


@pytest.mark.slow
def test_a_poison_record_in_a_lane_still_fails_the_job(tmp_path):
    flow, _ = lanes(tmp_path, None, poison=N // 2)
    with pytest.raises(JobFailed) as e:
        flow.run(checkpoint_dir=str(tmp_path / "ck"), checkpoint_interval=0.1, restart_delay=0)
    assert "poison record" in str(e.value) and f"poison {N // 2}" in str(e.value)


@pytest.mark.slow
def test_two_lanes_killed_together_each_restart_alone(tmp_path):  # type: ignore[no-untyped-def]
    """The second lane's death, seen while the first restarts (its workers' hellos), is its
    own region's failure: it restarts alone too, not the whole pipeline; each recovery ends."""
    def check(before, after, ck):  # type: ignore[no-untyped-def]
        assert after["merge#0"] == before["merge#0"]  # lane 0 kept its workers

    res = killing_lanes(tmp_path, (1, 2), check)
    assert res.restarts == 2 and res.phases == ["CREATED", "SCHEDULING", "RUNNING", "FINISHED"]
    assert sorted(r.failed_task for r in res.recoveries) == ["merge#1", "merge#2"]
    assert all(r.running_after_s is not None and r.restored_from is not None for r in res.recoveries)


def test_a_restarted_region_keeps_what_its_old_sources_read() -> None:
    from abs_engine.executors.result import JobResult
    from abs_engine.executors.source_records import SourceRecords

    res = JobResult("lanes")
    sources = SourceRecords(res)
    sources.new_attempt()
    sources.report("left#0", 500)
    sources.report("left#1", 300)
    sources.restarted(["left#1"])  # its new worker counts from its restored offset again
    sources.report("left#1", 10)
    assert sources.count() == 810 and res.attempt_source_records == [810]
    sources.new_attempt()
    assert res.source_records == 810 and res.attempt_source_records == [810, 0]
