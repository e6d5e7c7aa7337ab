"""Savepoints, resume and layouts of a job of several pipelines (executors/pipelined.py,
savepoint_sets.py), each case a bug a review found: a pipeline restored as finished stays
restorable, saved and resumed; a set handed out holds every pipeline; a changed or
renamed pipeline is refused, not silently emptied; a partial savepoint does not hide a
good one; the layouts refuse each other on an object store too, and a supervised job
there survives its driver's death. Outputs against their batch oracles."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from abs_engine import CheckpointError, Dataflow, fs
from abs_engine.checkpoint.remote import open_storage
from abs_engine.executors.job_control import request
from abs_engine.executors.job_storage import any_checkpoints
from abs_engine.testing import CapturingSink, GatedSource
from operators.generators import RangeSource

from .procs import run_in_thread, wait_for
from .test_pipelined import finished, killing_the_driver_once
from .test_pipelined import oracle as pipeline_oracle

pytestmark = pytest.mark.slow
N = 4000


def oracle(i: int, n: int = N) -> list[Any]:
    return pipeline_oracle(i, n)


def counting(tmp: str, k: int, gate: str | None, small: int | None = None, names: list[str] | None = None,
             parallelism: int = 1) -> tuple[Dataflow, list[CapturingSink]]:
    """``k`` pipelines of keyed counts, held by ``gate`` after N/8 records (pipeline
    ``small`` reads N/10 ungated: it finishes first)."""
    flow = Dataflow("multi", parallelism=parallelism)
    sinks = [CapturingSink(os.path.join(tmp, f"out{i}")) for i in range(k)]
    for i in range(k):
        n = N // 10 if i == small else N
        src = RangeSource(0, n, batch_size=100)
        name = names[i] if names else f"p{i}"
        s = flow.source(src if gate is None or i == small else GatedSource(src, gate, after=N // 8), name=name)
        s.map(lambda x, i=i: (x % 7 + 10 * i, 1), name=f"pair{i}").key_by(lambda kv: kv[0]) \
            .count(name=f"count{i}").sink(sinks[i], name=f"sink{i}", parallelism=1)
    return flow, sinks


def completed(ck: str, p: str) -> list[int]:
    return open_storage(fs.join(ck, f"pipeline-{p}")).completed_ids()


def got(sink: CapturingSink) -> list[Any]:
    return sorted(tuple(r) for r in sink.records())


def test_a_pipeline_restored_as_finished_is_saved_restored_and_resumed(tmp_path):
    gate, ck, ck2 = str(tmp_path / "gate"), str(tmp_path / "ck"), str(tmp_path / "ck2")
    flow, sinks = counting(str(tmp_path), 2, gate, small=1)
    thread, box = run_in_thread(lambda: flow.run(checkpoint_dir=ck, checkpoint_interval=0.1))
    wait_for(lambda: completed(ck, "p0") and finished(ck, "p1"), 30, "p0 checkpoints, p1 finished")
    s1 = request(ck, "stop", 30)
    thread.join(30)
    assert "error" not in box, box
    assert sorted(os.listdir(s1)) == ["pipeline-p0", "pipeline-p1"]

    # Run B: from the set; p1 is not run again (finished_in)
    stop = str(tmp_path / "stop")  # (so that run B ends even when an assertion below fails)
    thread, box = run_in_thread(lambda: flow.run(checkpoint_dir=ck2, restore_from=s1, checkpoint_interval=0.1,
                                                 stop_when=lambda r: os.path.exists(stop)))
    try:
        wait_for(lambda: len(completed(ck2, "p0")) >= 2, 30, "p0 checkpoints in run B")
        t = time.monotonic()
        where = request(ck2, "savepoint", 10)  # (1) the first version: CheckpointError 'no savepoint within 10s'
        assert time.monotonic() - t < 5
        assert sorted(os.listdir(where)) == ["pipeline-p0", "pipeline-p1"]
        s2 = request(ck2, "stop", 10)
    finally:
        open(stop, "w").close()
        thread.join(30)
    assert "error" not in box, box
    assert s2 == box["result"].savepoint and sorted(os.listdir(s2)) == ["pipeline-p0", "pipeline-p1"]  # (2)

    # (2) the second set restores (the first version: NOT_FOUND 'has no savepoint of pipeline p1')
    res3 = flow.run(checkpoint_dir=str(tmp_path / "ck3"), restore_from=s2, checkpoint_interval=0.1,
                    stop_when=lambda r: True)
    assert res3.pipelines[1].phases == ["CREATED", "FINISHED"]

    # (3) resume run B's directory (what JobInterrupted / a crash tells the user to do)
    open(gate, "w").close()
    res = flow.run(checkpoint_dir=ck2, resume=True, checkpoint_interval=0.1)
    assert res.pipelines[1].restored_from, "the first version: p1 re-ran from nothing"
    assert got(sinks[0]) == oracle(0) and got(sinks[1]) == oracle(1, N // 10)


def test_a_savepoint_handed_out_holds_a_pipeline_that_had_finished(tmp_path):
    """`abs-engine savepoint DIR` (no --stop) while p1 had finished: the set handed out has
    no pipeline-p1 until the job ends (and never, if the job then fails or is interrupted):
    restoring from it is refused (or, with allow_non_restored_state, p1 re-runs empty)."""
    gate, ck = str(tmp_path / "gate"), str(tmp_path / "ck")
    flow, _ = counting(str(tmp_path), 2, gate, small=1)
    thread, box = run_in_thread(lambda: flow.run(checkpoint_dir=ck, checkpoint_interval=0.1,
                                                 stop_when=lambda r: os.path.exists(str(tmp_path / "stop"))))
    try:
        wait_for(lambda: completed(ck, "p0") and finished(ck, "p1"), 30, "p0 checkpoints, p1 finished")
        where = request(ck, "savepoint", 30)
        inside = sorted(os.listdir(where))
    finally:
        open(tmp_path / "stop", "w").close()
        thread.join(30)
    # the first version: ['pipeline-p0'] (p1's final checkpoint joins only if the job ends well)
    assert inside == ["pipeline-p0", "pipeline-p1"]


def test_a_finished_pipeline_that_changed_is_refused_not_skipped(tmp_path):
    """restore_from a set where p1 had finished, into a dataflow whose p1 pipeline changed
    (a second sink added): p1 is 'finished' (finished_in ignores the shape), so it is not
    run and the new sink gets nothing; failover='job' refuses a changed dataflow."""
    gate, ck = str(tmp_path / "gate"), str(tmp_path / "ck")
    flow, _ = counting(str(tmp_path), 2, gate, small=1)
    thread, box = run_in_thread(lambda: flow.run(checkpoint_dir=ck, checkpoint_interval=0.1))
    wait_for(lambda: completed(ck, "p0") and finished(ck, "p1"), 30, "p0 checkpoints, p1 finished")
    where = request(ck, "stop", 30)
    thread.join(30)
    extra = CapturingSink(tmp_path / "extra")
    # p1's pipeline, changed: a second branch from its source to a new sink
    flow2 = Dataflow("multi", parallelism=1)
    sinks = [CapturingSink(tmp_path / f"out{i}") for i in range(2)]
    for i in range(2):
        n = N // 10 if i == 1 else N
        src = RangeSource(0, n, batch_size=100)
        s = flow2.source(src if i == 1 else GatedSource(src, gate, after=N // 8), name=f"p{i}")
        s.map(lambda x, i=i: (x % 7 + 10 * i, 1), name=f"pair{i}").key_by(lambda kv: kv[0]) \
            .count(name=f"count{i}").sink(sinks[i], name=f"sink{i}", parallelism=1)
        if i == 1:
            s.sink(extra, name="extra1", parallelism=1)
    open(gate, "w").close()
    # the first version: accepted; p1 phases ['CREATED', 'FINISHED'], the new sink extra1 writes nothing, no word
    with pytest.raises(CheckpointError) as e:
        flow2.run(checkpoint_dir=str(tmp_path / "ck2"), restore_from=where, checkpoint_interval=0.1)
    assert e.value.reason.name == "PLAN_MISMATCH"


def test_a_set_restored_as_one_job_is_refused_with_the_fix(tmp_path):
    gate = str(tmp_path / "gate")
    flow, _ = counting(str(tmp_path), 2, gate)
    open(gate, "w").close()
    ck = str(tmp_path / "ck")
    # a set: the final checkpoints of both pipelines (complete_set) after a savepoint request... use SIGUSR2-free way:
    os.remove(gate)
    thread, box = run_in_thread(lambda: flow.run(checkpoint_dir=ck, checkpoint_interval=0.1))
    wait_for(lambda: completed(ck, "p0") and completed(ck, "p1"), 30, "checkpoints")
    where = request(ck, "stop", 30)
    thread.join(30)
    with pytest.raises(CheckpointError) as e:
        flow.run(checkpoint_dir=str(tmp_path / "ck2"), restore_from=where, failover="job")
    # the first version: NOT_FOUND 'no savepoint at ...: restore_from must name a savepoint directory'
    assert e.value.reason.name == "PLAN_MISMATCH" and "failover=" in str(e.value)


def test_a_partial_savepoint_does_not_hide_a_good_one(tmp_path):
    """A savepoint whose copy crashed (no _metadata: 'does not exist', savepoint.py) is picked
    by pipeline_savepoint as the newest by name; the restore fails though a good one is there."""
    gate, ck = str(tmp_path / "gate"), str(tmp_path / "ck")
    flow, sinks = counting(str(tmp_path), 2, gate)
    thread, box = run_in_thread(lambda: flow.run(checkpoint_dir=ck, checkpoint_interval=0.1))
    wait_for(lambda: completed(ck, "p0") and completed(ck, "p1"), 30, "checkpoints")
    where = request(ck, "stop", 30)
    thread.join(30)
    good = os.listdir(os.path.join(where, "pipeline-p0"))[0]
    partial = os.path.join(where, "pipeline-p0", "savepoint-multi-999999-20991231T000000Z")
    os.makedirs(os.path.join(partial, "chk-999999"), mode=0o700)  # a copy cut short: no _metadata
    open(gate, "w").close()
    try:
        flow.run(checkpoint_dir=str(tmp_path / "ck2"), restore_from=where, checkpoint_interval=0.1)
    except CheckpointError as e:  # the first version: NOT_FOUND 'no savepoint at .../savepoint-multi-999999-...'
        raise AssertionError(f"{good} is a valid savepoint of p0, but the partial one was chosen: {e}")


def stop_after_checkpoints(r):
    return len(r.pipelines) == 2 and all(p.checkpoints_completed >= 2 for p in r.pipelines)


def test_a_renamed_pipeline_is_refused_not_started_empty(tmp_path):
    gate = str(tmp_path / "gate")
    ck = str(tmp_path / "ck")
    flow, _ = counting(str(tmp_path), 2, gate)
    res = flow.run(checkpoint_dir=ck, checkpoint_interval=0.1, stop_when=stop_after_checkpoints)
    assert res.cancelled
    renamed, _ = counting(str(tmp_path), 2, gate, names=["p0", "q1"])  # only the source of pipeline 1 renamed
    open(gate, "w").close()
    # the first version: accepted; pipeline q1 starts empty (restored_from == []), pipeline-p1's state ignored
    with pytest.raises(CheckpointError) as e:
        renamed.run(checkpoint_dir=ck, resume=True, checkpoint_interval=0.1)
    assert e.value.reason.name == "PLAN_MISMATCH" and "pipeline-p1" in str(e.value)
    res2 = renamed.run(checkpoint_dir=ck, resume=True, checkpoint_interval=0.1, allow_non_restored_state=True)
    assert res2.pipelines[0].restored_from and not res2.pipelines[1].restored_from  # on purpose, now
    # failover='job' refuses the same change (shape mismatch) unless allow_non_restored_state:
    ckj = str(tmp_path / "ckj")
    flow.run(checkpoint_dir=ckj, checkpoint_interval=0.1, failover="job",
             stop_when=lambda r: r.checkpoints_completed >= 2)
    with pytest.raises(CheckpointError) as e:
        renamed.run(checkpoint_dir=ckj, resume=True, checkpoint_interval=0.1, failover="job")
    assert e.value.reason.name == "PLAN_MISMATCH"


def test_the_layouts_refuse_each_other_on_an_object_store(tmp_path, s3_server):
    gate = str(tmp_path / "gate")
    ck = s3_server("review-layout")
    flow, _ = counting(str(tmp_path), 2, gate)
    res = flow.run(checkpoint_dir=ck, checkpoint_interval=0.1,
                   stop_when=lambda r: len(r.pipelines) == 2 and all(p.checkpoints_completed >= 2 for p in r.pipelines))
    assert res.cancelled
    seen = any_checkpoints(open_storage(ck))  # what the supervisor asks before restarting a driver
    with pytest.raises(CheckpointError) as e:
        flow.run(checkpoint_dir=ck, resume=True, failover="job", checkpoint_interval=0.1)
    # the first version: NOT_FOUND 'holds no checkpoint'; with resume='if-present' it starts empty
    assert e.value.reason.name == "PLAN_MISMATCH"
    with pytest.raises(CheckpointError) as e:
        flow.run(checkpoint_dir=ck, resume="if-present", failover="job", checkpoint_interval=0.1)
    assert e.value.reason.name == "PLAN_MISMATCH"
    assert seen, "the first version: False: the supervisor restarts the driver without resume"


def test_supervised_pipelined_job_on_s3_survives_a_driver_kill(tmp_path, s3_server):
    gate = str(tmp_path / "gate")
    ck = s3_server("review-supervised")
    flow, sinks = counting(str(tmp_path), 2, gate)
    box = killing_the_driver_once(flow, ck, gate, lambda: all(completed(ck, f"p{i}") for i in range(2)))
    # the first version: CheckpointError DIRECTORY_NOT_EMPTY from pipeline-p0 (restarted without resume)
    assert "error" not in box, box.get("error")
    assert box["result"].driver_crashes == ["killed by signal 9"] and all(p.restored_from for p in box["result"].pipelines)
