"""Pipeline failover (executors/pipelined.py): a job of several pipelines restarts only the
failed one. Each test checks every pipeline's output against its batch oracle; the kill
test also requires the other pipelines' worker processes unchanged across the recovery."""

from __future__ import annotations

import collections
import os
import signal
from typing import Any

import pytest

from abs_engine import CheckpointError, Dataflow, JobFailed
from abs_engine.checkpoint.remote import open_storage
from abs_engine.errors import CheckpointErrorReason
from abs_engine.executors.job_control import request
from abs_engine.testing import CapturingSink, GatedSource, fail_at
from examples import collatz
from operators.generators import RangeSource

from .procs import proc_stat, run_in_thread, wait_for
from .test_supervisor import drivers

N = 20_000
pytestmark = pytest.mark.slow


def oracle(i: int, n: int = N) -> list[Any]:
    seen: collections.Counter[int] = collections.Counter()
    out = []
    for x in range(n):
        k = x % 7 + 10 * i
        seen[k] += 1
        out.append((k, seen[k]))
    return sorted(out)


def counting(tmp_path: Any, k: int, gate: str | None, parallelism: int = 2, bad: int | None = None,
             small: int | None = None) -> tuple[Dataflow, list[CapturingSink]]:
    """``k`` independent pipelines ``p0..``: numbers, keyed counts, a sink; each held by
    ``gate`` after N/8 records; pipeline ``bad``'s map always fails; pipeline ``small``
    reads N/10 records ungated (it finishes first)."""
    flow = Dataflow("multi", parallelism=parallelism)
    sinks = [CapturingSink(tmp_path / f"out{i}") for i in range(k)]
    for i in range(k):
        n = N // 10 if i == small else N
        source = RangeSource(0, n, batch_size=250)
        stream = flow.source(source if gate is None or i == small else GatedSource(source, gate, after=N // 8),
                             name=f"p{i}")
        if i == bad:
            stream = stream.map(fail_at(1, attempts=tuple(range(100))), name=f"bad{i}")
        stream.map(lambda x, i=i: (x % 7 + 10 * i, 1), name=f"pair{i}").key_by(lambda kv: kv[0]) \
            .count(name=f"count{i}").sink(sinks[i], name=f"sink{i}", parallelism=1)
    return flow, sinks


def tasks_of_this_test() -> dict[str, int]:
    """comm -> pid of the live workers this process's fork servers started (a worker's comm
    is "abs TASK", cut by Linux to 15 bytes: the tests' task names are told apart by it)."""
    me, out = os.getpid(), {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        st = proc_stat(int(name))
        if not comm.startswith("abs ") or st is None or st[0] == "Z":
            continue
        server = proc_stat(st[1])
        if server is not None and server[1] == me:
            out[comm[4:]] = int(name)
    return out


def completed(ck: Any, pipeline: str) -> list[int]:
    return open_storage(os.path.join(ck, f"pipeline-{pipeline}")).completed_ids()


def finished(ck: Any, pipeline: str) -> bool:
    """The pipeline's final checkpoint is complete."""
    meta, _ = open_storage(os.path.join(ck, f"pipeline-{pipeline}")).latest_valid()
    return meta is not None and meta.final


def workers(n: int, changed: dict[str, int] | None = None, tasks: tuple[str, ...] = ()) -> dict[str, int] | None:
    """task -> pid once ``n`` workers run (and, given ``changed``, ``tasks`` each run in
    another process than there)."""
    now = tasks_of_this_test()
    if len(now) != n or (changed is not None and any(now.get(t) == changed[t] for t in tasks)):
        return None
    return now


def test_a_killed_worker_restarts_its_pipeline_alone(tmp_path):
    gate, ck = str(tmp_path / "gate"), tmp_path / "ck"
    flow, sinks = counting(tmp_path, 3, gate)
    thread, box = run_in_thread(lambda: flow.run(checkpoint_dir=str(ck), checkpoint_interval=0.2))
    try:
        wait_for(lambda: all(len(completed(ck, f"p{i}")) >= 2 for i in range(3)), 60, "checkpoints of every pipeline")
        before = wait_for(lambda: workers(15), 30, "15 workers")
        os.kill(before["count1#0"], signal.SIGKILL)
        # The restarted pipeline's five tasks run in new processes; the others keep theirs.
        mine = ("p1#0", "p1#1", "count1#0", "count1#1", "sink1#0")
        after = wait_for(lambda: workers(15, before, mine), 60, "pipeline p1 running again")
        others = {t: pid for t, pid in before.items() if t not in mine}
        assert {t: after[t] for t in others} == others
        last = [max(completed(ck, f"p{i}")) for i in (0, 2)]
        wait_for(lambda: all(max(completed(ck, f"p{i}")) > n for i, n in zip((0, 2), last)), 60,
                 "the others checkpointing on")
    finally:
        open(gate, "w").close()
    thread.join(120)
    res = box["result"]
    for i in range(3):
        assert sorted(tuple(r) for r in sinks[i].records()) == oracle(i)
    assert [p.restarts for p in res.pipelines] == [0, 1, 0]
    assert res.restarts == 1 and res.workers_lost == 1
    assert res.failures == [f"pipeline 'p1': {res.pipelines[1].failures[0]}"]
    assert [p.pipeline for p in res.pipelines] == ["p0", "p1", "p2"]
    assert res.checkpoints_completed == sum(p.checkpoints_completed for p in res.pipelines)
    assert sorted(n for n in os.listdir(ck) if n.startswith("pipeline-")) == ["pipeline-p0", "pipeline-p1",
                                                                              "pipeline-p2"]


def test_a_pipeline_that_exhausts_its_restarts_fails_the_job_naming_it(tmp_path):
    gate = str(tmp_path / "gate")  # never opened: the healthy pipeline runs until it is stopped
    flow, _ = counting(tmp_path, 2, gate, bad=1)
    with pytest.raises(JobFailed) as e:
        flow.run(checkpoint_dir=str(tmp_path / "ck"), checkpoint_interval=0.2, restart_attempts=1,
                 restart_delay=0)
    assert "pipeline 'p1' (pipeline 1) of job 'multi'" in str(e.value)
    assert "injected failure" in str(e.value)
    assert tasks_of_this_test() == {}  # the healthy pipeline's workers were stopped too


def test_stop_with_savepoint_then_restore_at_another_parallelism(tmp_path):
    """A savepoint of every pipeline (one had finished: its final checkpoint joins), a stop,
    then the job restored from that savepoint at parallelism 3: each output exact once."""
    gate, ck = str(tmp_path / "gate"), tmp_path / "ck"
    flow, sinks = counting(tmp_path, 3, gate, small=2)
    thread, box = run_in_thread(lambda: flow.run(checkpoint_dir=str(ck), checkpoint_interval=0.2))
    try:
        wait_for(lambda: all(len(completed(ck, f"p{i}")) >= 2 for i in range(2)), 60, "checkpoints")
        wait_for(lambda: finished(ck, "p2"), 60, "pipeline p2 finished")
        where = request(str(ck), "stop", 60)
        thread.join(60)
        assert len(sinks[0].records()) < N  # held by the gate: stopped part way
    finally:
        open(gate, "w").close()
    res = box["result"]
    assert res.stopped_with_savepoint and res.savepoint == where
    assert sorted(os.listdir(where)) == ["pipeline-p0", "pipeline-p1", "pipeline-p2"]
    again, _ = counting(tmp_path, 3, gate, parallelism=3, small=2)
    res2 = again.run(checkpoint_dir=str(tmp_path / "ck2"), restore_from=where, checkpoint_interval=0.2)
    assert all(p.restored_from for p in res2.pipelines)  # p2: its final checkpoint, which writes nothing again
    for i in range(3):
        assert sorted(tuple(r) for r in sinks[i].records()) == oracle(i, N // 10 if i == 2 else N)


def test_resume_restores_each_pipeline_from_its_own_checkpoint(tmp_path):
    gate, ck = str(tmp_path / "gate"), str(tmp_path / "ck")
    flow, sinks = counting(tmp_path, 2, gate)
    res = flow.run(checkpoint_dir=ck, checkpoint_interval=0.1,
                   stop_when=lambda r: all(p.checkpoints_completed >= 3 for p in r.pipelines) and len(r.pipelines) == 2)
    assert res.cancelled and all(p.cancelled for p in res.pipelines)
    open(gate, "w").close()
    res2 = flow.run(checkpoint_dir=ck, resume=True, checkpoint_interval=0.2)
    assert all(p.restored_from for p in res2.pipelines)
    for i in range(2):
        assert sorted(tuple(r) for r in sinks[i].records()) == oracle(i)


def test_the_two_layouts_are_not_interchangeable(tmp_path):
    ck = str(tmp_path / "ck")
    flow, _ = counting(tmp_path, 2, None)
    flow.run(checkpoint_dir=ck, checkpoint_interval=0.2, failover="job")
    assert any(n.startswith("chk-") for n in os.listdir(ck))
    with pytest.raises(CheckpointError) as e:
        flow.run(checkpoint_dir=ck, resume=True)
    assert e.value.reason is CheckpointErrorReason.PLAN_MISMATCH and "failover='job'" in str(e.value)
    ck2 = str(tmp_path / "ck2")
    flow.run(checkpoint_dir=ck2, checkpoint_interval=0.2)
    assert sorted(n for n in os.listdir(ck2) if n.startswith("pipeline-")) == ["pipeline-p0", "pipeline-p1"]
    with pytest.raises(CheckpointError) as e:
        flow.run(checkpoint_dir=ck2, resume=True, failover="job")
    assert e.value.reason is CheckpointErrorReason.PLAN_MISMATCH and "pipeline by pipeline" in str(e.value)


def test_a_pipeline_with_a_loop_fails_over_alone(tmp_path):
    """A worker of a loop's pipeline SIGKILLed after its checkpoints: the loop restarts from
    its latest one (back-edge logs replayed) while the other pipeline keeps its workers;
    both outputs exact."""
    gate, ck = str(tmp_path / "gate"), tmp_path / "ck"
    flow = Dataflow("loops", parallelism=2)
    seeds = flow.source(GatedSource(RangeSource(1, 3001, batch_size=100), gate, after=600), name="numbers") \
        .map(lambda n: (n, n, 0), name="seed")
    loop = flow.feedback(name="loop")
    stepped = seeds.union(loop, name="merge").key_by(lambda r: r[1]).apply_keyed(collatz.CollatzStep(), name="step")
    loop.connect(stepped.filter(collatz.is_more, name="more").map(collatz.strip_tag, name="again"))
    steps = CapturingSink(tmp_path / "steps")
    stepped.filter(collatz.is_done, name="finished").map(lambda r: (r[1], r[2]), name="pairs") \
        .sink(steps, name="write", parallelism=1)
    counts = CapturingSink(tmp_path / "counts")
    flow.source(GatedSource(RangeSource(0, N, batch_size=250), gate, after=N // 8), name="p0") \
        .map(lambda x: (x % 7, 1), name="pair0").key_by(lambda kv: kv[0]).count(name="count0") \
        .sink(counts, name="sink0", parallelism=1)
    thread, box = run_in_thread(lambda: flow.run(checkpoint_dir=str(ck), checkpoint_interval=0.1, restart_delay=0))
    try:
        wait_for(lambda: len(completed(ck, "numbers")) >= 2 and completed(ck, "p0"), 60, "checkpoints")
        n = len(flow.compile().tasks)
        assert len({t.id[:11] for t in flow.compile().tasks}) == n  # (each known by its comm)
        before = wait_for(lambda: workers(n), 30, "every worker")
        os.kill(before["step#0"], signal.SIGKILL)  # (a loop's task)
        loop_tasks = tuple(t for t in before if not t.endswith(("p0#0", "p0#1", "count0#0", "count0#1", "sink0#0")))
        after = wait_for(lambda: workers(n, before, loop_tasks), 60, "the loop's pipeline running again")
        assert {t: after[t] for t in before if t not in loop_tasks} == {t: before[t] for t in before
                                                                        if t not in loop_tasks}
    finally:
        open(gate, "w").close()
    thread.join(120)
    res = box["result"]
    assert sorted(tuple(r) for r in steps.records()) == sorted(collatz.oracle(3000).items())
    assert sorted(tuple(r) for r in counts.records()) == oracle(0)
    assert [p.pipeline for p in res.pipelines] == ["numbers", "p0"]
    assert [p.restarts for p in res.pipelines] == [1, 0] and res.pipelines[0].restored_from


def killing_the_driver_once(flow: Dataflow, ck: str, gate: str, checkpointed: Any) -> dict[str, Any]:
    """``flow`` run supervised on a thread; its driver SIGKILLed once ``checkpointed()``
    (every pipeline has a checkpoint), then the gate opened: the box of its result or error."""
    thread, box = run_in_thread(lambda: flow.run(supervise=True, checkpoint_dir=ck, checkpoint_interval=0.05,
                                                 restart_delay=0))
    try:
        driver = wait_for(drivers, 60, "the driver")[0]
        wait_for(checkpointed, 60, "checkpoints of every pipeline")
        os.kill(driver, signal.SIGKILL)
        wait_for(lambda: [p for p in drivers() if p != driver], 60, "the second driver")
    finally:
        open(gate, "w").close()
        thread.join(120)
    return box


def test_a_supervised_job_of_pipelines_survives_a_driver_kill(tmp_path):
    """The supervisor holds DIR's lock and restarts the driver, which resumes every pipeline
    from its own directory; each output exact."""
    gate, ck = str(tmp_path / "gate"), str(tmp_path / "ck")
    flow, sinks = counting(tmp_path, 2, gate)
    box = killing_the_driver_once(flow, ck, gate, lambda: all(completed(ck, f"p{i}") for i in range(2)))
    assert "error" not in box, box.get("error")
    res = box["result"]
    assert res.driver_crashes == ["killed by signal 9"]
    assert all(p.restored_from for p in res.pipelines)
    for i in range(2):
        assert sorted(tuple(r) for r in sinks[i].records()) == oracle(i)
