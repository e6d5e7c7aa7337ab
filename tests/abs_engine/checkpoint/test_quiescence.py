"""Stop-the-world quiescence detection: waves of per-channel counts (four-counter method)."""

from __future__ import annotations

from abs_engine.checkpoint.quiescence import QuiescenceDetector, Verdict

TASKS = frozenset({"a#0", "b#0"})
CHANNELS = frozenset({"a#0->b#0"})


def answer(d: QuiescenceDetector, wave: int, sent: int, received: int) -> list[Verdict]:
    return [d.on_counts("a#0", wave, {"a#0->b#0": sent}, {}),
            d.on_counts("b#0", wave, {}, {"a#0->b#0": received})]


def test_records_in_flight_on_a_channel_mean_no_snapshot_yet():
    d = QuiescenceDetector(TASKS, CHANNELS)
    w = d.start()
    assert answer(d, w, sent=10, received=7) == [Verdict.WAITING, Verdict.IN_FLIGHT]
    w = d.next_wave()
    assert answer(d, w, sent=10, received=10)[-1] is Verdict.IN_FLIGHT  # balanced once: not enough
    w = d.next_wave()
    assert answer(d, w, sent=10, received=10)[-1] is Verdict.QUIESCENT


def test_one_balanced_wave_is_not_proof():
    """The trap: a producer answers (5 sent), then sends one more, which the consumer takes
    in before it answers (6 received). The wave is unbalanced here; the next shows 6/6, and
    only a second identical wave proves nothing moved in between."""
    d = QuiescenceDetector(TASKS, CHANNELS)
    w = d.start()
    assert answer(d, w, 5, 6)[-1] is Verdict.IN_FLIGHT
    w = d.next_wave()
    assert answer(d, w, 6, 6)[-1] is Verdict.IN_FLIGHT
    w = d.next_wave()
    assert answer(d, w, 7, 7)[-1] is Verdict.IN_FLIGHT  # balanced, but something moved
    w = d.next_wave()
    assert answer(d, w, 7, 7)[-1] is Verdict.QUIESCENT


def test_stale_waves_and_unknown_tasks_are_ignored():
    d = QuiescenceDetector(TASKS, CHANNELS)
    old = d.start()
    new = d.next_wave()
    assert d.on_counts("a#0", old, {"a#0->b#0": 1}, {}) is Verdict.STALE
    assert d.on_counts("zz#0", new, {}, {}) is Verdict.STALE
    assert d.on_counts("a#0", new, {"a#0->b#0": 1}, {}) is Verdict.WAITING
    assert d.on_counts("a#0", new, {"a#0->b#0": 1}, {}) is Verdict.STALE  # duplicate


def test_a_new_detection_forgets_earlier_waves():
    d = QuiescenceDetector(TASKS, CHANNELS)
    w = d.start()
    answer(d, w, 3, 3)
    w = d.start()  # next checkpoint: the earlier balanced wave must not count
    assert answer(d, w, 3, 3)[-1] is Verdict.IN_FLIGHT
