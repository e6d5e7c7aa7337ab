"""Prometheus metrics of a running job (prometheus_client), served at ``/metrics``.

Per task counters and gauges are read from the tracker when Prometheus scrapes (a custom
collector: the job's hot path never touches the metrics); checkpoint durations go into a
histogram as checkpoints complete. Each job has a registry of its own, so two jobs in one
process never mix their series.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

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
    }


def _add_health(families: dict[str, Metric], v: list[str], t: Any) -> None:
    for field, family in families.items():
        value = getattr(t, field)
        if value is None or (field in ("keys", "timers") and value < 0) or (field == "rss" and not value):
            continue  # not known: left out, never a made-up zero
        family.add_metric(v, value)  # type: ignore[attr-defined]


class _TrackerCollector(Collector):
    def __init__(self, tracker: "JobTracker"):
        self.tracker = tracker

    def collect(self) -> Iterator[Metric]:
        tr = self.tracker
        job = tr.plan.job
        labels = ["job", "task", "vertex"]
        rin = CounterMetricFamily("abs_engine_task_records_in", "Records a task processed (a source: read), "
                                  "every attempt of this run", labels=labels)
        rout = CounterMetricFamily("abs_engine_task_records_out", "Records a task emitted, every attempt of this run",
                                   labels=labels)
        send = CounterMetricFamily("abs_engine_task_send_seconds", "Seconds a task spent sending on data channels "
                                   "(blocked by backpressure, mostly)", labels=labels)
        bp = GaugeMetricFamily("abs_engine_task_backpressure_ratio", "Share of the last heartbeat interval a task "
                               "spent blocked sending (0..1)", labels=labels)
        health = _health_families(labels)
        with tr.lock:
            for k, t in tr.tasks.items():
                v = [job, k, t.vertex]
                rin.add_metric(v, t.records_in)
                rout.add_metric(v, t.records_out)
                send.add_metric(v, t.send_s)
                bp.add_metric(v, t.backpressure)
                _add_health(health, v, t)
            counts = dict(tr.history.counts)
            restarts, records, pending = tr.restarts, tr.source_records, len(tr.pending)
            last = tr.history.completed[-1] if tr.history.completed else None
            up = (tr.end_time or tr.clock()) - tr.start_time
            recent = tr.latency.last(tr.clock())
            markers = tr.latency.count
        yield from (rin, rout, send, bp, *health.values())
        if recent is not None:
            lat = GaugeMetricFamily("abs_engine_latency_seconds", "Source-to-sink latency (the age of latency "
                                    "markers at the sinks) over the last 30 s: quantile 0.5, 0.99 and 1 (the maximum)",
                                    labels=["job", "quantile"])
            for quantile, ms in (("0.5", recent.p50_ms), ("0.99", recent.p99_ms), ("1", recent.max_ms)):
                lat.add_metric([job, quantile], ms / 1000)
            yield lat
        yield _counter("abs_engine_latency_markers", "Latency markers that reached a sink", job, markers)
        done = CounterMetricFamily("abs_engine_checkpoints", "Checkpoints that ended, by status",
                                   labels=["job", "status"])
        for status in (CheckpointStatus.COMPLETED, CheckpointStatus.FAILED, CheckpointStatus.ABORTED):
            done.add_metric([job, status.value.lower()], counts.get(status, 0))
        yield done
        yield _gauge("abs_engine_checkpoints_in_progress", "Checkpoints pending now", job, pending)
        yield _counter("abs_engine_job_restarts", "Attempts started after a failure", job, restarts)
        yield _counter("abs_engine_source_records", "Records the sources read (every attempt)", job, records)
        yield _gauge("abs_engine_job_uptime_seconds", "Seconds since the job started", job, up)
        if last is not None:
            yield _gauge("abs_engine_checkpoint_last_duration_seconds", "End-to-end duration of the latest "
                         "completed checkpoint", job, last.duration_ms / 1000)
            yield _gauge("abs_engine_checkpoint_last_state_size_bytes", "Whole state of the latest completed "
                         "checkpoint", job, last.state_size)
            yield _gauge("abs_engine_checkpoint_last_checkpointed_size_bytes", "Bytes the latest completed "
                         "checkpoint wrote (its deltas, when incremental)", job, last.bytes)
            yield _gauge("abs_engine_checkpoint_last_persisted_bytes", "In-flight data the latest completed "
                         "checkpoint persisted (channel state, back-edge logs)", job, last.inflight_bytes)
            yield _gauge("abs_engine_checkpoint_last_id", "Id of the latest completed checkpoint", job,
                         last.checkpoint_id)


def _counter(name: str, doc: str, job: str, value: float) -> CounterMetricFamily:
    c = CounterMetricFamily(name, doc, labels=["job"])
    c.add_metric([job], value)
    return c


def _gauge(name: str, doc: str, job: str, value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=["job"])
    g.add_metric([job], value)
    return g


class JobMetrics:
    """The job's registry: the tracker's collector and the checkpoint duration histogram."""

    def __init__(self, tracker: "JobTracker"):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_TrackerCollector(tracker))
        self.duration = Histogram("abs_engine_checkpoint_duration_seconds",
                                  "End-to-end duration of completed checkpoints", ["job"], buckets=BUCKETS,
                                  registry=self.registry).labels(tracker.plan.job)
        tracker.listeners.append(self.on_checkpoint)

    def on_checkpoint(self, stat: CheckpointStat) -> None:
        if stat.status is CheckpointStatus.COMPLETED:
            self.duration.observe(stat.duration_ms / 1000)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
