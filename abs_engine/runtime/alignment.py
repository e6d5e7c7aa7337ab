"""Barrier alignment on a task's regular inputs, as an explicit state machine.

States (as in Flink's barrier handler):
- ``WaitingForFirstBarrier``: every live input is consumed freely.
- ``CollectingBarriers(n)``: barrier n arrived on some inputs; those are *blocked*
  (records behind barrier n belong to checkpoint n+1) until n has arrived on every live
  input, then the task snapshots (``TRIGGER``) and every input is released.

An input that has ended (end of stream) can deliver no barrier: it counts as aligned.
Expected irregularities are outcomes, never exceptions: a barrier older than the last
triggered one is ``IGNORED``; a newer barrier while collecting n means n was abandoned
upstream, so n is ``ABORTED`` and collection starts for the newer one.
The machine does no I/O: the task asks ``is_blocked`` before reading a channel.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable


class Outcome(enum.Enum):
    BLOCKED = "blocked"  #: stop reading this channel until TRIGGER or ABORTED
    TRIGGERED = "triggered"  #: aligned: snapshot, forward the barrier, release all inputs
    ABORTED_AND_BLOCKED = "aborted_and_blocked"  #: gave up on an older checkpoint; collecting the new one
    IGNORED = "ignored"  #: a stale barrier (an id already triggered or aborted)
    NOTHING = "nothing"  #: an input ended while not collecting
    UNKNOWN_CHANNEL = "unknown_channel"


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    checkpoint_id: int | None = None
    aborted: int | None = None  #: with ABORTED_AND_BLOCKED: the checkpoint given up


@dataclass(frozen=True)
class WaitingForFirstBarrier:
    pass


@dataclass(frozen=True)
class CollectingBarriers:
    checkpoint_id: int
    arrived: frozenset[str]


State = WaitingForFirstBarrier | CollectingBarriers


class BarrierAligner:
    def __init__(self, channels: Iterable[str]):
        self.live: set[str] = set(channels)
        self.ended: set[str] = set()
        self.state: State = WaitingForFirstBarrier()
        self.last_seen = 0  #: highest checkpoint id triggered or aborted

    def is_blocked(self, channel: str) -> bool:
        s = self.state
        return isinstance(s, CollectingBarriers) and channel in s.arrived

    @property
    def all_ended(self) -> bool:
        return not self.live

    def on_barrier(self, channel: str, checkpoint_id: int) -> Decision:
        if channel not in self.live:
            return Decision(Outcome.UNKNOWN_CHANNEL, checkpoint_id)
        if checkpoint_id <= self.last_seen:
            return Decision(Outcome.IGNORED, checkpoint_id)
        s = self.state
        aborted = None
        if isinstance(s, CollectingBarriers):
            if checkpoint_id < s.checkpoint_id:
                return Decision(Outcome.IGNORED, checkpoint_id)
            if checkpoint_id > s.checkpoint_id:
                aborted = s.checkpoint_id
                self.last_seen = s.checkpoint_id
                s = WaitingForFirstBarrier()
        arrived = s.arrived if isinstance(s, CollectingBarriers) else frozenset()
        arrived = arrived | {channel}
        if arrived >= self.live:
            return self._trigger(checkpoint_id, aborted)
        self.state = CollectingBarriers(checkpoint_id, arrived)
        if aborted is not None:
            return Decision(Outcome.ABORTED_AND_BLOCKED, checkpoint_id, aborted)
        return Decision(Outcome.BLOCKED, checkpoint_id)

    def on_end_of_stream(self, channel: str) -> Decision:
        if channel not in self.live:
            return Decision(Outcome.UNKNOWN_CHANNEL)
        self.live.discard(channel)
        self.ended.add(channel)
        s = self.state
        if isinstance(s, CollectingBarriers):
            arrived = s.arrived - {channel}
            if arrived >= self.live:
                return self._trigger(s.checkpoint_id, None)
            self.state = CollectingBarriers(s.checkpoint_id, arrived)
        return Decision(Outcome.NOTHING)

    def abandon(self, checkpoint_id: int) -> None:
        """The task snapshotted ``checkpoint_id`` unaligned (its trigger, an unaligned
        barrier, or the aligned timeout): stop collecting; barriers up to it are stale."""
        self.state = WaitingForFirstBarrier()
        self.last_seen = max(self.last_seen, checkpoint_id)

    def _trigger(self, checkpoint_id: int, aborted: int | None) -> Decision:
        self.state = WaitingForFirstBarrier()
        self.last_seen = checkpoint_id
        return Decision(Outcome.TRIGGERED, checkpoint_id, aborted)
