"""Event time end to end, in real worker processes: windows, keyed timers and an interval
join against plain batch oracles with workers SIGKILLed right after checkpoints (aligned and
unaligned); late data judged exactly as a single-threaded replay of the source's batches
says; an idle split that does not stall the job."""

from __future__ import annotations

import bisect
import os
import random
import time
from collections import defaultdict
from typing import Any

import pytest

from abs_engine import Dataflow
from abs_engine.testing import CapturingSink, KillOnCheckpoints, TestingSource
from abs_engine.testing import GatedSource as HeldSource
from operators.base import Source
from operators.eventtime import BoundedOutOfOrderness, ascending
from operators.timers import KeyedTimedProcess
from operators.windows import SessionWindows, SlidingWindows, TumblingWindows
from tests.chaos_checks import assert_each_kill_restored
from tests.operators.test_windows import sessions_oracle

pytestmark = pytest.mark.slow

DELAY = 40


def out_of_order(n: int, seed: int, keys: int = 7) -> list[tuple[str, int]]:
    """Timestamps up to DELAY behind the newest of the whole stream: within every subtask's
    bound too, so no record is ever late, whatever the interleaving."""
    rng = random.Random(seed)
    out, now = [], 0
    for _ in range(n):
        now += rng.randrange(0, 4)
        out.append((f"k{rng.randrange(keys)}", now - rng.randrange(0, DELAY)))
    return out


def held(source: Any, tmp_path: Any, after: int) -> Any:
    """``source``, each subtask held after ``after`` records until the kills are done (the
    gate of ``killing``): a job cannot end before its kills, however fast or slow it runs."""
    return HeldSource(source, tmp_path / "kills-done", after=after)


def killing(after: list[int], seed: int, tmp_path: Any) -> KillOnCheckpoints:
    return KillOnCheckpoints(after, seed=seed, open_gate=tmp_path / "kills-done")


class PacedSource(TestingSource[Any]):
    """A TestingSource that takes 10 ms a batch: a small job that lives for many checkpoints
    (the workload's pace, not a synchronisation: nothing waits on it)."""

    def read_batch(self) -> list[Any] | None:
        time.sleep(0.01)
        return super().read_batch()


def window_oracle(recs: list[tuple[str, int]], windows: Any) -> list[tuple[Any, ...]]:
    if isinstance(windows, SessionWindows):
        return [tuple(r) for r in sessions_oracle(recs, windows.gap)]
    counts: dict[tuple[str, int, int], int] = defaultdict(int)
    for k, t in recs:
        size = windows.size
        step = getattr(windows, "slide", size)
        for s in range(t - t % step, t - size, -step):
            counts[(k, s, s + size)] += 1
    return sorted((k, s, e, c) for (k, s, e), c in counts.items())


def times_by_key(recs: list[tuple[str, int]]) -> dict[str, list[int]]:
    """Each key's timestamps, sorted."""
    times: dict[str, list[int]] = defaultdict(list)
    for k, t in recs:
        times[k].append(t)
    for ts in times.values():
        ts.sort()
    return times


def _ts(r: Any) -> int:
    return int(r[1])


def _key(r: Any) -> str:
    return str(r[0])


# Every kind of window once, each mode at least once.
@pytest.mark.parametrize("windows, mode", [
    pytest.param(TumblingWindows(200), "aligned", id="tumbling-aligned"),
    pytest.param(SlidingWindows(200, 50), "unaligned", id="sliding-unaligned"),
    pytest.param(SessionWindows(6), "unaligned", id="session-unaligned"),
])
def test_windows_exactly_once_under_sigkill(tmp_path, windows, mode):
    recs = out_of_order(60_000, seed=1)
    flow = Dataflow("windows", parallelism=2)
    res = (flow.source(held(PacedSource(recs, batch_size=200), tmp_path, 6_000), timestamps=_ts,
                       watermarks=BoundedOutOfOrderness(DELAY))
           .key_by(_key).window(windows, _ts)
           .aggregate(lambda: 0, lambda a, r: a + 1, merge=lambda a, b: a + b))
    res.sink(CapturingSink(tmp_path / "out"), parallelism=1)
    res.late.sink(CapturingSink(tmp_path / "late"), parallelism=1)
    chaos = killing([2, 5], 3, tmp_path)
    result = flow.run(chaos=chaos, restart_delay=0, checkpoint_interval=0.02, checkpoint_dir=str(tmp_path / "ck"),
                      mode=mode)
    assert_each_kill_restored(result, chaos, min_kills=1)
    assert CapturingSink(tmp_path / "late").records() == []
    assert sorted(tuple(r) for r in CapturingSink(tmp_path / "out").records()) == window_oracle(recs, windows)


def late_oracle(recs: list[tuple[str, int]], batch: int, delay: int, size: int, lateness: int):
    """A single-subtask source sends its batches and, after each, the watermark ``newest -
    delay - 1``: a record is judged against the watermark of the batches before its own.
    Per tumbling window: one result when the watermark first reaches its end - 1 (if it has
    records then), one more for each record accepted after that; a record is accepted
    while the watermark is below end - 1 + lateness, and late (side output) otherwise."""
    marks, newest = [], float("-inf")
    for i in range(0, len(recs), batch):
        newest = max([newest] + [t for _, t in recs[i:i + batch]])
        marks.append(newest - delay - 1)
    marks[-1] = float("inf")
    counts: dict[tuple[str, int], int] = defaultdict(int)
    out, late = [], []
    fired: set[tuple[str, int]] = set()
    for b, i in enumerate(range(0, len(recs), batch)):
        before = marks[b - 1] if b else float("-inf")
        for k, t in recs[i:i + batch]:
            s = t - t % size
            if s + size - 1 + lateness <= before:
                late.append((k, t))
                continue
            counts[(k, s)] += 1
            if s + size - 1 <= before:
                out.append((k, s, s + size, counts[(k, s)]))
        for (k, s), c in counts.items():
            if (k, s) not in fired and s + size - 1 <= marks[b]:
                fired.add((k, s))
                out.append((k, s, s + size, c))
    return sorted(out), sorted(late)


def test_late_data_allowed_lateness_and_side_output_exact_under_sigkill(tmp_path):
    """One source subtask (so the order of records and watermarks is fixed), windows at
    parallelism 2: stragglers far behind the watermark are re-fired within the lateness and
    sent to ``.late`` beyond it, exactly as the oracle says, across kills and restores."""
    rng = random.Random(5)
    recs = []
    for i, (k, t) in enumerate(out_of_order(12_000, seed=2, keys=3)):
        recs.append((k, t))
        if i % 97 == 0 and t > 400:
            recs.append((k, t - rng.randrange(50, 400)))  # a straggler: late, maybe beyond the lateness
    flow = Dataflow("late", parallelism=2)
    res = (flow.source(held(PacedSource(recs, batch_size=100), tmp_path, 3_000), parallelism=1, timestamps=_ts,
                       watermarks=BoundedOutOfOrderness(DELAY))
           .key_by(_key).window(TumblingWindows(100), _ts, allowed_lateness=150)
           .aggregate(lambda: 0, lambda a, r: a + 1))
    res.sink(CapturingSink(tmp_path / "out"), parallelism=1)
    res.late.sink(CapturingSink(tmp_path / "late"), parallelism=1)
    chaos = killing([2, 4], 1, tmp_path)
    result = flow.run(chaos=chaos, restart_delay=0, checkpoint_interval=0.02, checkpoint_dir=str(tmp_path / "ck"))
    assert_each_kill_restored(result, chaos, min_kills=1)
    out, late = late_oracle(recs, 100, DELAY, 100, 150)
    assert late and any(o[3] > 1 for o in out)  # the data has both kinds
    assert sorted(tuple(r) for r in CapturingSink(tmp_path / "late").records()) == late
    assert sorted(tuple(r) for r in CapturingSink(tmp_path / "out").records()) == out


class CountUntil(KeyedTimedProcess):
    """At event time ``ts + 10`` of each record: how many records of its key are at or
    before that (all have arrived: the watermark passed it)."""

    def process_key(self, key, record, state, ctx):
        m = state.map
        m[ctx.timestamp] = m.get(ctx.timestamp, 0) + 1
        ctx.register_event_time(ctx.timestamp + 10)

    def on_timer(self, key, timestamp, domain, state, ctx):
        return [(key, timestamp, sum(n for t, n in state.map.items() if t <= timestamp))]


def test_keyed_event_time_timers_exactly_once_under_sigkill(tmp_path):
    recs = out_of_order(20_000, seed=4)
    flow = Dataflow("timers", parallelism=2)
    (flow.source(held(PacedSource(recs, batch_size=200), tmp_path, 2_000), timestamps=_ts,
                 watermarks=BoundedOutOfOrderness(DELAY))
     .key_by(_key).apply_keyed(CountUntil(), "count_until", timestamp=_ts)
     .sink(CapturingSink(tmp_path / "out"), parallelism=1))
    chaos = killing([2, 5], 2, tmp_path)
    result = flow.run(chaos=chaos, restart_delay=0, checkpoint_interval=0.02, checkpoint_dir=str(tmp_path / "ck"))
    assert_each_kill_restored(result, chaos, min_kills=1)
    times = times_by_key(recs)
    expected = sorted({(k, t + 10, bisect.bisect_right(times[k], t + 10)) for k, t in recs})
    assert sorted(tuple(r) for r in CapturingSink(tmp_path / "out").records()) == expected


def _join(left: Any, right: Any) -> tuple[Any, ...]:
    return (left[0], left[1], right[1])


def test_interval_join_exactly_once_under_sigkill(tmp_path):
    lefts = out_of_order(6_000, seed=6, keys=20)
    rights = out_of_order(6_000, seed=7, keys=20)
    flow = Dataflow("join", parallelism=2)
    a = flow.source(held(PacedSource(lefts, batch_size=100), tmp_path, 500), "left", timestamps=_ts,
                    watermarks=BoundedOutOfOrderness(DELAY))
    b = flow.source(held(PacedSource(rights, batch_size=100), tmp_path, 500), "right", timestamps=_ts,
                    watermarks=BoundedOutOfOrderness(DELAY))
    a.interval_join(b, _key, _key, _ts, _ts, -5, 10, _join, name="join").sink(
        CapturingSink(tmp_path / "out"), parallelism=1)
    chaos = killing([2, 4], 5, tmp_path)
    result = flow.run(chaos=chaos, restart_delay=0, checkpoint_interval=0.02, checkpoint_dir=str(tmp_path / "ck"))
    assert_each_kill_restored(result, chaos, min_kills=1)
    by_key = times_by_key(rights)
    expected = sorted((k, t, rt) for k, t in lefts for rt in by_key[k] if t - 5 <= rt <= t + 10)
    assert expected and result.skipped_records == 0
    assert sorted(tuple(r) for r in CapturingSink(tmp_path / "out").records()) == expected


class GatedSource(Source[Any]):
    """Subtask 0 reads ``first`` at once; subtask 1 reads nothing until ``gate`` exists (it
    fails the job if the gate never opens), then ``second``; subtask 0 stays open until
    subtask 1 is done and ``seen`` exists: a record of ``second`` has reached its window
    task. (Its end sends watermark +inf, on another channel than ``second``'s records: had
    it reached the window task first, while subtask 1 was still idle there, ``second``
    would have come late.)"""

    def __init__(self, first: list[Any], second: list[Any], gate: str, done: str, seen: str):
        self.first, self.second, self.gate, self.done, self.seen = first, second, gate, done, seen

    def open(self, ctx: Any) -> None:
        super().open(ctx)
        self.pos = 0
        self.began = time.monotonic()

    def read_batch(self) -> list[Any] | None:
        mine = self.first if self.ctx.subtask_index == 0 else self.second
        if self.ctx.subtask_index == 1 and not os.path.exists(self.gate):
            if time.monotonic() - self.began > 60:
                raise RuntimeError("the idle split's gate never opened: the job waited on the idle split")
            time.sleep(0.005)
            return []
        if self.pos < len(mine):
            self.pos += 100
            return mine[self.pos - 100:self.pos]
        if self.ctx.subtask_index == 1:
            open(self.done, "w").close()
            return None
        if not (os.path.exists(self.done) and os.path.exists(self.seen)):
            if time.monotonic() - self.began > 60:
                raise RuntimeError("the second split's records never reached their window task")
            time.sleep(0.005)
            return []
        return None

    def snapshot(self, checkpoint_id: int) -> Any:
        return self.pos

    def restore(self, state: Any) -> None:
        self.pos = state


def test_an_idle_split_does_not_stall_the_windows(tmp_path):
    """Split 1 sends nothing until a window result has been seen downstream: only because
    it declares itself idle can the windows of split 0 fire. Then its own records come, and
    every window is exact."""
    first = [("a", t) for t in range(0, 3000, 3)]
    second = [("b", t) for t in range(10_000, 12_000, 7)]
    gate, done, seen = str(tmp_path / "gate"), str(tmp_path / "done"), str(tmp_path / "seen")

    def open_gate(r: Any) -> Any:
        open(gate, "w").close()
        return r

    def add(a: int, r: Any) -> int:  # (in the window task, as the record arrives)
        if r[0] == "b" and not os.path.exists(seen):
            open(seen, "w").close()
        return a + 1

    flow = Dataflow("idle", parallelism=2)
    res = (flow.source(GatedSource(first, second, gate, done, seen), timestamps=_ts,
                       watermarks=ascending(idle_timeout=0.2))
           .key_by(_key).window(TumblingWindows(500), _ts).aggregate(lambda: 0, add))
    res.map(open_gate, "open_gate").sink(CapturingSink(tmp_path / "out"), parallelism=1)
    result = flow.run(checkpoint_interval=0.2, checkpoint_dir=str(tmp_path / "ck"))
    assert result.restarts == 0
    assert sorted(tuple(r) for r in CapturingSink(tmp_path / "out").records()) == window_oracle(
        first + second, TumblingWindows(500))


class ThenWait(Source[Any]):
    """Reads ``records`` in one batch, then nothing until every file of ``gates`` exists
    (failing the job after 60 s: a job that waits on a gate nobody opens must not hang the
    test), then ends."""

    def __init__(self, records: list[Any], gates: list[str]):
        self.records, self.gates = records, gates

    def open(self, ctx: Any) -> None:
        super().open(ctx)
        self.done, self.began = False, time.monotonic()

    def read_batch(self) -> list[Any] | None:
        if not self.done:
            self.done = True
            return self.records if self.ctx.subtask_index == 0 else []
        if all(os.path.exists(g) for g in self.gates):
            return None
        if time.monotonic() - self.began > 60:
            raise RuntimeError("the gate never opened: a processing-time timer never fired")
        time.sleep(0.005)
        return []

    def snapshot(self, checkpoint_id: int) -> Any:
        return self.done

    def restore(self, state: Any) -> None:
        self.done = bool(state)


class CountThenReport(KeyedTimedProcess):
    """Counts a key's records; 1.5 s (wall clock) after its first, emits ``(key, count)``."""

    def process_key(self, key, record, state, ctx):
        if state.value is None:
            ctx.register_processing_time(time.time() + 1.5)
        state.value = (state.value or 0) + 1

    def on_timer(self, key, timestamp, domain, state, ctx):
        return [(key, state.value)]


def test_restored_processing_time_timers_fire_without_new_records(tmp_path):
    """Workers are killed while every key's processing-time timer is pending and no record
    will come again: the restored timers must fire by themselves, once each. The source
    ends only once every key has reported: a processing-time timer still pending at the end
    of input does not fire (as in Flink), and the two report subtasks' timers are due a few
    milliseconds apart."""
    recs = [(f"k{i % 5}", i) for i in range(200)]
    gates = [str(tmp_path / f"reported-k{i}") for i in range(5)]

    def open_gate(r: Any) -> Any:
        open(str(tmp_path / f"reported-{r[0]}"), "w").close()
        return r

    flow = Dataflow("ptimers", parallelism=2)
    (flow.source(ThenWait(recs, gates)).key_by(_key).apply_keyed(CountThenReport(), "report")
     .map(open_gate, "open_gate").sink(CapturingSink(tmp_path / "out"), parallelism=1))
    chaos = KillOnCheckpoints([2], seed=1)
    result = flow.run(chaos=chaos, restart_delay=0, checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / "ck"))
    assert_each_kill_restored(result, chaos, min_kills=1)
    assert sorted(tuple(r) for r in CapturingSink(tmp_path / "out").records()) == [(f"k{i}", 40) for i in range(5)]
