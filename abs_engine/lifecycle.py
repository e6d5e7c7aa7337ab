"""A job's lifecycle as explicit states (as Arroyo's controller), one table of transitions.

    CREATED -> SCHEDULING -> RESTORING -> RUNNING -> STOPPING -> FINISHED
                   ^            |            |          |
                   |            +------------+----------+--> RECOVERING --+
                   +-------------------------------------------------------+

SCHEDULING: an attempt's tasks are being started and deployed. RESTORING: they restore a
checkpoint (or savepoint) before they run. RUNNING: every task runs; the coordinator
triggers checkpoints. STOPPING: a savepoint was asked for with a stop (``abs-engine
savepoint --stop``, SIGTERM); the job ends when it is committed. RECOVERING: an attempt
failed and the failure manager (failover.py) chose to restart it. FINISHED, FAILED and
CANCELED end the job, from any state that has not ended. A transition the table does not
list is a bug of the driver: it raises.

The phase is kept here only: the dashboard's job state (Flink's names, monitor/tracker.py)
is derived from it, told of each change (``on_change``).
"""

from __future__ import annotations

import enum
from typing import Callable


class Phase(enum.Enum):
    CREATED = "CREATED"
    SCHEDULING = "SCHEDULING"
    RESTORING = "RESTORING"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"
    RECOVERING = "RECOVERING"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    CANCELED = "CANCELED"


ENDED = frozenset({Phase.FINISHED, Phase.FAILED, Phase.CANCELED})

#: Where each state may go, besides ending (FAILED, CANCELED; FINISHED where listed).
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    # A pipeline whose savepoint is its committed final checkpoint has nothing to run (pipelined.py).
    Phase.CREATED: frozenset({Phase.SCHEDULING, Phase.FINISHED}),
    Phase.SCHEDULING: frozenset({Phase.RESTORING, Phase.RUNNING, Phase.RECOVERING}),
    # A restore of the job's final checkpoint only commits it: it finishes without running.
    Phase.RESTORING: frozenset({Phase.RUNNING, Phase.RECOVERING, Phase.FINISHED}),
    Phase.RUNNING: frozenset({Phase.STOPPING, Phase.RECOVERING, Phase.FINISHED}),
    Phase.STOPPING: frozenset({Phase.RECOVERING, Phase.FINISHED}),
    Phase.RECOVERING: frozenset({Phase.SCHEDULING}),
}


class IllegalTransition(RuntimeError):
    """The driver tried a transition the lifecycle does not have (a bug, not a job's fault)."""


class Lifecycle:
    def __init__(self, on_change: Callable[[Phase], None] | None = None) -> None:
        self.phase = Phase.CREATED
        self.history: list[Phase] = [Phase.CREATED]
        self.on_change = on_change

    @property
    def ended(self) -> bool:
        return self.phase in ENDED

    def to(self, phase: Phase) -> None:
        if phase is self.phase:
            return
        allowed = TRANSITIONS.get(self.phase, frozenset()) | ({Phase.FAILED, Phase.CANCELED} if not self.ended
                                                              else frozenset())
        if phase not in allowed:
            raise IllegalTransition(f"the job cannot go from {self.phase.value} to {phase.value}")
        self.phase = phase
        self.history.append(phase)
        if self.on_change is not None:
            self.on_change(phase)
