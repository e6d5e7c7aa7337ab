"""A checkpoint in flight: which tasks must still acknowledge it.

``acknowledge`` returns an AckOutcome (like Flink's PendingCheckpoint.TaskAcknowledgeResult)
instead of raising: duplicates and strays are normal in a distributed protocol.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class AckOutcome(enum.Enum):
    SUCCESS = "success"
    DUPLICATE = "duplicate"  #: this task already acknowledged this checkpoint
    UNKNOWN = "unknown"  #: the task is not part of this checkpoint / no such checkpoint
    DISCARDED = "discarded"  #: the checkpoint was aborted (or already completed)


@dataclass(frozen=True)
class TaskSnapshot:
    file: str
    size: int
    sha256: str
    alignment_ms: float
    logged: int = 0  #: records logged on back-edges
    finished: bool = False  #: the task had finished when it snapshotted
    base: int | None = None  #: the file is a delta on this checkpoint's (None: a full file)
    known: int | None = None  #: the newest completion the task may build on (None: it writes no deltas)
    channel_state: int = 0  #: records logged on regular inputs (unaligned)


@dataclass
class PendingCheckpoint:
    checkpoint_id: int
    started: float  #: monotonic clock
    tasks: frozenset[str]
    final: bool = False
    acks: dict[str, TaskSnapshot] = field(default_factory=dict)
    discarded: bool = False
    triggered_directly: set[str] = field(default_factory=set)
    stop_the_world: bool = False

    def acknowledge(self, task: str, snap: TaskSnapshot) -> AckOutcome:
        if self.discarded:
            return AckOutcome.DISCARDED
        if task not in self.tasks:
            return AckOutcome.UNKNOWN
        if task in self.acks:
            return AckOutcome.DUPLICATE
        self.acks[task] = snap
        return AckOutcome.SUCCESS

    @property
    def complete(self) -> bool:
        return not self.discarded and len(self.acks) == len(self.tasks)

    @property
    def missing(self) -> set[str]:
        return set(self.tasks) - set(self.acks)

    def discard(self) -> None:
        self.discarded = True
