"""Prometheus metrics of a running job (prometheus_client), served at ``/metrics``.

Per task counters and gauges are read from the tracker when Prometheus scrapes (a custom
collector: the job's hot path never touches the metrics); checkpoint durations go into a
histogram as checkpoints complete. Each job has a registry of its own, so two jobs in one
process never mix their series.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .model import CheckpointStat, CheckpointStatus

if TYPE_CHECKING:
    from .tracker import JobTracker

#: Checkpoint durations in seconds: 10 ms to 10 minutes.
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


def _health_families(labels: list[str]) -> dict[str, Metric]:
    """A task's health (runtime/task_health.py) as metric families, by TaskMetrics field."""
    return {
        "watermark": GaugeMetricFamily("abs_engine_task_watermark", "A task's event-time watermark (in the job's "
                                       "event-time units; absent: no event time)", labels=labels),
        "cpu_s": CounterMetricFamily("abs_engine_task_cpu_seconds", "CPU time of a task's worker process",
                                     labels=labels),
        "rss": GaugeMetricFamily("abs_engine_task_resident_bytes", "Resident memory of a task's worker process",
                                 labels=labels),
        "keys": GaugeMetricFamily("abs_engine_task_keys", "Keys a task's keyed operators hold", labels=labels),
        "timers": GaugeMetricFamily("abs_engine_task_timers", "Timers a task's operators hold (open windows' "
                                    "among them)", labels=labels),
        "late": CounterMetricFamily("abs_engine_task_late_records", "Late records a task's windows met (every "
                                    "attempt)", labels=labels),
        "skipped": CounterMetricFamily("abs_engine_task_skipped_records", "Records a task's operators skipped "
                                       "(on_error='skip')", labels=labels),
        "left": GaugeMetricFamily("abs_engine_source_left", "Units of input a source task has still to read "
                                  "(label unit: records, bytes, partitions, ...; absent: unbounded)",
                                  labels=[*labels, "unit"]),
        "total": GaugeMetricFamily("abs_engine_source_total", "Units of the whole input of a task's source "
                                   "(every subtask's together; absent: unbounded)", labels=[*labels, "unit"]),
    }


def _add_health(families: dict[str, Metric], v: list[str], t: Any) -> None:
    for field, family in families.items():
        value = getattr(t, field)
        if value is None or (field in ("keys", "timers", "left", "total") and value < 0) or (
                field == "rss" and not value):
            continue  # not known: left out, never a made-up zero
        family.add_metric([*v, t.unit] if field in ("left", "total") else v, value)  # type: ignore[attr-defined]


class _TrackerCollector(Collector):
    """Every view's series; with several pipelines, each series has a ``pipeline`` label."""

    def __init__(self, views: Mapping[str, "JobTracker"]):
        self.views = views
        self.named = len(views) > 1

    def collect(self) -> Iterator[Metric]:
        extra = ["pipeline"] if self.named else []
        labels = ["job", *extra, "task", "vertex"]
        rin = CounterMetricFamily("abs_engine_task_records_in", "Records a task processed (a source: read), "
                                  "every attempt of this run", labels=labels)
        rout = CounterMetricFamily("abs_engine_task_records_out", "Records a task emitted, every attempt of this run",
                                   labels=labels)
        send = CounterMetricFamily("abs_engine_task_send_seconds", "Seconds a task spent sending on data channels "
                                   "(blocked by backpressure, mostly)", labels=labels)
        bp = GaugeMetricFamily("abs_engine_task_backpressure_ratio", "Share of the last heartbeat interval a task "
                               "spent blocked sending (0..1)", labels=labels)
        health = _health_families(labels)
        by_op = {"late_by_operator": CounterMetricFamily(
                     "abs_engine_operator_late_records", "Late records an operator of a task met (every attempt; "
                     "absent: none)", labels=[*labels, "operator"]),
                 "skipped_by_operator": CounterMetricFamily(
                     "abs_engine_operator_skipped_records", "Records an operator of a task skipped "
                     "(on_error='skip', every attempt; absent: none)", labels=[*labels, "operator"])}
        job_labels = ["job", *extra]
        lat = GaugeMetricFamily("abs_engine_latency_seconds", "Source-to-sink latency (the age of latency "
                                "markers at the sinks) over the last 30 s: quantile 0.5, 0.99 and 1 (the maximum)",
                                labels=[*job_labels, "quantile"])
        done = CounterMetricFamily("abs_engine_checkpoints", "Checkpoints that ended, by status",
                                   labels=[*job_labels, "status"])
        per_job = {name: family(name, doc, labels=job_labels) for name, (family, doc) in _PER_JOB.items()}
        for pipeline, tr in self.views.items():
            p = [tr.plan.job, *([pipeline] if self.named else [])]
            with tr.lock:
                for k, t in tr.tasks.items():
                    v = [*p, k, t.vertex]
                    rin.add_metric(v, t.records_in)
                    rout.add_metric(v, t.records_out)
                    send.add_metric(v, t.send_s)
                    bp.add_metric(v, t.backpressure)
                    _add_health(health, v, t)
                    for field, family in by_op.items():
                        for op, n in getattr(t, field).items():
                            family.add_metric([*v, op], n)
                counts = dict(tr.history.counts)
                last = tr.history.completed[-1] if tr.history.completed else None
                values: dict[str, float] = {
                    "abs_engine_latency_markers": tr.latency.count, "abs_engine_checkpoints_in_progress": len(tr.pending),
                    "abs_engine_job_restarts": tr.restarts, "abs_engine_source_records": tr.source_records,
                    "abs_engine_job_uptime_seconds": (tr.end_time or tr.clock()) - tr.start_time}
                recent = tr.latency.last(tr.clock())
            if recent is not None:
                for quantile, ms in (("0.5", recent.p50_ms), ("0.99", recent.p99_ms), ("1", recent.max_ms)):
                    lat.add_metric([*p, quantile], ms / 1000)
            for status in (CheckpointStatus.COMPLETED, CheckpointStatus.FAILED, CheckpointStatus.ABORTED):
                done.add_metric([*p, status.value.lower()], counts.get(status, 0))
            if last is not None:
                values.update({"abs_engine_checkpoint_last_duration_seconds": last.duration_ms / 1000,
                               "abs_engine_checkpoint_last_state_size_bytes": last.state_size,
                               "abs_engine_checkpoint_last_checkpointed_size_bytes": last.bytes,
                               "abs_engine_checkpoint_last_persisted_bytes": last.inflight_bytes,
                               "abs_engine_checkpoint_last_id": last.checkpoint_id})
            for name, value in values.items():
                per_job[name].add_metric(p, value)
        yield from (rin, rout, send, bp, *health.values(), *by_op.values())
        if lat.samples:
            yield lat
        yield done
        yield from (f for f in per_job.values() if f.samples)


#: The job's (or pipeline's) own series: name -> (family, help).
_PER_JOB: dict[str, tuple[Any, str]] = {
    "abs_engine_latency_markers": (CounterMetricFamily, "Latency markers that reached a sink"),
    "abs_engine_checkpoints_in_progress": (GaugeMetricFamily, "Checkpoints pending now"),
    "abs_engine_job_restarts": (CounterMetricFamily, "Attempts started after a failure"),
    "abs_engine_source_records": (CounterMetricFamily, "Records the sources read (every attempt)"),
    "abs_engine_job_uptime_seconds": (GaugeMetricFamily, "Seconds since the job started"),
    "abs_engine_checkpoint_last_duration_seconds": (GaugeMetricFamily, "End-to-end duration of the latest "
                                                    "completed checkpoint"),
    "abs_engine_checkpoint_last_state_size_bytes": (GaugeMetricFamily, "Whole state of the latest completed "
                                                    "checkpoint"),
    "abs_engine_checkpoint_last_checkpointed_size_bytes": (GaugeMetricFamily, "Bytes the latest completed "
                                                           "checkpoint wrote (its deltas, when incremental)"),
    "abs_engine_checkpoint_last_persisted_bytes": (GaugeMetricFamily, "In-flight data the latest completed "
                                                   "checkpoint persisted (channel state, back-edge logs)"),
    "abs_engine_checkpoint_last_id": (GaugeMetricFamily, "Id of the latest completed checkpoint"),
}


class JobMetrics:
    """The job's registry: its pipelines' collector and checkpoint duration histogram."""

    def __init__(self, views: Mapping[str, "JobTracker"]):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_TrackerCollector(views))
        named = len(views) > 1
        histogram = Histogram("abs_engine_checkpoint_duration_seconds", "End-to-end duration of completed "
                              "checkpoints", ["job", "pipeline"] if named else ["job"], buckets=BUCKETS,
                              registry=self.registry)
        for pipeline, tracker in views.items():
            child = histogram.labels(tracker.plan.job, pipeline) if named else histogram.labels(tracker.plan.job)
            tracker.listeners.append(functools.partial(_observe, child))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _observe(histogram: Any, stat: CheckpointStat) -> None:
    if stat.status is CheckpointStatus.COMPLETED:
        histogram.observe(stat.duration_ms / 1000)
