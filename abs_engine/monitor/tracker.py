"""The driver's running record of a job: checkpoints (pending and ended, with each subtask's
part), failovers, and per task records in and out and backpressure.

The job master's thread tells it what happens; the dashboard's server thread reads JSON
documents of it (``job_doc``, ``checkpoints_doc``, ``checkpoint_doc``). Invariants:
- every read and write holds ``lock``, and a document is built whole under it, so a reader
  never sees half an event;
- memory is bounded whatever the job's length: KEEP_CHECKPOINT_STATS ended checkpoints
  (subtask details for the KEEP_SUBTASK_DETAILS newest), as many recoveries, SAMPLES
  throughput samples, and LatencyStats' bound on latency ages;
- counters only grow within a run: a restarted task's counts are added to what its earlier
  attempts reported (Prometheus counters must be monotonic).
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import messages
from ..checkpoint.metadata import Metadata
from ..lifecycle import ENDED, Phase
from ..plan import Plan
from . import docs
from .latency import LatencyStats, LatencySummary
from .model import (KEEP_CHECKPOINT_STATS, KEEP_SUBTASK_DETAILS, CheckpointHistory, CheckpointStat,
                    CheckpointStatus, RecoveryEvent, SubtaskStat, TaskMetrics, TaskStat)

SAMPLES = 300  #: throughput samples kept, one per SAMPLE_EVERY seconds
SAMPLE_EVERY = 1.0


class JobState(str, enum.Enum):
    """The job's state as Flink's REST API names it, derived from its lifecycle phase."""

    CREATED = "CREATED"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    CANCELED = "CANCELED"


@dataclass
class _Pending:
    checkpoint_id: int
    mode: str
    trigger_time: float
    num_subtasks: int
    attempt: int
    subtasks: dict[str, SubtaskStat] = field(default_factory=dict)


class JobTracker:
    def __init__(self, plan: Plan, mode: str, interval: float | None, clock: Callable[[], float] = time.time,
                 history: CheckpointHistory | None = None):
        self.lock = threading.Lock()
        self.clock = clock
        self.plan = plan
        self.mode = mode
        self.interval = interval
        self.vertices, self.edges = docs.graph(plan)
        self.job_id = ""
        #: Its pipeline's place in the job's plan (pipelines.py; None: the job is one), so a
        #: report of the job orders its pipelines' tabs as the live dashboard does.
        self.pipeline_id: int | None = None
        self.phase = Phase.CREATED  #: the lifecycle's (lifecycle.py), as it tells us
        self.start_time = clock()
        self.end_time: float | None = None
        self.attempt = 0
        self.restarts = 0
        self.source_records = 0
        self.tasks = {t.id: TaskMetrics(t.chain, t.index) for t in plan.tasks}
        self.pending: dict[int, _Pending] = {}
        #: The job's checkpoints that ended, kept once (JobResult reads the same object).
        self.history = history if history is not None else CheckpointHistory()
        self.restored = 0  #: attempts that restored a checkpoint
        self.latest_restored: dict[str, Any] | None = None
        self.recoveries: collections.deque[RecoveryEvent] = collections.deque(maxlen=KEEP_CHECKPOINT_STATS)
        self.samples: collections.deque[tuple[float, dict[str, tuple[float, float, float, float | None]]]] = \
            collections.deque(maxlen=SAMPLES)
        self.next_sample = 0.0
        self.latency = LatencyStats()  #: the ages of the latency markers the sinks reported
        self.version = 0  #: grows with every change (the stored file is rewritten only then)
        #: Called (under no lock) with each checkpoint that ends: the Prometheus metrics.
        self.listeners: list[Callable[[CheckpointStat], None]] = []

    # ---- events, from the job master's thread ----------------------------------------------

    def attempt_started(self, attempt: int, restored_from: int | None, savepoint: bool = False) -> None:
        with self.lock:
            self.version += 1
            self.attempt = attempt
            for t in self.tasks.values():
                t.redeploying()
            if restored_from is not None:
                self.restored += 1
                self.latest_restored = {"id": restored_from, "restore_timestamp": _ms(self.clock()),
                                        "is_savepoint": savepoint}
            if self.recoveries and self.recoveries[-1].attempt == attempt:
                self.recoveries[-1] = dataclasses.replace(self.recoveries[-1], restored_from=restored_from)

    def workers_connected(self, pids: dict[str, int | None]) -> None:
        with self.lock:
            self.version += 1
            for task, pid in pids.items():
                if task in self.tasks:
                    self.tasks[task].pid = pid

    def task_running(self, task: str) -> None:
        with self.lock:
            self.version += 1
            self.tasks[task].status = "RUNNING"

    def all_running(self) -> None:
        with self.lock:
            self.version += 1
            if self.recoveries and self.recoveries[-1].attempt == self.attempt \
                    and self.recoveries[-1].running_after_s is None:
                r = self.recoveries[-1]
                self.recoveries[-1] = dataclasses.replace(r, running_after_s=max(0.0, self.clock() - r.time))

    def task_metrics(self, task: str, records_in: int, records_out: int, send_s: float, now: float) -> None:
        """A heartbeat's counters (this attempt's, cumulative); ``now`` is monotonic."""
        with self.lock:
            t = self.tasks[task]
            if t.last is not None and now > t.last[0]:
                dt = now - t.last[0]
                t.in_rate = max(0.0, records_in - t.last[1]) / dt
                t.out_rate = max(0.0, records_out - t.last[2]) / dt
                t.backpressure = min(1.0, max(0.0, send_s - t.last[3]) / dt)
            t.last = (now, records_in, records_out, send_s)
            self._set_counts(t, records_in, records_out, send_s)

    def task_health(self, hb: messages.Heartbeat) -> None:
        """A heartbeat's health and progress fields."""
        with self.lock:
            t = self.tasks[hb.task]
            t.watermark, t.cpu_s, t.rss, t.keys, t.timers = hb.watermark, hb.cpu_s, hb.rss, hb.keys, hb.timers
            t.set_late(_counts(hb.late))
            t.left, t.total, t.unit, t.position = hb.left, hb.total, hb.unit, hb.position

    def task_stats(self) -> dict[str, TaskStat]:
        """Every task's numbers now (``JobResult.tasks`` at the job's end)."""
        with self.lock:
            return {k: t.stat() for k, t in self.tasks.items()}

    def record_skipped(self, task: str, operator: str) -> None:
        """Operator ``operator`` of ``task`` skipped a record (a Skipped message)."""
        with self.lock:
            self.version += 1
            by_op, name = self.tasks[task].skipped_by_operator, operator[:_NAME_CHARS]
            by_op[name] = by_op.get(name, 0) + 1

    def latency_reported(self, age_ms: float) -> None:
        """A sink's report of a latency marker's age (runtime/latency.py)."""
        with self.lock:
            self.latency.add(age_ms, self.clock())

    def latency_summary(self) -> LatencySummary | None:
        """Over the whole run so far (JobResult.latency)."""
        with self.lock:
            return self.latency.run()

    def task_finished(self, task: str, records_in: int, records_out: int,
                      progress: tuple[int, int, str, str] = (-1, -1, "", ""),
                      late: dict[str, int] | None = None) -> None:
        """The task read or received all its input; ``progress``: a source's, then;
        ``late``: the late records its operators met this attempt, by name."""
        with self.lock:
            self.version += 1
            t = self.tasks[task]
            t.status = "FINISHED"
            if progress[2]:
                t.left, t.total, t.unit, t.position = progress
            t.set_late(_counts(late or {}))
            t.in_rate = t.out_rate = t.backpressure = 0.0
            self._set_counts(t, records_in, records_out, t.send_s - t.base[2])

    @staticmethod
    def _set_counts(t: TaskMetrics, records_in: int, records_out: int, send_s: float) -> None:
        t.records_in = max(t.records_in, t.base[0] + records_in)
        t.records_out = max(t.records_out, t.base[1] + records_out)
        t.send_s = max(t.send_s, t.base[2] + send_s)

    def set_source_records(self, n: int) -> None:
        with self.lock:
            self.source_records = n

    def triggered(self, checkpoint_id: int, mode: str, trigger_time: float, num_subtasks: int) -> None:
        with self.lock:
            self.version += 1
            self.pending[checkpoint_id] = _Pending(checkpoint_id, mode, trigger_time, num_subtasks, self.attempt)

    def acknowledged(self, ack: messages.Ack, now: float) -> None:
        """A task's acknowledgement (``now``: wall time it arrived)."""
        with self.lock:
            p = self.pending.get(ack.checkpoint_id)
            if p is None or ack.task not in self.tasks:
                return
            self.version += 1
            t = self.tasks[ack.task]
            start_delay = max(0.0, (ack.first_seen - p.trigger_time) * 1000) if ack.first_seen else 0.0
            p.subtasks[ack.task] = SubtaskStat(
                ack.task, t.vertex, t.index, now, max(0.0, (now - p.trigger_time) * 1000), ack.size, ack.sync_ms,
                ack.async_ms, ack.alignment_ms, start_delay, ack.logged, ack.inflight_bytes, ack.unaligned)

    def completed(self, meta: Metadata, mode: str) -> list[CheckpointStat]:
        """Checkpoint ``meta`` completed: its statistics and those of the pending ones before
        it, which it subsumed (for ``JobResult``)."""
        with self.lock:
            p = self.pending.pop(meta.checkpoint_id, None) or _Pending(
                meta.checkpoint_id, mode, meta.created - meta.duration_ms / 1000, len(meta.tasks), self.attempt)
            p.mode = mode
            stat = self.stat_of(p, CheckpointStatus.COMPLETED, meta=meta)
            ended = [self._end(stat)]
            for cid in [c for c in self.pending if c < meta.checkpoint_id]:
                ended.append(self._end(self.stat_of(self.pending.pop(cid), CheckpointStatus.ABORTED,
                                                    f"subsumed by checkpoint {meta.checkpoint_id}")))
        self._notify(ended)
        return ended

    def ended(self, checkpoint_id: int, status: CheckpointStatus, reason: str) -> CheckpointStat | None:
        """A pending checkpoint failed or was aborted; None if it was not pending."""
        with self.lock:
            p = self.pending.pop(checkpoint_id, None)
            if p is None:
                return None
            stat = self._end(self.stat_of(p, status, reason))
        self._notify([stat])
        return stat

    def abort_pending(self, reason: str, at: float | None = None) -> list[CheckpointStat]:
        """Every pending checkpoint, aborted (a failover, the job's end) at wall time ``at``
        (None: now)."""
        with self.lock:
            out = [self._end(self.stat_of(self.pending.pop(c), CheckpointStatus.ABORTED, reason, at))
                   for c in sorted(self.pending)]
        self._notify(out)
        return out

    def failed_over(self, task: str, reason: str, next_attempt: int, at: float | None = None) -> None:
        """The attempt failed (at wall time ``at``; None: now) and attempt ``next_attempt``
        will start."""
        with self.lock:
            self.version += 1
            self.restarts += 1
            if task in self.tasks:
                self.tasks[task].status = "FAILED"
            self.recoveries.append(RecoveryEvent(self.clock() if at is None else at, next_attempt, task, reason))

    def region_restarting(self, tasks: list[str], restored_from: int | None) -> None:
        """After ``failed_over`` for a region failover (executors/regions.py): only ``tasks``
        are deployed again, from checkpoint ``restored_from``, in the same attempt."""
        with self.lock:
            self.version += 1
            for task in tasks:
                if task in self.tasks:
                    self.tasks[task].redeploying()
            if self.recoveries and self.recoveries[-1].attempt == self.attempt:
                self.recoveries[-1] = dataclasses.replace(self.recoveries[-1], restored_from=restored_from)

    def region_running(self, tasks: frozenset[str]) -> None:
        """A region restarted alone (``region_restarting``) runs again: its recovery ends
        (the newest of this attempt that one of ``tasks`` failed, and not ended yet; other
        regions may still be restarting, with recoveries of their own after it)."""
        with self.lock:
            self.version += 1
            for i in range(len(self.recoveries) - 1, -1, -1):
                r = self.recoveries[i]
                if r.attempt != self.attempt:
                    break
                if r.failed_task in tasks and r.running_after_s is None:
                    self.recoveries[i] = dataclasses.replace(r, running_after_s=max(0.0, self.clock() - r.time))
                    break

    def phase_changed(self, phase: Phase) -> None:
        """The job's lifecycle moved (lifecycle.py calls this)."""
        with self.lock:
            self.version += 1
            self.phase = phase
            if phase in ENDED:
                self.end_time = self.clock()
                for t in self.tasks.values():
                    t.in_rate = t.out_rate = t.backpressure = 0.0

    @property
    def state(self) -> JobState:
        """Flink's name for the phase: RUNNING while it runs or stops with a savepoint,
        RESTARTING from a failure until it runs again, CREATED before it first runs."""
        if self.phase in ENDED:
            return JobState(self.phase.value)
        if self.phase in (Phase.RUNNING, Phase.STOPPING):
            return JobState.RUNNING
        return JobState.RESTARTING if self.restarts else JobState.CREATED

    def tick(self, now: float) -> None:
        """Take a throughput sample if one is due (``now``: monotonic)."""
        if now < self.next_sample:
            return
        with self.lock:
            self.version += 1  # (the stored file's throughput follows, every WRITE_EVERY)
            self.next_sample = now + SAMPLE_EVERY
            self.samples.append((_ms(self.clock()), {k: (t.in_rate, t.out_rate, t.backpressure, t.watermark)
                                                     for k, t in self.tasks.items()}))

    # ---- helpers (lock held) -------------------------------------------------------------------

    def stat_of(self, p: _Pending, status: CheckpointStatus, failure: str = "", at: float | None = None,
                meta: Metadata | None = None) -> CheckpointStat:
        """A checkpoint's statistics from its acknowledgements so far: completed (``meta``,
        its metadata, says what it wrote), or in progress, failed or aborted at wall time
        ``at`` (None: now; its size is what the acknowledged tasks wrote)."""
        subs = tuple(sorted(p.subtasks.values(), key=lambda s: (s.vertex, s.index)))
        if meta is not None:
            written = sum(e.size for e in meta.tasks.values())
            whole = written + sum(r.size for refs in meta.chains.values() for r in refs)
            duration, alignment = meta.duration_ms, max(meta.alignment_ms.values(), default=0.0)
            final, deltas, acked_by = meta.final, len(meta.chains), meta.created
        else:
            written = whole = sum(s.state_size for s in subs)
            duration = max(0.0, ((self.clock() if at is None else at) - p.trigger_time) * 1000)
            alignment = max((s.alignment_ms for s in subs), default=0.0)
            final, deltas, acked_by = False, 0, 0.0
        return CheckpointStat(
            p.checkpoint_id, duration, written, alignment, final, max((s.sync_ms for s in subs), default=0.0),
            max((s.async_ms for s in subs), default=0.0), deltas, p.mode, sum(s.unaligned for s in subs),
            sum(s.persisted_records for s in subs), sum(s.persisted_bytes for s in subs),
            max((s.start_delay_ms for s in subs), default=0.0), status, failure, p.trigger_time,
            max((s.ack_time for s in subs), default=acked_by), whole, p.num_subtasks, p.attempt, subs)

    def _end(self, stat: CheckpointStat) -> CheckpointStat:
        self.version += 1
        self.history.add(stat)
        return stat

    def _notify(self, stats: list[CheckpointStat]) -> None:
        for s in stats:
            for f in self.listeners:
                f(s)

    # ---- documents, from any thread ---------------------------------------------------------------

    def job_doc(self) -> dict[str, Any]:
        with self.lock:
            doc = docs.job(self)
            samples, tasks = list(self.samples), list(self.tasks)
        # The samples are immutable once taken: their columns are built without the lock.
        doc["throughput"] = docs.throughput(samples, tasks)
        return doc

    def checkpoints_doc(self) -> dict[str, Any]:
        with self.lock:
            return docs.checkpoints(self)

    def checkpoint_doc(self, checkpoint_id: int) -> dict[str, Any] | None:
        with self.lock:
            return docs.checkpoint(self, checkpoint_id)

    def report_doc(self) -> dict[str, Any]:
        """Everything ``abs-engine report`` draws, in one document (what is stored)."""
        with self.lock:
            job = docs.job(self)
            job["throughput"] = docs.throughput(list(self.samples), list(self.tasks))
            return {"version": docs.VERSION, "job": job, "pipeline_id": self.pipeline_id,
                    "checkpoints": docs.checkpoints(self),
                    "details": {str(s.checkpoint_id): d for s in self.history.ended()[-KEEP_SUBTASK_DETAILS:] if s.subtasks
                                if (d := docs.checkpoint(self, s.checkpoint_id)) is not None}}


def _ms(t: float) -> int:
    return int(t * 1000)


#: Characters of an operator's name a count is kept under (a worker's report is cut there).
_NAME_CHARS = 200


def _counts(by_name: dict[str, int]) -> dict[str, int]:
    """A worker's counts by operator name, each a non-negative int (the message's decoder
    checks only that it is a map)."""
    return {str(k)[:_NAME_CHARS]: v for k, v in by_name.items() if type(v) is int and v >= 0}
