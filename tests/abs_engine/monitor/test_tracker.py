"""The job tracker against scripted events: what it says of checkpoints (completed, expired,
subsumed, aborted by a failover), subtasks, recoveries and throughput, and that its memory
stays bounded."""

from __future__ import annotations

from abs_engine import Dataflow, messages
from abs_engine.checkpoint.metadata import FileRef, Metadata
from abs_engine.executors import config
from abs_engine.monitor import docs
from abs_engine.monitor.model import CheckpointStatus
from abs_engine.lifecycle import Lifecycle, Phase
from abs_engine.monitor.tracker import JobTracker
from abs_engine.testing import CapturingSink, TestingSource


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def plan(tmp_path):  # type: ignore[no-untyped-def]
    flow = Dataflow("t")
    (flow.source(TestingSource(["a"]), "read", parallelism=2).key_by().count("count", parallelism=2)
     .sink(CapturingSink(str(tmp_path)), "out"))
    return flow.compile()


def ack(cid: int, task: str, size: int = 10, first_seen: float = 0.0, logged: int = 0, unaligned: bool = False,
        inflight: int = 0) -> messages.Ack:
    return messages.Ack(cid, task, f"{task}.state", size, "0" * 64, 1.5, logged, False, 2.0, 3.0,
                        unaligned=unaligned, inflight_bytes=inflight, first_seen=first_seen)


def meta(cid: int, tasks: list[str], created: float, sizes: dict[str, int] | None = None) -> Metadata:
    return Metadata(cid, "t", "f", created, False,
                    {t: FileRef(f"{t}.state", (sizes or {}).get(t, 10), "0" * 64) for t in tasks},
                    {t: 1.5 for t in tasks}, 40.0)


def test_a_completed_checkpoint_has_each_subtask_and_flink_fields(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = plan(tmp_path)
    clock = Clock()
    tr = JobTracker(p, "aligned", 1.0, clock)
    tasks = [t.id for t in p.tasks]
    tr.attempt_started(0, None)
    tr.triggered(1, "aligned", 1000.0, len(tasks))
    for i, t in enumerate(tasks):
        clock.t = 1000.01 * (1 + i / 1e6)
        tr.acknowledged(ack(1, t, size=100 + i, first_seen=1000.004, logged=i, inflight=7 * i), clock.t)
    [stat] = tr.completed(meta(1, tasks, clock.t, {t: 100 + i for i, t in enumerate(tasks)}), "aligned")
    assert stat.status is CheckpointStatus.COMPLETED
    assert [s.task for s in stat.subtasks] == sorted(tasks, key=lambda t: (t.split("#")[0], int(t.split("#")[1])))
    assert stat.inflight_records == sum(range(len(tasks))) and stat.inflight_bytes == 7 * sum(range(len(tasks)))
    assert abs(stat.max_start_delay_ms - 4.0) < 1e-6
    detail = tr.checkpoint_doc(1)
    assert detail is not None and detail["status"] == "COMPLETED" and detail["num_acknowledged_subtasks"] == len(tasks)
    sub = {d["task"]: d for d in detail["subtasks"]}
    assert sub[tasks[0]]["state_size"] == 100 and sub[tasks[0]]["checkpoint"] == {"sync": 2.0, "async": 3.0}
    assert sub[tasks[0]]["alignment"]["duration"] == 1.5 and sub[tasks[0]]["start_delay"] == 4.0
    cps = tr.checkpoints_doc()
    assert cps["counts"] == {"restored": 0, "total": 1, "in_progress": 0, "completed": 1, "failed": 0,
                             "expired": 0, "aborted": 0}
    assert cps["latest"]["completed"]["id"] == 1 and cps["latest"]["failed"] is None
    assert cps["summary"]["state_size"]["max"] == sum(100 + i for i in range(len(tasks))) == stat.bytes


def test_pending_expired_subsumed_and_failover_statuses(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = plan(tmp_path)
    clock = Clock()
    tr = JobTracker(p, "aligned", 1.0, clock)
    tasks = [t.id for t in p.tasks]
    tr.attempt_started(0, None)
    for cid in (1, 2, 3, 4):
        tr.triggered(cid, "aligned", clock.t, len(tasks))
    tr.acknowledged(ack(2, tasks[0]), clock.t)
    progress = tr.checkpoint_doc(2)
    assert progress is not None and progress["status"] == "IN_PROGRESS" and progress["num_acknowledged_subtasks"] == 1
    assert [s["status"] for s in progress["subtasks"]].count("PENDING") == len(tasks) - 1
    failed = tr.ended(1, CheckpointStatus.FAILED, "expired after checkpoint_timeout=1s")
    assert failed is not None and failed.failure.startswith("expired")
    assert tr.ended(1, CheckpointStatus.FAILED, "again") is None  # not pending any more
    ended = tr.completed(meta(3, tasks, clock.t), "aligned")
    assert [(s.checkpoint_id, s.status, s.failure) for s in ended] == [
        (3, CheckpointStatus.COMPLETED, ""), (2, CheckpointStatus.ABORTED, "subsumed by checkpoint 3")]
    aborted = tr.abort_pending("job failover: task x died")
    assert [(s.checkpoint_id, s.status) for s in aborted] == [(4, CheckpointStatus.ABORTED)]
    cps = tr.checkpoints_doc()
    # (failed as Flink counts it: expired and aborted together; each apart too)
    assert cps["counts"] == {"restored": 0, "total": 4, "in_progress": 0, "completed": 1, "failed": 3,
                             "expired": 1, "aborted": 2}
    assert [(h["id"], h["status"]) for h in cps["history"]] == [(4, "ABORTED"), (3, "COMPLETED"), (2, "ABORTED"),
                                                                 (1, "FAILED")]
    assert cps["latest"]["failed"]["failure_message"] == "job failover: task x died"
    result = config.JobResult("t", history=tr.history)  # the job's result reads the one history
    assert result.checkpoints_completed == 1 and [s.checkpoint_id for s in result.failed_checkpoints] == [1, 2, 4]
    assert result.checkpoints_expired == 1 and [s.checkpoint_id for s in result.checkpoints] == [3]


def test_recovery_events_and_monotonic_task_counters(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = plan(tmp_path)
    clock = Clock()
    tr = JobTracker(p, "aligned", 1.0, clock)
    life = Lifecycle(tr.phase_changed)  # as the job master drives them
    task = p.tasks[0].id
    assert tr.job_doc()["state"] == "CREATED"
    life.to(Phase.SCHEDULING)
    tr.attempt_started(0, None)
    tr.all_running()
    life.to(Phase.RUNNING)
    assert tr.job_doc()["state"] == "RUNNING"
    tr.task_metrics(task, 100, 90, 0.0, now=10.0)
    tr.task_metrics(task, 600, 590, 0.25, now=11.0)  # 500 rec/s, a quarter of the second blocked
    doc = {t["id"]: t for t in tr.job_doc()["tasks"]}[task]
    assert doc["records_in_per_second"] == 500.0 and doc["backpressure"] == 0.25 and doc["records_in"] == 600
    tr.tick(11.0)
    tr.tick(11.5)  # not due: one sample a second
    assert len(tr.job_doc()["throughput"]["time"]) == 1
    clock.t = 1010.0
    life.to(Phase.RECOVERING)
    tr.failed_over(task, "worker process 7 was killed by SIGKILL", 1)
    assert tr.job_doc()["state"] == "RESTARTING"
    life.to(Phase.SCHEDULING)
    life.to(Phase.RESTORING)
    assert tr.job_doc()["state"] == "RESTARTING"  # until it runs again
    tr.attempt_started(1, 5)
    tr.task_metrics(task, 40, 40, 0.0, now=20.0)  # the new attempt counts from zero again
    doc = {t["id"]: t for t in tr.job_doc()["tasks"]}[task]
    assert doc["records_in"] == 640 and doc["records_out"] == 630  # never goes back
    clock.t = 1012.5
    tr.all_running()
    life.to(Phase.RUNNING)
    life.to(Phase.STOPPING)  # a savepoint and a stop: still running
    assert tr.job_doc()["state"] == "RUNNING"
    [rec] = tr.job_doc()["recoveries"]
    assert rec == {"time": 1010000, "attempt": 1, "failed_task": task, "reason": "worker process 7 was killed by SIGKILL",
                   "restored_from": 5, "running_after_ms": 2500.0}
    assert tr.checkpoints_doc()["counts"]["restored"] == 1
    life.to(Phase.FINISHED)
    assert tr.job_doc()["state"] == "FINISHED" and tr.job_doc()["end-time"] == 1012500


def test_history_and_subtask_details_are_bounded(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = plan(tmp_path)
    result = config.JobResult("t")
    tr = JobTracker(p, "aligned", 1.0, Clock(), history=result.history)
    tasks = [t.id for t in p.tasks]
    n = 2 * config.KEEP_CHECKPOINT_STATS + 50
    for cid in range(1, n + 1):
        tr.triggered(cid, "aligned", 1000.0, len(tasks))
        for t in tasks:
            tr.acknowledged(ack(cid, t), 1000.0)
        tr.completed(meta(cid, tasks, 1000.0), "aligned")
    kept = [s.checkpoint_id for s in result.checkpoints]
    assert config.KEEP_CHECKPOINT_STATS <= len(kept) < 2 * config.KEEP_CHECKPOINT_STATS and kept[-1] == n
    assert kept == list(range(n - len(kept) + 1, n + 1))  # the newest, in order
    with_details = [s.checkpoint_id for s in result.checkpoints if s.subtasks]
    assert with_details == list(range(n - config.KEEP_SUBTASK_DETAILS + 1, n + 1))
    assert result.checkpoints_completed == n
    assert len(tr.checkpoints_doc()["history"]) == docs.HISTORY
    assert set(tr.report_doc()["details"]) == {str(c) for c in with_details}
    assert tr.checkpoint_doc(1) is None and tr.checkpoints_doc()["counts"]["completed"] == n


def test_late_and_skipped_records_are_kept_by_operator_across_attempts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Late records add up over attempts (each attempt's operators count from zero), a
    heartbeat overtaken by the task's Finished never lowers them, and a key function's skip
    is listed after its chain's operators."""
    p = plan(tmp_path)
    tr = JobTracker(p, "aligned", 1.0, Clock())
    tr.attempt_started(0, None)
    tr.task_health(messages.Heartbeat("count#0", 0, 0, late={"count": 3}))
    tr.record_skipped("read#1", "key_by(k) of 'count'")
    tr.attempt_started(1, 1)
    tr.task_finished("count#0", 5, 5, late={"count": 2})
    tr.task_health(messages.Heartbeat("count#0", 0, 0, late={"count": 1}))  # older than the Finished
    tr.record_skipped("count#1", "count")
    stats = tr.task_stats()
    assert stats["count#0"].late_by_operator == {"count": 5} and stats["count#0"].late_records == 5
    assert stats["count#1"].skipped_by_operator == {"count": 1}
    assert [(o["name"], o["late_records"], o["skipped_records"]) for o in docs.operators(tr)] == [
        ("read", 0, 0), ("key_by(k) of 'count'", 0, 1), ("count", 5, 1), ("out", 0, 0)]


def test_a_region_restart_keeps_counting_where_the_old_worker_stopped(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A task restarted with its region alone counts from zero in its new process: its
    records and late records so far are kept and added to, as after a restart of the job."""
    p = plan(tmp_path)
    tr = JobTracker(p, "aligned", 1.0, Clock())
    tr.attempt_started(0, None)
    tr.task_metrics("count#0", 100, 90, 0.5, 1.0)
    tr.task_health(messages.Heartbeat("count#0", 100, 90, late={"count": 5}))
    tr.region_restarting(["count#0"], 1)
    tr.task_metrics("count#0", 10, 9, 0.1, 2.0)
    tr.task_health(messages.Heartbeat("count#0", 10, 9, late={"count": 2}))
    stat = tr.task_stats()["count#0"]
    assert (stat.records_in, stat.records_out, stat.late_by_operator) == (110, 99, {"count": 7})
