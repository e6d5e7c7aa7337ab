"""The job's latency statistics (monitor/latency.py): exact percentiles while every age is
kept, a bounded uniform sample after, the recent window, and reports that are not ages
ignored."""

from __future__ import annotations

import math
import random

from abs_engine.monitor.latency import KEEP, RECENT_S, LatencyStats, percentile


def nearest_rank(ages: list[float], q: float) -> float:
    ordered = sorted(ages)
    return ordered[math.ceil(q / 100 * len(ordered)) - 1]


def test_percentiles_are_the_nearest_rank_of_every_age_kept() -> None:
    rng = random.Random(1)
    ages = [rng.expovariate(1 / 20) for _ in range(999)]
    stats = LatencyStats()
    for a in ages:
        stats.add(a, 100.0)
    run = stats.run()
    assert run is not None and run.samples == 999
    assert (run.p50_ms, run.p99_ms, run.max_ms) == (nearest_rank(ages, 50), nearest_rank(ages, 99), max(ages))
    assert percentile([5.0], 50) == percentile([5.0], 99) == 5.0


def test_memory_is_bounded_and_the_sample_stays_representative() -> None:
    stats = LatencyStats()
    n = 5 * KEEP
    for i in range(n):
        stats.add(float(i % 1000), 0.0)  # uniform over 0..999
    run = stats.run()
    assert run is not None and run.samples == n and run.max_ms == 999.0
    assert len(stats.kept) == KEEP and len(stats.recent) <= KEEP
    assert 450 <= run.p50_ms <= 550 and run.p99_ms >= 970


def test_recent_percentiles_cover_only_the_last_window() -> None:
    stats = LatencyStats()
    stats.add(900.0, 0.0)  # old: outside the window at t=100
    for i in range(10):
        stats.add(float(i), 100.0 - RECENT_S / 2)
    recent = stats.last(100.0)
    assert recent is not None and recent.samples == 10 and recent.max_ms == 9.0
    run = stats.run()
    assert run is not None and run.max_ms == 900.0 and run.samples == 11
    assert stats.last(1000.0) is None  # nothing in the last window


def test_reports_that_are_not_ages_are_ignored() -> None:
    stats = LatencyStats()
    for bad in (-1.0, math.nan, math.inf, True, "3"):
        stats.add(bad, 0.0)  # type: ignore[arg-type]
    assert stats.run() is None and stats.count == 0
