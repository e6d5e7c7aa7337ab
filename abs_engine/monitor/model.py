"""What a job's statistics are made of: per checkpoint, per subtask of a checkpoint, and per
recovery. Frozen data, shared by ``JobResult``, the live dashboard's JSON API, the
Prometheus metrics and the stored statistics that ``abs-engine report`` reads.

Names follow Flink's checkpoint statistics where Flink has one (its REST API's
``end_to_end_duration``, ``state_size``, ``checkpointed_size``, ``persisted_data``,
``start_delay``, ``sync``/``async``/``alignment`` per subtask).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field

#: A job's CheckpointHistory keeps the statistics of this many most recent checkpoints of
#: each kind (a long job takes millions); ``checkpoints_completed`` counts them all.
KEEP_CHECKPOINT_STATS = 1000
#: ... and the per-subtask details of this many.
KEEP_SUBTASK_DETAILS = 100


class CheckpointStatus(str, enum.Enum):
    """Where a checkpoint ended (or that it has not yet)."""

    IN_PROGRESS = "IN_PROGRESS"
    COMPLETED = "COMPLETED"
    #: It could not complete: it passed ``checkpoint_timeout`` (its failure says which tasks
    #: had not acknowledged it).
    FAILED = "FAILED"
    #: It was given up for a reason outside itself: a later checkpoint completed first
    #: (subsumed), the job failed over, or the job ended.
    ABORTED = "ABORTED"


@dataclass(frozen=True)
class SubtaskStat:
    """One task's part in one checkpoint (Flink's subtask checkpoint statistics)."""

    task: str  #: the task id (``<chain>.<index>``)
    vertex: str  #: its chain (Flink's job vertex): the operators fused into one task
    index: int  #: its subtask index
    ack_time: float  #: wall time (seconds since the epoch) its acknowledgement arrived
    #: From the checkpoint's trigger to this acknowledgement, in ms.
    end_to_end_ms: float
    state_size: int  #: bytes of the state file it wrote for this checkpoint
    sync_ms: float  #: on the task thread: operators' snapshot() and the copy
    async_ms: float  #: from there to the acknowledgement: encoding (if forked) and the write
    alignment_ms: float  #: first barrier to last (aligned); 0 when it did not align
    #: Trigger to the moment its first barrier, or its trigger, reached the task: how long
    #: the barrier queued behind data (0: not known).
    start_delay_ms: float
    persisted_records: int  #: records in flight it persisted (back-edge logs, channel state)
    persisted_bytes: int  #: their encoded size
    unaligned: bool  #: it took an unaligned snapshot


@dataclass(frozen=True)
class CheckpointStat:
    """One checkpoint, as ``JobResult.checkpoints`` (completed ones) and
    ``JobResult.failed_checkpoints`` (failed and aborted ones) list it."""

    checkpoint_id: int  #: its number (``chk-<id>`` in the checkpoint directory)
    duration_ms: float  #: from its trigger to its last acknowledgement (end to end)
    #: The state it wrote, all tasks' files together (an incremental checkpoint: only its
    #: deltas; ``state_size`` is the whole state).
    bytes: int
    #: The longest time a task spent aligning its barriers (first barrier to last).
    max_alignment_ms: float
    final: bool  #: taken at the end of a bounded job (it commits the last output)
    #: The slowest task's share of its snapshot on the task thread (operators' snapshot()
    #: and the copy).
    max_sync_ms: float = 0.0
    #: The slowest task's time from there to its acknowledgement (the encoding if forked,
    #: the write).
    max_async_ms: float = 0.0
    #: Incremental checkpoints: tasks whose file holds deltas on an earlier checkpoint's
    #: (``bytes`` counts only what this checkpoint wrote).
    delta_tasks: int = 0
    #: How it was triggered: "aligned", "unaligned", "stop-the-world" or "savepoint" (a
    #: savepoint is aligned, whatever the mode).
    mode: str = "aligned"
    #: Tasks whose snapshot was unaligned: all of an unaligned checkpoint's, and those of
    #: an aligned one whose alignment passed ``aligned_timeout``.
    unaligned_tasks: int = 0
    #: Records in flight it persisted (channel state: unaligned inputs and back-edges).
    inflight_records: int = 0
    inflight_bytes: int = 0  #: their size, as encoded
    #: The longest start delay of its tasks (Flink's): from the trigger to the moment the
    #: checkpoint's first barrier, or its trigger, reached the task, i.e. how long a barrier
    #: spent queued behind data. Wall clocks: on one machine exact; across machines, as
    #: good as their clocks agree.
    max_start_delay_ms: float = 0.0
    status: CheckpointStatus = CheckpointStatus.COMPLETED  #: completed, failed or aborted
    failure: str = ""  #: why it failed or was aborted ("" when completed)
    trigger_time: float = 0.0  #: wall time (seconds since the epoch) of its trigger
    #: Wall time of its latest acknowledgement (0.0: none arrived).
    latest_ack_time: float = 0.0
    #: The whole state it restores: its own files and, for an incremental checkpoint, the
    #: earlier files its deltas build on (``bytes`` is what it wrote itself).
    state_size: int = 0
    num_subtasks: int = 0  #: tasks that had to acknowledge it
    attempt: int = 0  #: the attempt (0: the first; one more after each restart) that took it
    #: Each acknowledging task's part, in task order (kept for the most recent checkpoints).
    subtasks: tuple[SubtaskStat, ...] = ()


@dataclass(frozen=True)
class RecoveryEvent:
    """A failover: which task failed and why, what the job restored, and how long until
    it ran again."""

    time: float  #: wall time (seconds since the epoch) the failure was seen
    attempt: int  #: the attempt that started after it
    failed_task: str  #: the task that failed ("*" when not one task: e.g. start-up)
    reason: str  #: what happened (an exception line, an exit status, a timeout)
    #: The checkpoint the new attempt restored (None: it started empty). Set when it starts.
    restored_from: int | None = None
    #: Seconds from the failure until every task of the new attempt was running again
    #: (None: not running yet, or the job gave up).
    running_after_s: float | None = None


@dataclass(frozen=True)
class TaskStat:
    """One task as the job ended (``JobResult.tasks``): what its last heartbeat said and the
    driver counted, the numbers the dashboard's task table showed. -1 (None for the
    watermark): not known, or, for a source's ``left`` and ``total``, unbounded."""

    vertex: str  #: its chain (Flink's job vertex)
    index: int  #: its subtask index
    records_in: int  #: records it processed (a source: read), every attempt of the run
    records_out: int  #: records it emitted, every attempt of the run
    watermark: float | None  #: its event-time watermark (None: no event time reached it)
    late_records: int  #: late records its windows met, every attempt
    skipped_records: int  #: records its operators skipped (``on_error="skip"``), every attempt
    keys: int  #: keys its keyed operators held
    timers: int  #: timers its operators held (a window's: its open windows)
    cpu_seconds: float  #: CPU time of its worker process (its last attempt's)
    rss_bytes: int  #: resident memory of its worker process (0: not known)
    left: int = -1  #: a source's units still to read (operators/progress.py)
    total: int = -1  #: a source's units in the whole input
    unit: str = ""  #: what a source counts ("": it does not say, or not a source)
    position: str = ""  #: a source's offset in words
    #: ``late_records`` by the name of the operator of its chain that met them (none: left out)
    late_by_operator: dict[str, int] = field(default_factory=dict)
    #: ``skipped_records`` by the name of the operator (or source, or key function) that skipped them
    skipped_by_operator: dict[str, int] = field(default_factory=dict)


@dataclass
class TaskMetrics:
    """One task's counters as its heartbeats report them, and the rates between two."""

    vertex: str
    index: int
    status: str = "DEPLOYING"
    pid: int | None = None
    records_in: int = 0  #: this run's, every attempt's together
    records_out: int = 0
    send_s: float = 0.0  #: seconds spent sending (blocked by backpressure, mostly)
    base: tuple[int, int, float] = (0, 0, 0.0)  #: the totals of earlier attempts
    last: tuple[float, int, int, float] | None = None  #: (monotonic time, in, out, blocked) of the last report
    in_rate: float = 0.0
    out_rate: float = 0.0
    backpressure: float = 0.0  #: share of the last interval spent blocked sending, 0..1
    #: Its health, as its last heartbeat said (runtime/task_health.py): the event-time
    #: watermark (None: none), its process's CPU seconds and resident bytes, the keys and
    #: timers its operators hold (-1: not known), the late records its windows met and the
    #: records its operators skipped (on_error="skip"), both by operator name and over every
    #: attempt (a record met again after a restore counts again, as
    #: ``JobResult.skipped_records`` counts it).
    watermark: float | None = None
    cpu_s: float = 0.0
    rss: int = 0
    keys: int = -1
    timers: int = -1
    late_by_operator: dict[str, int] = field(default_factory=dict)
    late_base: dict[str, int] = field(default_factory=dict)  #: the late records of earlier attempts
    skipped_by_operator: dict[str, int] = field(default_factory=dict)
    #: A source task's progress, as its last heartbeat said (messages.Heartbeat): units left
    #: and in all (-1: unbounded or not known), the unit ("": none said), the offset in words.
    left: int = -1
    total: int = -1
    unit: str = ""
    position: str = ""

    def redeploying(self) -> None:
        """Its worker is deployed again (a restart of the job or of its region): the new
        process counts from zero, so the totals so far become the bases."""
        self.base = (self.records_in, self.records_out, self.send_s)
        self.late_base = dict(self.late_by_operator)
        self.status, self.pid, self.last = "DEPLOYING", None, None
        self.in_rate = self.out_rate = self.backpressure = 0.0

    @property
    def late(self) -> int:
        """Late records its operators met, every attempt."""
        return sum(self.late_by_operator.values())

    @property
    def skipped(self) -> int:
        """Records its operators skipped, every attempt."""
        return sum(self.skipped_by_operator.values())

    def set_late(self, this_attempt: dict[str, int]) -> None:
        """A report of this attempt's late records by operator (a heartbeat's, or the task's
        last); the totals never go back (a report overtaken by a later one is ignored)."""
        for name in set(this_attempt) | set(self.late_base):
            n = self.late_base.get(name, 0) + this_attempt.get(name, 0)
            if n > self.late_by_operator.get(name, 0):
                self.late_by_operator[name] = n

    def stat(self) -> TaskStat:
        """What ``JobResult.tasks`` keeps of it."""
        return TaskStat(self.vertex, self.index, self.records_in, self.records_out, self.watermark, self.late,
                        self.skipped, self.keys, self.timers, self.cpu_s, self.rss, self.left, self.total,
                        self.unit, self.position, dict(self.late_by_operator), dict(self.skipped_by_operator))


@dataclass
class CheckpointHistory:
    """Every checkpoint of a job that ended, kept once: the tracker adds to it as they end
    (monitor/tracker.py), and ``JobResult``, the dashboard's API and the metrics read it.
    Memory stays bounded on a job that runs for ever: at least the KEEP_CHECKPOINT_STATS
    newest of each list are kept, subtask details for the KEEP_SUBTASK_DETAILS newest;
    ``counts`` counts them all. Invariant: a checkpoint is added once, when it ends."""

    completed: list[CheckpointStat] = field(default_factory=list)  #: completed ones, oldest first
    failed: list[CheckpointStat] = field(default_factory=list)  #: failed and aborted ones
    counts: dict[CheckpointStatus, int] = field(default_factory=dict)  #: every one that ended, by status

    def add(self, stat: CheckpointStat) -> None:
        self.counts[stat.status] = self.counts.get(stat.status, 0) + 1
        _keep(self.completed if stat.status is CheckpointStatus.COMPLETED else self.failed, stat)

    def ended(self) -> list[CheckpointStat]:
        """The checkpoints kept, completed or not, by checkpoint id."""
        return sorted(self.completed + self.failed, key=lambda s: s.checkpoint_id)


def _keep(items: list[CheckpointStat], item: CheckpointStat) -> None:
    """Append, keeping at least the KEEP_CHECKPOINT_STATS newest (amortised trimming)."""
    items.append(item)
    old = len(items) - 1 - KEEP_SUBTASK_DETAILS
    if old >= 0 and items[old].subtasks:
        items[old] = dataclasses.replace(items[old], subtasks=())
    if len(items) >= 2 * KEEP_CHECKPOINT_STATS:
        del items[:-KEEP_CHECKPOINT_STATS]


#: (TaskMetrics is the tracker's working record, not part of the API: JobResult.tasks holds TaskStats.)
__all__ = ["KEEP_CHECKPOINT_STATS", "KEEP_SUBTASK_DETAILS", "CheckpointStatus", "SubtaskStat", "CheckpointStat",
           "RecoveryEvent", "TaskStat", "CheckpointHistory"]
