"""Keyed timers: firing order is (timestamp, key encoding) whatever the registration order,
deletion, snapshot/restore, rescale by key group, and KeyedTimedProcess driven directly."""

from __future__ import annotations

import random

from abs_engine import codec
from operators.base import OperatorContext
from operators.timers import EVENT, PROCESSING, KeyedTimedProcess, TimerService

CTX = OperatorContext("t", 0, 1, 0, False)


def _fire_all(ts: TimerService, domain: int, until: float) -> list:
    return list(ts.pop_due(domain, until))


def test_firing_order_does_not_depend_on_registration_order():
    timers = [(k, t) for k in ["a", "b", 3, ("x", 1)] for t in [5, 1, 9, 5]]
    orders = []
    for seed in range(5):
        shuffled = timers[:]
        random.Random(seed).shuffle(shuffled)
        ts = TimerService()
        for k, t in shuffled:
            ts.register(EVENT, k, t)
        orders.append(_fire_all(ts, EVENT, 100))
    assert all(o == orders[0] for o in orders)
    assert [t for _, t in orders[0]] == sorted(t for _, t in orders[0])
    assert len(orders[0]) == 4 * 3  # a timer registered twice fires once


def test_only_due_timers_fire_and_deleted_ones_never():
    ts = TimerService()
    for t in (10, 20, 30):
        ts.register(EVENT, "k", t)
    ts.register(PROCESSING, "k", 15)
    ts.delete(EVENT, "k", 20)
    assert _fire_all(ts, EVENT, 25) == [("k", 10)]
    assert ts.next_due(EVENT) == 30
    assert ts.next_due(PROCESSING) == 15
    assert _fire_all(ts, EVENT, 100) == [("k", 30)]
    assert _fire_all(ts, PROCESSING, 100) == [("k", 15)]
    assert len(ts) == 0 and ts.next_due(EVENT) is None


def test_snapshot_restore_and_rescale():
    ts = TimerService()
    for k in range(20):
        ts.register(EVENT, k, 100 - k)
        ts.register(PROCESSING, k, 1000 + k)
    snap = ts.snapshot()
    back = TimerService()
    back.restore(snap)
    assert _fire_all(back, EVENT, 1e9) == _fire_all(ts, EVENT, 1e9)
    evens = TimerService()
    evens.restore(snap, owns=lambda k: k % 2 == 0)
    assert [k for k, _ in _fire_all(evens, PROCESSING, 1e9)] == list(range(0, 20, 2))


class CountUntil(KeyedTimedProcess):
    """Per key: at timer t (a record's timestamp + 10) emits how many of its records have a
    timestamp <= t."""

    def process_key(self, key, record, state, ctx):
        state.value = (state.value or ()) + (ctx.timestamp,)
        ctx.register_event_time(ctx.timestamp + 10)

    def on_timer(self, key, timestamp, domain, state, ctx):
        return [(key, timestamp, sum(1 for t in state.value if t <= timestamp))]


def _run(records, marks, restore_at=None):
    op = CountUntil()
    op.key_fn, op.timestamp_fn = (lambda r: r[0]), (lambda r: r[1])
    op.open(CTX)
    out = []
    for i, (batch, wm) in enumerate(zip(records, marks)):
        if i == restore_at:
            snap = codec.unpack(codec.pack(op.snapshot(i)))  # as a checkpoint holds it
            op = CountUntil()
            op.key_fn, op.timestamp_fn = (lambda r: r[0]), (lambda r: r[1])
            op.open(CTX)
            op.restore(snap)
        out += op.process(batch)
        out += op.on_watermark(wm)
    return out


def test_keyed_timed_process_and_a_restore_in_between_give_the_same_output():
    rng = random.Random(3)
    batches, marks, now = [], [], 0
    for _ in range(30):
        batch = [(rng.choice("abc"), now + rng.randrange(0, 20)) for _ in range(5)]
        batches.append(batch)
        now += 10
        marks.append(now - 25)  # a watermark 25 behind: no record here is late
    marks[-1] = float("inf")
    plain = _run(batches, marks)
    everything = [r for b in batches for r in b]
    expected = {(k, t + 10, sum(1 for k2, t2 in everything if k2 == k and t2 <= t + 10)) for k, t in everything}
    assert set(plain) == expected and len(plain) == len(expected)
    for at in (1, 7, 20):
        assert _run(batches, marks, restore_at=at) == plain
