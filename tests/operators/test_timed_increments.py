"""Incremental checkpoints of timed operators (windows, keyed timers, interval joins;
operators/timers.py): a delta of the keys a record or a timer touched, their timers and the
watermark, applied on the last full state, is that state exactly, and an operator restored
from it goes on as the uninterrupted one does."""

from __future__ import annotations

import random
from typing import Any, Callable

import pytest

from abs_engine import codec
from abs_engine.checkpoint.incremental import PendingDelta, apply
from abs_engine.runtime.increments import MIN_STATE, Increments
from operators.base import OperatorContext
from operators.joins import IntervalJoin
from operators.window_assigners import SessionWindows, SlidingWindows, TumblingWindows
from operators.window_base import AGGREGATE, PROCESS
from operators.windows import WindowOperator

CTX = OperatorContext("op", 0, 1, 0, False)
KEYS = MIN_STATE * 2


def roundtrip(obj: Any) -> Any:
    return codec.unpack_state(codec.pack(obj))


def window(windows: Any, kind: str = AGGREGATE, lateness: int = 0) -> Callable[[], Any]:
    def make() -> Any:
        if kind == AGGREGATE:
            op = WindowOperator(windows, lambda r: r[1], AGGREGATE, lambda a, r: a + r[1] % 7, key_fn=lambda r: r[0],
                                allowed_lateness=lateness, create=lambda: 0, merge=lambda a, b: a + b)
        else:
            op = WindowOperator(windows, lambda r: r[1], PROCESS, lambda k, s, e, recs: [(k, s, e, len(recs))],
                                key_fn=lambda r: r[0], allowed_lateness=lateness)
        op.late_stream = True
        op.open(CTX)
        return op
    return make


def join() -> Any:
    op = IntervalJoin(-100, 100, lambda a, b: (a, b), (lambda r: r[0], lambda r: r[0]),
                      (lambda r: r[1], lambda r: r[1]))
    op.open(CTX)
    return op


def join_records(rng: random.Random, keys: list[int], t: int) -> list[Any]:
    return [(rng.randrange(2), (k, t + rng.randrange(3))) for k in keys]


def window_records(rng: random.Random, keys: list[int], t: int) -> list[Any]:
    return [(k, t + rng.randrange(3)) for k in keys]


def emitted(records: list[Any]) -> list[str]:
    """Records as the next task receives them (arrays as tuples: a restored tuple is a
    list in state), in one order."""
    return sorted(repr(codec.unpack(codec.pack(r))) for r in records)


def canonical_state(state: Any) -> Any:
    """A timed state with its timer rows in one order (rows and their keys)."""
    rows = sorted([d, ts, sorted(map(repr, keys))] for d, ts, keys in state["timers"])
    return {"keys": state["keys"], "timers": rows, "watermark": state["watermark"]}


CASES = {
    "sessions": (window(SessionWindows(40)), window_records),
    "tumbling+lateness": (window(TumblingWindows(20), lateness=10), window_records),
    "sliding panes": (window(SlidingWindows(200, 50)), window_records),
    "process": (window(TumblingWindows(25), kind=PROCESS), window_records),
    "interval join": (join, join_records),
}


@pytest.mark.parametrize("case", CASES)
def test_a_timed_delta_applied_on_the_full_state_is_the_state_and_restores_the_run(case: str) -> None:
    make, records = CASES[case]
    rng = random.Random(case)
    op, twin = make(), make()
    inc = Increments([("op", op)], True)
    t = 0

    def step(keys: list[int]) -> None:
        nonlocal t
        for o in (op, twin):
            batch = records(random.Random(t), keys, t)
            o.process(batch)
        t += 4
        for o in (op, twin):
            o.on_watermark(t - 6)

    step(list(range(KEYS)))  # every key at least once: a state of KEYS keys
    files: dict[int, Any] = {}
    for cid in range(1, 7):
        if cid > 1:
            for _ in range(3):  # a few hot keys, and timers firing
                step(rng.sample(range(KEYS), 20))
        states = {"op": op.snapshot(cid)}
        base, deltas, _ = inc.prepare(cid, states)
        written = states["op"].build() if isinstance(states["op"], PendingDelta) else states["op"]
        files[cid] = (base, roundtrip(written))
        whole = roundtrip(op.snapshot(cid))  # the state as a full file would hold it
        if base is None:
            assert not deltas
        else:
            assert deltas == ["op"] and base == cid - 1
            rebuilt = roundtrip(files[base][1]) if files[base][0] is None else resolved
            rebuilt = apply(rebuilt, files[cid][1])
            assert canonical_state(rebuilt) == canonical_state(whole)
            assert len(files[cid][1]["upserts"]) + len(files[cid][1]["deletes"]) < KEYS / 8
        resolved = roundtrip(whole) if base is None else rebuilt
        inc.completed(cid)
    assert any(b is not None for b, _ in files.values()), "no delta was written"
    # Restored from the chain, the operator goes on as the uninterrupted twin does.
    restored = make()
    restored.restore(resolved)
    for i in range(5):
        keys = rng.sample(range(KEYS), 50)
        batch = records(random.Random(1000 + i), keys, t)
        assert emitted(restored.process(batch)) == emitted(twin.process(batch))
        t += 30
        assert emitted(restored.on_watermark(t)) == emitted(twin.on_watermark(t))
    assert emitted(restored.on_watermark(float("inf"))) == emitted(twin.on_watermark(float("inf")))


def test_a_keyed_timed_process_with_its_own_process_is_written_whole() -> None:
    class Own(IntervalJoin):
        def process(self, batch: list[Any]) -> list[Any]:  # (tracks nothing)
            return super().process(batch)

    own = Own(-5, 5, lambda a, b: (a, b), (lambda r: r[0], lambda r: r[0]), (lambda r: r[1], lambda r: r[1]))
    own.open(CTX)
    assert not own.incremental and join().incremental and window(SessionWindows(3))().incremental


def test_a_malformed_timed_delta_is_refused() -> None:
    base = {"keys": {}, "timers": [], "watermark": 0}
    with pytest.raises(ValueError, match="timers"):
        apply(dict(base), {"upserts": {}, "deletes": {}, "timers": [[0, 1]], "watermark": 3})
    with pytest.raises(ValueError, match="keys, timers, watermark"):
        apply({"a": 1}, {"upserts": {}, "deletes": {}, "timers": [], "watermark": 3})
