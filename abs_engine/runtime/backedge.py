"""Back-edge logging for tasks on a cycle (the ABS paper's algorithm for cyclic graphs).

A task aligns barriers on its *regular* inputs only. When it triggers checkpoint n it
snapshots its state and forwards the barrier; from then on every record arriving on a
back-edge input is processed *and* logged, until barrier n comes round that back-edge. The
snapshot for n is the state plus those logs: exactly the records in flight on the loop at
the cut. It is complete (may be written and acknowledged) when barrier n has arrived on
every live back-edge.

The other order: barrier n arrives on a back-edge *before* the task has triggered n (the
barrier came round through another path). Records behind it belong after the snapshot, so
that back-edge is HELD (its frames are not processed; its bytes are still read, so the loop
cannot deadlock) until the task triggers n; that back-edge then has nothing to log for n.

No I/O here: the task asks ``is_held`` before processing a back-edge frame.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Iterable


class BackEdgeOutcome(enum.Enum):
    LOGGING = "logging"  #: counted towards a pending session; wait for more barriers
    COMPLETE = "complete"  #: the session for this checkpoint has all its logs
    HELD = "held"  #: barrier before the task triggered it: hold this channel
    IGNORED = "ignored"  #: a stale or duplicate barrier
    UNKNOWN_CHANNEL = "unknown_channel"


@dataclass
class Session:
    checkpoint_id: int
    payload: Any  #: what the task captured at the trigger (its encoded state)
    waiting: set[str]
    logs: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def logged(self) -> int:
        return sum(len(v) for v in self.logs.values())


@dataclass(frozen=True)
class Step:
    outcome: BackEdgeOutcome
    completed: tuple[Session, ...] = ()
    released: tuple[str, ...] = ()  #: channels no longer held


class BackEdgeLog:
    def __init__(self, channels: Iterable[str]):
        self.live: set[str] = set(channels)
        self.sessions: dict[int, Session] = {}
        self.held: dict[str, int] = {}  #: channel -> id of the barrier it is held behind
        self.last_started = 0

    def is_held(self, channel: str) -> bool:
        return channel in self.held

    @property
    def logging(self) -> bool:
        return bool(self.sessions)

    def start(self, checkpoint_id: int, payload: Any) -> Step:
        """The task triggered ``checkpoint_id`` (aligned its regular inputs, or directly)."""
        self.last_started = max(self.last_started, checkpoint_id)
        released = tuple(ch for ch, cid in self.held.items() if cid <= checkpoint_id)
        # A channel held behind exactly this barrier has nothing in flight for it. One held
        # behind an *older* barrier (a checkpoint this task skipped) has not delivered this
        # barrier yet: what follows the old barrier is in flight for this one, and logged.
        arrived = {ch for ch in released if self.held[ch] == checkpoint_id}
        for ch in released:
            del self.held[ch]
        waiting = {ch for ch in self.live if ch not in arrived}
        s = Session(checkpoint_id, payload, waiting, {ch: [] for ch in waiting})
        if not waiting:
            return Step(BackEdgeOutcome.COMPLETE, (s,), released)
        self.sessions[checkpoint_id] = s
        return Step(BackEdgeOutcome.LOGGING, (), released)

    def on_records(self, channel: str, batch: list[Any]) -> None:
        for s in self.sessions.values():
            if channel in s.waiting:
                s.logs[channel].extend(batch)

    def on_barrier(self, channel: str, checkpoint_id: int) -> Step:
        if channel not in self.live:
            return Step(BackEdgeOutcome.UNKNOWN_CHANNEL)
        # Barriers on a channel come in order: an older session still waiting for this
        # channel will never get its barrier (upstream skipped it); it cannot complete.
        for old in [c for c, s in self.sessions.items() if c < checkpoint_id and channel in s.waiting]:
            del self.sessions[old]
        s = self.sessions.get(checkpoint_id)
        if s is not None:
            if channel not in s.waiting:
                return Step(BackEdgeOutcome.IGNORED)
            s.waiting.discard(channel)
            if s.waiting:
                return Step(BackEdgeOutcome.LOGGING)
            del self.sessions[checkpoint_id]
            return Step(BackEdgeOutcome.COMPLETE, (s,))
        if checkpoint_id > self.last_started:
            self.held[channel] = checkpoint_id
            return Step(BackEdgeOutcome.HELD)
        return Step(BackEdgeOutcome.IGNORED)

    def on_end_of_stream(self, channel: str) -> Step:
        """A back-edge ended: it has nothing more to log; sessions may complete."""
        self.live.discard(channel)
        self.held.pop(channel, None)
        done = []
        for cid, s in list(self.sessions.items()):
            s.waiting.discard(channel)
            if not s.waiting:
                done.append(self.sessions.pop(cid))
        return Step(BackEdgeOutcome.COMPLETE if done else BackEdgeOutcome.IGNORED, tuple(done))
