"""Window operators driven directly (batches and watermarks, as a task drives them):
tumbling, sliding and session windows against plain batch groupings; allowed lateness,
re-firing and late records against a worked-out sequence; a restore in the middle of a
window (through msgpack, as a checkpoint holds it) changes nothing."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from abs_engine import codec
from operators.base import OperatorContext
from operators.windows import (AGGREGATE, PROCESS, REDUCE, SessionWindows, SlidingWindows, TumblingWindows,
                               WindowOperator)

CTX = OperatorContext("w", 0, 1, 0, False)


def make(windows, kind=AGGREGATE, lateness=0, late_stream=True):
    if kind == AGGREGATE:
        op = WindowOperator(windows, lambda r: r[1], AGGREGATE, lambda a, r: a + 1, key_fn=lambda r: r[0],
                            allowed_lateness=lateness, create=lambda: 0, merge=lambda a, b: a + b)
    elif kind == REDUCE:
        op = WindowOperator(windows, lambda r: r[1], REDUCE, lambda a, r: (a[0], max(a[1], r[1])),
                            key_fn=lambda r: r[0], allowed_lateness=lateness)
    else:
        op = WindowOperator(windows, lambda r: r[1], PROCESS,
                            lambda k, s, e, recs: [(k, s, e, tuple(sorted(t for _, t in recs)))],
                            key_fn=lambda r: r[0], allowed_lateness=lateness)
    op.late_stream = late_stream
    op.open(CTX)
    return op


def drive(op, steps, restore_at=None, factory=None):
    """steps: [(batch, watermark)]; returns (results, late records), arrays as tuples: what
    the next task receives (a restored accumulator that was a tuple is a list again, as
    state decodes arrays, and the wire makes both tuples)."""
    out, late = [], []
    for i, (batch, wm) in enumerate(steps):
        if i == restore_at:
            snap = codec.unpack_state(codec.pack(op.snapshot(i)))  # as a restore reads state
            op = factory()
            op.restore(snap)
        out += op.process(batch)
        out += op.on_watermark(wm)
        late += op.take_side_output()
    return [_tuples(r) for r in out], [_tuples(r) for r in late]


def _tuples(v):
    return tuple(_tuples(x) for x in v) if isinstance(v, (list, tuple)) else v


def out_of_order(seed, n=400, keys="abcd", delay=50):
    """Records with timestamps up to ``delay`` behind the newest, and a watermark after every
    batch that trails the newest by ``delay`` (Flink's rule): nothing is late."""
    rng = random.Random(seed)
    steps, now = [], 0
    for _ in range(n // 8):
        batch = []
        for _ in range(8):
            now += rng.randrange(0, 7)
            batch.append((rng.choice(keys), max(0, now - rng.randrange(0, delay))))
        steps.append((batch, now - delay - 1))
    steps[-1] = (steps[-1][0], float("inf"))
    return steps


def records_of(steps):
    return [r for b, _ in steps for r in b]


@pytest.mark.parametrize("seed", range(3))
def test_tumbling_and_sliding_match_a_batch_grouping(seed):
    steps = out_of_order(seed)
    recs = records_of(steps)
    for windows in (TumblingWindows(100), SlidingWindows(100, 25), TumblingWindows(60, offset=7)):
        expected = defaultdict(int)
        for k, t in recs:
            for s, e in windows.assign(t):
                assert s <= t < e
                expected[(k, s, e)] += 1
        out, late = drive(make(windows), steps)
        assert late == []
        assert sorted(out) == sorted((k, s, e, c) for (k, s, e), c in expected.items())
        # an independent check of assign(): every window of that size containing t
        if isinstance(windows, SlidingWindows):
            for _, t in recs[:50]:
                starts = {s for s, _ in windows.assign(t)}
                assert starts == {s for s in range(t - 99, t + 1) if s % 25 == 0}


def sessions_oracle(recs, gap):
    by_key = defaultdict(list)
    for k, t in recs:
        by_key[k].append(t)
    out = []
    for k, ts in by_key.items():
        ts.sort()
        start, last, n = ts[0], ts[0], 0
        for t in ts:
            if t > last + gap:  # a record gap after the last or more apart starts a new session
                out.append((k, start, last + gap, n))
                start, n = t, 0
            last, n = max(last, t), n + 1
        out.append((k, start, last + gap, n))
    return sorted(out)


@pytest.mark.parametrize("seed", range(3))
def test_sessions_match_a_batch_sessionisation(seed):
    steps = out_of_order(seed, keys="ab")
    out, late = drive(make(SessionWindows(8)), steps)
    assert late == []
    assert sorted(out) == sessions_oracle(records_of(steps), 8)


def test_process_window_sees_the_window_records():
    steps = out_of_order(7)
    out, _ = drive(make(TumblingWindows(100), kind=PROCESS), steps)
    expected = defaultdict(list)
    for k, t in records_of(steps):
        expected[(k, t - t % 100)].append(t)
    assert sorted(out) == sorted((k, s, s + 100, tuple(sorted(ts))) for (k, s), ts in expected.items())


@pytest.mark.parametrize("windows", [TumblingWindows(100), SlidingWindows(100, 20), SessionWindows(15)],
                         ids=["tumbling", "sliding", "session"])
@pytest.mark.parametrize("kind", [AGGREGATE, REDUCE, PROCESS])
def test_a_restore_in_the_middle_of_windows_changes_nothing(windows, kind):
    steps = out_of_order(11)
    plain = drive(make(windows, kind, lateness=30), steps)
    for at in (3, 17, 40):
        assert drive(make(windows, kind, lateness=30), steps, restore_at=at,
                     factory=lambda: make(windows, kind, lateness=30)) == plain


@pytest.mark.parametrize("seed", range(4))
def test_merged_sessions_hand_over_their_records_in_the_same_order_after_a_restore(seed):
    """A process-window function sees a merged session's records in session start order in
    an uninterrupted run and after any restore (not in the order the sessions opened, which
    a restore does not keep)."""
    def factory():
        op = WindowOperator(SessionWindows(10), lambda r: r[1], PROCESS,
                            lambda k, s, e, recs: [(k, s, e, tuple(t for _, t in recs))],
                            key_fn=lambda r: r[0], allowed_lateness=20)
        op.late_stream = True
        op.open(CTX)
        return op

    # sessions [10, 20] and [30, 40], then 20 joins them: start order, then the new record
    out, _ = drive(factory(), [([("k", 30), ("k", 10)], 0), ([("k", 20)], float("inf"))])
    assert out == [("k", 10, 40, (10, 30, 20))]
    steps = out_of_order(seed, n=800, keys="ab", delay=60)
    plain = drive(factory(), steps)
    assert any(list(r[3]) != sorted(r[3]) for r in plain[0])  # the order is the arrival order, not sorted
    for at in range(1, len(steps), 7):
        assert drive(factory(), steps, restore_at=at, factory=factory) == plain


def stragglers(seed, n=1200, keys="abc"):
    """out_of_order's steps, with records far behind the watermark mixed in: some within an
    allowed lateness of 60, some beyond it."""
    rng = random.Random(seed)
    steps = out_of_order(seed, n=n, keys=keys)
    for batch, wm in steps[5:-1]:
        if rng.random() < 0.3:
            batch.append((rng.choice(keys), max(0, int(wm) - rng.randrange(0, 300))))
    return steps


@pytest.mark.parametrize("windows", [SlidingWindows(100, 20), SlidingWindows(60, 60), SlidingWindows(90, 30, 7)],
                         ids=["5-panes", "1-pane", "offset"])
@pytest.mark.parametrize("seed", range(3))
def test_sliding_panes_give_what_per_window_accumulators_give(windows, seed):
    """An aggregate with merge keeps sliding windows as panes (one update a record); without
    merge, one accumulator a window. Same results in the same order, same late records,
    with refirings within the lateness; and the same after a restore."""
    def mk(merge):
        def factory():
            op = WindowOperator(windows, lambda r: r[1], AGGREGATE, lambda a, r: (*a, r[1]), key_fn=lambda r: r[0],
                                allowed_lateness=60, create=tuple, result=sorted, merge=merge)
            op.late_stream = True
            op.open(CTX)
            return op
        return factory

    steps = stragglers(seed)
    panes, windowed = mk(lambda a, b: (*a, *b)), mk(None)
    assert panes().panes and not windowed().panes
    expected = drive(windowed(), steps)
    assert expected[1] and len(expected[0]) > len({r[:3] for r in expected[0]})  # late records and refirings
    op = panes()
    assert drive(op, steps) == expected
    assert op.state == {} and len(op.timers) == 0  # every pane purged with its last window
    assert drive(panes(), steps, restore_at=len(steps) // 2, factory=panes) == expected


def test_allowed_lateness_refires_then_late_records_go_to_the_side_output():
    op = make(TumblingWindows(10), lateness=5)
    steps = [
        ([("k", 1), ("k", 4)], 8),     # window [0,10) holds 2, not due yet (its last timestamp is 9)
        ([("k", 7)], 9),               # due: fires with 3
        ([("k", 2)], 9),               # late but within the lateness: fires again with 4
        ([("k", 12)], 14),             # window [10,20) opens; [0,10) is purged at 9 + 5 = 14
        ([("k", 3), ("k", 15)], 30),   # 3: every window of it purged -> late; [10,20) fires with 2
    ]
    out, late = drive(op, steps)
    assert out == [("k", 0, 10, 3), ("k", 0, 10, 4), ("k", 10, 20, 2)]
    assert late == [("k", 3)]


def test_a_window_opened_within_its_lateness_fires_once_per_record():
    op = make(TumblingWindows(10), lateness=25)
    out, late = drive(op, [
        ([("k", 25)], 30),   # [20,30) fires with 1
        ([("k", 3)], 30),    # [0,10) is new but within its lateness (9 + 25 > 30): fires at once with 1
        ([("k", 35)], 40),   # ... and not again by a timer when the watermark moves on
        ([("k", 4)], 40),    # 9 + 25 <= 40: late
    ])
    assert out == [("k", 20, 30, 1), ("k", 0, 10, 1), ("k", 30, 40, 1)]
    assert late == [("k", 4)]


def test_late_records_without_a_late_stream_are_reported_not_silent():
    op = make(TumblingWindows(10), late_stream=False)
    drive(op, [([("k", 1)], 20), ([("k", 2)], 20)])
    assert [r for r, _ in op.skipped] == [("k", 2)]
    assert "late" in str(op.skipped[0][1]) and ".late" in str(op.skipped[0][1])


def test_session_merge_of_a_fired_session_within_lateness():
    op = make(SessionWindows(5), lateness=20)
    out, late = drive(op, [
        ([("k", 0)], 10),    # session [0,5) fires with 1
        ([("k", 7)], 10),    # session [7,12): not due
        ([("k", 4)], 30),    # [4,9) bridges both: merged [0,12) with 3, fired at once and purged by 30
    ])
    assert out == [("k", 0, 5, 1), ("k", 0, 12, 3)]
    assert late == []


def test_bad_windows_are_refused():
    with pytest.raises(ValueError, match="slide"):
        SlidingWindows(10, 20)
    with pytest.raises(ValueError, match="size"):
        TumblingWindows(0)
    with pytest.raises(ValueError, match="gap"):
        SessionWindows(-1)
    with pytest.raises(ValueError, match="window size must be an int"):  # fractional bounds would be inexact
        TumblingWindows(0.3)
    with pytest.raises(ValueError, match="allowed_lateness must be an int"):
        make(TumblingWindows(10), lateness=0.5)


@pytest.mark.parametrize("windows", [TumblingWindows(3), SlidingWindows(3, 1), SessionWindows(1)],
                         ids=["tumbling", "sliding", "session"])
@pytest.mark.parametrize("lateness", [0, 2])
def test_fractional_timestamps_fire_every_window_once_and_purge_it(windows, lateness):
    """Fractional timestamps (window parameters are whole, so every bound is exact): every
    window is found again by its timers, fires once with its records, and is purged. A
    lookup that recomputed a bound differently from its timer's time would miss it here."""
    rng = random.Random(4)
    recs = [(rng.choice("ab"), rng.random() * 50 + 1e6) for _ in range(300)]
    recs.sort(key=lambda r: r[1])
    steps = [(recs[i:i + 10], recs[i + 9][1] - 1) for i in range(0, 300, 10)]
    steps[-1] = (steps[-1][0], float("inf"))
    op = make(windows, PROCESS, lateness=lateness)
    out, late = drive(op, steps)
    assert late == [] and op.state == {} and len(op.timers) == 0
    if isinstance(windows, SessionWindows):
        expected = [(k, s, e, n) for k, s, e, n in sessions_oracle(recs, 1)]
        assert sorted((k, s, e, len(ts)) for k, s, e, ts in out) == expected
    else:
        expected = defaultdict(list)
        for k, t in recs:
            for s, e in windows.assign(t):
                expected[(k, s, e)].append(t)
        assert sorted(out) == sorted((k, s, e, tuple(sorted(ts))) for (k, s, e), ts in expected.items())


@pytest.mark.parametrize("windows", [TumblingWindows(50), SessionWindows(6)], ids=["tumbling", "session"])
def test_tuple_keys_survive_a_restore_with_open_windows_and_timers(windows):
    """Keys are tuples; state comes back from a checkpoint with arrays as lists (timers hold
    keys inside arrays): a restored window must still fire under its tuple key."""
    def factory():
        op = WindowOperator(windows, lambda r: r[1], AGGREGATE, lambda a, r: a + 1,
                            key_fn=lambda r: (r[0], r[0] * 2), allowed_lateness=10, create=lambda: 0,
                            merge=lambda a, b: a + b)
        op.late_stream = True
        op.open(CTX)
        return op

    steps = out_of_order(2, keys="ab")
    plain = drive(factory(), steps)
    assert plain[0] and isinstance(plain[0][0][0], tuple)
    for at in (5, 20, 33):
        assert drive(factory(), steps, restore_at=at, factory=factory) == plain


@pytest.mark.parametrize("lateness", [0, 50])
def test_an_extended_session_keeps_its_own_timers_not_one_per_record(lateness):
    """Every click extends the session (a new end): the timers of the ends it had are
    deleted, so timer state (and every checkpoint) stays the size of the live sessions."""
    op = make(SessionWindows(100), lateness=lateness)
    for t in range(0, 50_000, 10):
        op.process([("k", t), ("j", t + 5)])
    assert len(op.timers) == 2 * (2 if lateness else 1)  # one to fire (and one to purge) a session
    assert sum(len(keys) for _, _, keys in op.snapshot(1)["timers"]) == len(op.timers)
    assert len(op.timers.times[0]) < 3_000  # the heap of deleted timestamps is compacted
    out = op.on_watermark(10**6)
    assert sorted(out) == [("j", 5, 50_095, 5_000), ("k", 0, 50_090, 5_000)]
