"""The clocks a task reads: the system's in a worker, a manual one in the simulation.

A task never calls ``time`` itself: it asks its clock, so the deterministic simulation can
run the task's own code on a fake time (an aligned timeout, a processing-time timer and a
checkpoint's start delay all follow the simulated clock there).
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (deadlines, turns)."""

    def perf_counter(self) -> float:
        """Seconds on the finest clock (durations measured for statistics)."""

    def time(self) -> float:
        """Wall time (processing-time timers, times reported to the driver)."""


class SystemClock:
    """The process's clocks."""

    monotonic = staticmethod(time.monotonic)
    perf_counter = staticmethod(time.perf_counter)
    time = staticmethod(time.time)


SYSTEM = SystemClock()


class ManualClock:
    """Every reading is ``now``, which only its owner moves."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now
