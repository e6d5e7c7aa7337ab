"""Stop-the-world: proving that no record is in flight anywhere, by counting.

With every source paused, the coordinator asks every task, in *waves*, for the records it
has sent on each output channel and taken in from each input channel. One wave is not
enough (tasks answer at different moments: a record sent after its producer answered and
received before its consumer answered would look like a balanced channel that is not).
Mattern's four-counter method: the system is quiescent when two consecutive complete
waves report the *same* counts and in both every channel's sent equals its received.
Nothing is slept on: each wave is a round of messages, repeated until the verdict holds.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Verdict(enum.Enum):
    WAITING = "waiting"  #: the wave is not complete yet
    IN_FLIGHT = "in_flight"  #: complete, but records may be in flight: ask again
    QUIESCENT = "quiescent"  #: nothing in flight: snapshot every task now
    STALE = "stale"  #: an answer to an older wave (or from an unknown task): ignored


@dataclass
class Wave:
    number: int
    sent: dict[str, int] = field(default_factory=dict)
    received: dict[str, int] = field(default_factory=dict)
    answered: set[str] = field(default_factory=set)


class QuiescenceDetector:
    def __init__(self, tasks: frozenset[str], channels: frozenset[str]):
        self.tasks = tasks
        self.channels = channels
        self.wave = Wave(0)
        self.previous: Wave | None = None

    def start(self) -> int:
        """Begin a new detection (a new checkpoint): forget earlier waves."""
        self.previous = None
        return self.next_wave()

    def next_wave(self) -> int:
        self.wave = Wave(self.wave.number + 1)
        return self.wave.number

    def on_counts(self, task: str, wave: int, sent: dict[str, int], received: dict[str, int]) -> Verdict:
        w = self.wave
        if wave != w.number or task not in self.tasks or task in w.answered:
            return Verdict.STALE
        w.answered.add(task)
        w.sent.update(sent)
        w.received.update(received)
        if w.answered != self.tasks:
            return Verdict.WAITING
        balanced = all(w.sent.get(c, 0) == w.received.get(c, 0) for c in self.channels)
        prev, self.previous = self.previous, w
        if balanced and prev is not None and prev.sent == w.sent and prev.received == w.received:
            return Verdict.QUIESCENT
        return Verdict.IN_FLIGHT
