"""A job of several pipelines' result (executors/pipeline_results.py): the job's fields are
its pipelines' totals, failures named by pipeline, every checkpoint counted once."""

from __future__ import annotations

from abs_engine.executors.pipeline_results import combine
from abs_engine.executors.result import JobResult
from abs_engine.monitor.model import CheckpointStat, CheckpointStatus


def stat(cid: int, at: float, status: CheckpointStatus = CheckpointStatus.COMPLETED) -> CheckpointStat:
    return CheckpointStat(cid, 1.0, 10, 0.0, False, status=status, trigger_time=at, latest_ack_time=at)


def test_the_job_is_the_sum_of_its_pipelines() -> None:
    a = JobResult("j", restarts=2, workers_lost=1, source_records=5, failures=["boom"], restored_from=[3],
                  pipeline="a", savepoint="/sp/pipeline-a/savepoint-j-000004-x", running_after_s=0.5)
    b = JobResult("j", restarts=1, source_records=7, pipeline="b", cancelled=True, running_after_s=0.9)
    for cid, at in ((1, 10.0), (2, 30.0)):
        a.history.add(stat(cid, at))
    b.history.add(stat(1, 20.0))
    b.history.add(stat(2, 40.0, CheckpointStatus.FAILED))
    job = JobResult("j")
    for _ in range(2):  # as often as stop_when asks: the same answer
        combine(job, [a, b], "/sp")
        assert (job.restarts, job.workers_lost, job.source_records) == (3, 1, 12)
        assert job.failures == ["pipeline 'a': boom"] and job.restored_from == [3]
        assert job.cancelled and job.savepoint == "/sp" and job.running_after_s == 0.9
        assert job.pipelines == [a, b]
        assert job.checkpoints_completed == 3 and job.checkpoints_expired == 1
        assert [s.trigger_time for s in job.checkpoints] == [10.0, 20.0, 30.0]
    combine(job, [b], "/sp")
    assert job.savepoint == "" and job.failures == []
