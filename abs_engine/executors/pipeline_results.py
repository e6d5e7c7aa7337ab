"""A job of several pipelines' result: each pipeline's own (``JobResult.pipelines``) and
the job's totals drawn from them (executors/pipelined.py).

Invariant: the job's fields are functions of its pipelines' results alone (``combine`` can
run any number of times, as ``stop_when`` reads the job's result while it runs): counts
are sums, lists are every pipeline's (failures and skipped checkpoints prefixed with the
pipeline's name), the checkpoint history holds every pipeline's checkpoints (their ids are
each pipeline's own: ``pipelines[i].checkpoints`` tells them apart).
"""

from __future__ import annotations

from ..monitor.model import CheckpointHistory
from .result import JobResult


def combine(job: JobResult, parts: list[JobResult], savepoints: str) -> None:
    """Fill ``job`` from ``parts`` (one per pipeline, in pipeline order); ``savepoints``:
    the job's savepoint directory, shown once a pipeline has written a savepoint there."""
    job.pipelines = list(parts)
    job.running_after_s = max((p.running_after_s for p in parts), default=0.0)
    job.restarts = sum(p.restarts for p in parts)
    job.kills = sum(p.kills for p in parts)
    job.workers_lost = sum(p.workers_lost for p in parts)
    job.source_records = sum(p.source_records for p in parts)
    job.attempt_source_records = [n for p in parts for n in p.attempt_source_records]
    job.skipped_records = sum(p.skipped_records for p in parts)
    job.latency = max((p.latency for p in parts if p.latency is not None), key=lambda s: s.p99_ms, default=None)
    job.job_id = parts[0].job_id if parts else ""
    job.failures = [f"pipeline {p.pipeline!r}: {f}" for p in parts for f in p.failures]
    job.restored_from = [c for p in parts for c in p.restored_from]
    job.skipped_checkpoints = [f"pipeline {p.pipeline!r}: {s}" for p in parts for s in p.skipped_checkpoints]
    job.cancelled = any(p.cancelled for p in parts)
    job.savepoint = savepoints if any(p.savepoint for p in parts) else ""
    job.stopped_with_savepoint = any(p.stopped_with_savepoint for p in parts)
    job.recoveries = sorted((r for p in parts for r in p.recoveries), key=lambda r: r.time)
    # (job.dashboard_url is the job's: one dashboard, a view per pipeline)
    job.tasks = {k: v for p in parts for k, v in p.tasks.items()}  # (task ids are unique across pipelines)
    history = CheckpointHistory()
    for stat in sorted((s for p in parts for s in p.history.completed + p.history.failed),
                       key=lambda s: s.latest_ack_time or s.trigger_time):
        history.add(stat)
    history.counts = {}
    for p in parts:
        # (a copy: another pipeline's thread may add a status to its counts meanwhile)
        for status, n in dict(p.history.counts).items():
            history.counts[status] = history.counts.get(status, 0) + n
    job.history = history
