"""The job's source-to-sink latency, from the ages its sinks report of the latency markers
(runtime/latency.py): percentiles over the whole run (``JobResult.latency``) and over the
last ``RECENT_S`` seconds (the dashboard, ``/metrics``).

Invariant: memory is bounded whatever the run's length: the run's percentiles come from a
uniform sample of at most ``KEEP`` ages (reservoir sampling, seeded: the same ages give the
same summary), the recent ones from the ages of the last ``RECENT_S`` seconds, at most
``KEEP`` of them; the maximum and the count are exact.
"""

from __future__ import annotations

import collections
import math
import random
from dataclasses import dataclass

KEEP = 10_000  #: ages kept for the run's percentiles (and at most for the recent ones)
RECENT_S = 30.0  #: seconds of ages behind the recent percentiles

__all__ = ["KEEP", "RECENT_S", "LatencyStats", "LatencySummary"]


@dataclass(frozen=True)
class LatencySummary:
    """Source-to-sink latency in milliseconds (the age of latency markers at the sinks)."""

    p50_ms: float  #: the median age (nearest rank, over the sample kept)
    p99_ms: float  #: the 99th percentile age (nearest rank, over the sample kept)
    max_ms: float  #: the oldest age (exact)
    samples: int  #: markers measured

    def to_dict(self) -> dict[str, float | int]:
        """The four fields as a JSON-ready dict, milliseconds rounded to the microsecond."""
        return {"p50_ms": round(self.p50_ms, 3), "p99_ms": round(self.p99_ms, 3), "max_ms": round(self.max_ms, 3),
                "samples": self.samples}

    def __str__(self) -> str:
        return f"p50 {self.p50_ms:.1f} ms, p99 {self.p99_ms:.1f} ms, max {self.max_ms:.1f} ms ({self.samples:,} markers)"


def percentile(ordered: list[float], q: float) -> float:
    """The nearest-rank ``q`` percentile (0 < q <= 100) of a sorted, non-empty list."""
    return ordered[max(0, math.ceil(q / 100.0 * len(ordered)) - 1)]


def summarise(ages: list[float], maximum: float, count: int) -> LatencySummary | None:
    if not ages:
        return None
    ordered = sorted(ages)
    return LatencySummary(percentile(ordered, 50), percentile(ordered, 99), maximum, count)


class LatencyStats:
    """The ages reported so far (``add``) and their summaries. Not thread-safe: the
    tracker holds its lock around it."""

    def __init__(self) -> None:
        self.count = 0
        self.max_ms = 0.0
        self.kept: list[float] = []  #: a uniform sample of every age so far
        self.recent: collections.deque[tuple[float, float]] = collections.deque(maxlen=KEEP)  #: (time, age)
        self._random = random.Random(0)

    def add(self, age_ms: float, now: float) -> None:
        """An age, ``age_ms`` milliseconds, reported at ``now`` (seconds, any clock that ``recent``
        is read with). Not a finite number >= 0: ignored (a worker's word, not ours)."""
        if not isinstance(age_ms, (int, float)) or isinstance(age_ms, bool) or not 0 <= age_ms < math.inf:
            return
        self.count += 1
        self.max_ms = max(self.max_ms, age_ms)
        if len(self.kept) < KEEP:
            self.kept.append(age_ms)
        else:
            j = self._random.randrange(self.count)
            if j < KEEP:
                self.kept[j] = age_ms
        self.recent.append((now, age_ms))

    def run(self) -> LatencySummary | None:
        """Over the whole run (None: no marker reached a sink)."""
        return summarise(self.kept, self.max_ms, self.count)

    def last(self, now: float) -> LatencySummary | None:
        """Over the last ``RECENT_S`` seconds before ``now`` (None: no marker then)."""
        since = now - RECENT_S
        ages = [a for t, a in self.recent if t >= since]
        return summarise(ages, max(ages, default=0.0), len(ages))
