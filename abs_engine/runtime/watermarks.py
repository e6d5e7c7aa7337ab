"""A task's event time: the watermark of its regular inputs, as an explicit state machine
(Flink's StatusWatermarkValve).

Each regular input is ``Active(watermark)``, ``Idle(watermark)`` or ``Ended``. The task's
watermark is the minimum over its active inputs (an ended input counts as +inf, an idle one
not at all); it only ever moves forward, and the task is idle when every input that has not
ended is idle. When the last active input goes idle, the task's watermark first moves to the
highest watermark of its idle inputs (Flink's "flush" of StatusWatermarkValve): none of them
will send more before it is active again, so nothing any of them sent can hold event time
back (without it, an input that went idle while another still held the minimum down would
keep its watermark from ever counting, and its windows from ever firing). Back-edges never enter the valve: a loop's records would otherwise hold the
loop's own watermark back for ever (docs/event-time.md: in a loop, records that come
round may be late).

Expected events are outcomes, never exceptions: a watermark that does not raise the minimum
is ``UNCHANGED``; one that does is ``ADVANCED`` with the new watermark; the last active
input going idle is ``IDLE``, the first becoming active again ``ACTIVE`` (with the
watermark it brings, which may be behind the task's: the task's never moves back, so that
input's records may be late: that is what idleness trades).

The valve is not in a snapshot: after a restore every input starts unknown (-inf) and each
upstream task sends its watermark first; the operators keep their own watermark in their
state, so the restored job judges lateness as the uninterrupted one did.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable

MIN_WATERMARK = float("-inf")
MAX_WATERMARK = float("inf")


class Change(enum.Enum):
    UNCHANGED = "unchanged"
    ADVANCED = "advanced"  #: the task's watermark moved forward: tell the operators, forward it
    IDLE = "idle"  #: every live input is idle: tell downstream so it does not wait for us
    ACTIVE = "active"  #: an input is active again after the task was idle: so are we


@dataclass(frozen=True)
class Step:
    change: Change
    #: The task's watermark after the event (with IDLE: the watermark the task moves to
    #: before it goes idle, if higher than it had: tell the operators first).
    watermark: float = MIN_WATERMARK


class WatermarkValve:
    def __init__(self, channels: Iterable[str]):
        self.marks: dict[str, float] = {c: MIN_WATERMARK for c in channels}
        self.idle: set[str] = set()
        self.ended: set[str] = set()
        self.watermark = MIN_WATERMARK  #: the task's: never decreases
        self.is_idle = False  #: what downstream was last told

    def _combined(self) -> Step:
        live = [m for c, m in self.marks.items() if c not in self.idle and c not in self.ended]
        if not live:
            if self.ended and len(self.ended) == len(self.marks):
                self.is_idle = False  # every input ended: +inf, which downstream hears as active
                return self._advance(MAX_WATERMARK)
            if not self.is_idle and self.marks:
                self.is_idle = True
                idle = [m for c, m in self.marks.items() if c not in self.ended]
                self._advance(max(idle))  # the flush: every live input is idle
                return Step(Change.IDLE, self.watermark)
            return Step(Change.UNCHANGED, self.watermark)
        step = self._advance(min(live))
        if self.is_idle:
            self.is_idle = False
            return Step(Change.ACTIVE, self.watermark)
        return step

    def _advance(self, candidate: float) -> Step:
        if candidate > self.watermark:
            self.watermark = candidate
            return Step(Change.ADVANCED, candidate)
        return Step(Change.UNCHANGED, self.watermark)

    def on_watermark(self, channel: str, watermark: float) -> Step:
        """A watermark frame: the input is active, and its watermark is the highest it sent."""
        if channel not in self.marks or channel in self.ended:
            return Step(Change.UNCHANGED, self.watermark)
        self.idle.discard(channel)
        if watermark > self.marks[channel]:
            self.marks[channel] = watermark
        return self._combined()

    def on_idle(self, channel: str) -> Step:
        if channel not in self.marks or channel in self.ended or channel in self.idle:
            return Step(Change.UNCHANGED, self.watermark)
        self.idle.add(channel)
        return self._combined()

    def on_end(self, channel: str) -> Step:
        """End of stream: the input holds nothing back any more."""
        if channel not in self.marks or channel in self.ended:
            return Step(Change.UNCHANGED, self.watermark)
        self.ended.add(channel)
        self.idle.discard(channel)
        return self._combined()
