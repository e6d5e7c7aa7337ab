"""What ``run()`` returns: ``JobResult`` (and what ``stop_when`` sees while the job runs)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..monitor.latency import LatencySummary
from ..monitor.model import CheckpointHistory, CheckpointStat, CheckpointStatus, RecoveryEvent, TaskStat


@dataclass
class JobResult:
    """What ``run()`` returns (and what ``stop_when`` sees while the job runs)."""

    job: str  #: the dataflow's name
    duration_s: float = 0.0  #: seconds from the start of run() to its end (the progress lines' clock)
    #: Seconds from the start until every task of the last attempt was running (start-up:
    #: workers launched, connected, restored); ``duration_s - running_after_s`` is the run.
    running_after_s: float = 0.0
    restarts: int = 0  #: attempts started after a failure
    #: The states the job went through, in order (abs_engine/lifecycle.py): e.g. CREATED,
    #: SCHEDULING, RUNNING, RECOVERING, SCHEDULING, RESTORING, RUNNING, FINISHED.
    phases: list[str] = field(default_factory=list)
    kills: int = 0  #: workers the ``chaos`` option killed
    #: Workers that died (a signal, a crash) or went silent, whoever killed them; each one
    #: is followed by a restart (``restarts``) unless the job gave up.
    workers_lost: int = 0
    #: Records the sources read in this run, every attempt's (records read again after a
    #: restore count again: it is work done; an attempt that failed counts what its sources
    #: had reported, every half second); a resumed run counts only its own.
    source_records: int = 0
    attempt_source_records: list[int] = field(default_factory=list)  #: the same, per attempt
    skipped_records: int = 0  #: dropped by operators with on_error="skip"
    #: Source-to-sink latency over the run, from the latency markers (JobConfig's
    #: ``latency_interval``; None: no marker reached a sink). Updated about once a second
    #: while the job runs. A job of several pipelines: the pipeline's with the highest p99.
    latency: LatencySummary | None = None
    job_id: str = ""  #: the job's identity in its checkpoints (kept across resumes)
    failures: list[str] = field(default_factory=list)  #: why each failed attempt failed
    #: The checkpoint each attempt, or region restarted alone, restored (none: started empty).
    restored_from: list[int] = field(default_factory=list)
    #: Checkpoints a restore passed over (corrupt or incomplete), each with the reason.
    skipped_checkpoints: list[str] = field(default_factory=list)
    checkpoint_dir: str = ""  #: where this run's checkpoints went
    cancelled: bool = False  #: ``stop_when``, or the dashboard's cancel, ended the job
    savepoint: str = ""  #: the last savepoint taken (its location)
    stopped_with_savepoint: bool = False  #: a signal stopped the job after its savepoint
    #: Every failover: the task that failed and why, the checkpoint restored, the time
    #: until running again (the most recent KEEP_CHECKPOINT_STATS at least).
    recoveries: list[RecoveryEvent] = field(default_factory=list)
    dashboard_url: str = ""  #: where the live dashboard was served ("" without ``dashboard``)
    #: Each task as the job ended, by task id: its counts, watermark, late and skipped
    #: records, keys, timers, CPU and memory and, for a source, its progress (what the
    #: dashboard's task table showed; the in-process executor sends no heartbeats, so only
    #: the driver's counts are known there).
    tasks: dict[str, TaskStat] = field(default_factory=dict)
    #: How each crashed driver of a supervised run ended (``supervise``), e.g. "killed by
    #: signal 9"; empty without supervision or crash.
    driver_crashes: list[str] = field(default_factory=list)
    #: A job of several pipelines run with ``failover="pipeline"`` (executors/pipelined.py):
    #: each pipeline's own result, in pipeline order (the fields above are then the job's:
    #: totals, every pipeline's failures and checkpoints). Empty for a job run as one.
    pipelines: list["JobResult"] = field(default_factory=list)
    #: The pipeline this result is of (its first operator's name); "" for a whole job.
    pipeline: str = ""

    #: The checkpoints that ended (kept once: the tracker adds to it; the properties below
    #: read it).
    history: CheckpointHistory = field(default_factory=CheckpointHistory, repr=False)

    @property
    def checkpoints(self) -> list[CheckpointStat]:
        """Completed checkpoints, the most recent KEEP_CHECKPOINT_STATS of them at least.
        (These lists are the job's history itself, which the dashboard reads: read them,
        copy them to change them.)"""
        return self.history.completed

    @property
    def failed_checkpoints(self) -> list[CheckpointStat]:
        """Checkpoints that failed (expired) or were aborted (subsumed, a failover, the
        job's end), each with its reason; the most recent KEEP_CHECKPOINT_STATS at least."""
        return self.history.failed

    @property
    def checkpoints_completed(self) -> int:
        """All of them (``checkpoints`` keeps the recent ones)."""
        return self.history.counts.get(CheckpointStatus.COMPLETED, 0)

    @property
    def checkpoints_expired(self) -> int:
        """Checkpoints that passed ``checkpoint_timeout`` (the only way one fails)."""
        return self.history.counts.get(CheckpointStatus.FAILED, 0)

    def details(self) -> str:
        """Every field, as a dataclass would show it (thousands of characters for a long job:
        the recoveries, every pipeline's result). ``str()`` and ``repr()`` are the summary."""
        fields = ", ".join(f"{f.name}=[{', '.join(p.details() for p in self.pipelines)}]" if f.name == "pipelines"
                           else f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self) if f.repr)
        return (f"JobResult({fields}, checkpoints_completed={self.checkpoints_completed}, "
                f"checkpoints_expired={self.checkpoints_expired}, failed={len(self.failed_checkpoints)})")

    def __str__(self) -> str:
        """One paragraph: what ran, for how long, what it read, its checkpoints and restarts,
        where the details are."""
        what = f"pipeline {self.pipeline!r} of job {self.job!r}" if self.pipeline else f"job {self.job!r}"
        end = ("cancelled" if self.cancelled else "stopped with a savepoint" if self.stopped_with_savepoint
               else "ended")
        parts = [f"{what} {end} after {self.duration_s:.1f} s (running after {self.running_after_s:.1f} s)",
                 f"{self.source_records:,} source records",
                 f"{self.checkpoints_completed} checkpoint(s) completed"
                 + (f", {self.checkpoints_expired} expired" if self.checkpoints_expired else ""),
                 f"{self.restarts} restart(s)" + (f" (restored from {self.restored_from})" if self.restored_from else "")]
        if self.skipped_records:
            parts.append(f"{self.skipped_records:,} record(s) skipped")
        if self.latency is not None:
            parts.append(f"latency p50 {self.latency.p50_ms:.1f} ms, p99 {self.latency.p99_ms:.1f} ms")
        if self.pipelines:
            parts.append(f"{len(self.pipelines)} pipelines (.pipelines)")
        where = [f"checkpoints in {self.checkpoint_dir}"] if self.checkpoint_dir else []
        where += [f"savepoint {self.savepoint}"] if self.savepoint else []
        where += [f"dashboard {self.dashboard_url}"] if self.dashboard_url else []
        tail = "; ".join(where + ["every field: .details()"])
        return f"{'; '.join(parts)}. {tail}"

    def __repr__(self) -> str:
        return f"<JobResult {self}>"
