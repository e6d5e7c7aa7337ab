"""The coordinator's share of the tasks' messages: which coordinator call each message goes
to, and what the coordinator answers with. One routing for every driver: the job master's
(executors/attempt_driver.py) and the deterministic simulation's (simulation/sim.py), so
the simulation checks the routing the engine runs.

Sans-IO, as the coordinator: ``route`` returns the messages to send and what the message
did (an acknowledgement's outcome, the checkpoint it completed, the loops that completion
proved drained); the caller acts on that (statistics, a savepoint, the simulation's
checks), then sends the messages, in their order: a completion's notifications, then the
end of the drained loops. Those messages are made when the message is routed, so what the
caller does before it sends them must not change them (nothing it does touches what
``CheckpointCoordinator.notifications`` reads: ``stopping``, ``savepoint_id`` while
stopping, the stop-the-world checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import messages
from .coordinator import CheckpointCoordinator
from .metadata import Metadata
from .pending import AckOutcome


@dataclass
class Routed:
    """What the coordinator made of one message."""

    #: The messages to send, in order (task, message).
    out: list[tuple[str, messages.Message]] = field(default_factory=list)
    outcome: AckOutcome | None = None  #: an acknowledgement's outcome
    completed: Metadata | None = None  #: the checkpoint an acknowledgement completed
    drained: list[int] = field(default_factory=list)  #: loops that completion proved drained


def route(coord: CheckpointCoordinator, msg: messages.Message) -> Routed | None:
    """Hand ``msg`` (from task ``msg.task``) to the coordinator; None: not its business."""
    if isinstance(msg, messages.Ack):
        outcome, meta = coord.on_ack(msg)
        routed = Routed(outcome=outcome, completed=meta)
        if meta is not None:
            routed.out = coord.notifications(meta)
            if coord.just_drained:
                routed.drained = list(coord.just_drained)
                routed.out += coord.end_loop_messages(coord.just_drained)
        return routed
    if isinstance(msg, messages.Finished):
        return Routed(coord.on_finished(msg.task))
    if isinstance(msg, messages.InputsEnded):
        return Routed(coord.on_inputs_ended(msg.task))
    if isinstance(msg, messages.Counts):
        return Routed(coord.on_counts(msg))
    return None
