"""Incremental checkpoints in real jobs: under SIGKILLs, and rescaled on restore, the
output equals the batch oracle, and the checkpoints really were deltas on shared files."""

from __future__ import annotations

import collections
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from abs_engine import Dataflow
from abs_engine.checkpoint.storage import CheckpointStorage
from abs_engine.testing import CapturingSink, GatedSource, KillOnCheckpoints, TestingSource
from operators import KeyedProcess
from tests.abs_engine.executors.test_rescaling import resumed_hold
from tests.chaos_checks import assert_each_kill_restored

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

WIDE, HOT = 50_000, 200


def items(n_hot: int) -> list[int]:
    """Every key of a wide key space once, then a long tail on a few hot keys: after the
    first checkpoints each one changes a few hundred keys of tens of thousands."""
    return list(range(WIDE)) + [i % HOT for i in range(n_hot)]


class RunningCount(KeyedProcess):
    """The count written as a user's keyed operator (runtime-owned value state)."""

    def process_key(self, key, record, state):  # type: ignore[no-untyped-def]
        state.value = (state.value or 0) + 1
        return [(key, state.value)]


def flow(records: list[int], sink: CapturingSink, parallelism: int, batch_size: int = 500,
         user_operator: bool = False, gate: Path | None = None, hold: int = 0) -> Dataflow:
    """``gate``: each source subtask holds after ``hold`` records until the file exists."""
    f = Dataflow("hot-keys", parallelism=parallelism)
    source: Any = TestingSource(records, batch_size=batch_size)
    if gate is not None:
        source = GatedSource(source, gate, after=hold)
    keyed = f.source(source, name="source").key_by()
    counts = keyed.apply_keyed(RunningCount(), name="count") if user_operator else keyed.count(name="count")
    # A sample of the running counts (each must still be emitted exactly once), so that the
    # single sink keeps up and barriers are not held up behind its backlog.
    counts.filter(sampled, name="sample").sink(sink, name="sink", parallelism=1)
    return f


def sampled(kv: tuple[int, int]) -> bool:
    return kv[1] % 50 == 1


def oracle(records: list[int]) -> collections.Counter[tuple[int, int]]:
    seen: collections.Counter[int] = collections.Counter()
    out: collections.Counter[tuple[int, int]] = collections.Counter()
    for k in records:
        seen[k] += 1
        if sampled((k, seen[k])):
            out[(k, seen[k])] += 1
    return out


def test_incremental_checkpoints_under_sigkills_are_exact(tmp_path):
    records, ck, gate = items(2_000_000), str(tmp_path / "ck"), tmp_path / "gate"
    sink = CapturingSink(tmp_path / "out")
    chaos = KillOnCheckpoints([2, 5, 8], seed=7, open_gate=gate)  # (held half-way until the kills)
    res = flow(records, sink, 2, gate=gate, hold=len(records) // 2 // 2).run(
        checkpoint_interval=0.01, checkpoint_dir=ck, incremental_checkpoints=True, chaos=chaos, restart_delay=0,
        retained_checkpoints=2)
    assert collections.Counter(tuple(r) for r in sink.records()) == oracle(records)
    assert_each_kill_restored(res, chaos, min_kills=len(chaos.after))  # (all mid-job: held)
    assert any(c.delta_tasks for c in res.checkpoints), "no checkpoint was incremental"
    # Retention kept what the retained checkpoints reference, and they verify.
    storage = CheckpointStorage(ck, retain=2)
    for cid in storage.completed_ids():
        storage.verify(cid)


@pytest.mark.parametrize("before,after,user_operator", [(2, 3, False), (3, 1, False), (2, 3, True)])
def test_an_incremental_checkpoint_rescales_exactly(tmp_path, before, after, user_operator):
    # The first run is held (a gated source) in its hot phase until a checkpoint holds
    # deltas, then stopped: it can neither finish first nor be stopped too early, however
    # fast the machine.
    records, ck, gate = items(300_000), str(tmp_path / "ck"), tmp_path / "gate"
    hold = (WIDE + 150_000) // before  # records per source subtask: the wide phase, then hot keys
    sink = CapturingSink(tmp_path / "out")
    first = flow(records, sink, before, batch_size=200, user_operator=user_operator, gate=gate, hold=hold).run(
        checkpoint_interval=0.01, checkpoint_dir=ck, incremental_checkpoints=True,
        stop_when=lambda r: any(c.delta_tasks for c in r.checkpoints))
    assert first.cancelled and first.checkpoints[-1].delta_tasks > 0  # resumed from a chain
    storage = CheckpointStorage(ck)
    last = storage.completed_ids()[-1]
    assert storage.load_metadata(last).chains and not storage.load_metadata(last).final
    # Held again half-way through what is left, until the kill (mid-job, at any speed).
    gate2 = tmp_path / "gate2"
    chaos = KillOnCheckpoints([2], seed=before * 10 + after, open_gate=gate2)
    hold = resumed_hold(ck, last, "source", len(records), after)
    res = flow(records, sink, after, batch_size=2_000, user_operator=user_operator, gate=gate2, hold=hold).run(
        checkpoint_interval=0.03, checkpoint_dir=ck, resume=True, incremental_checkpoints=True, chaos=chaos,
        restart_delay=0)
    assert res.restored_from[0] == last
    assert collections.Counter(tuple(r) for r in sink.records()) == oracle(records)
    assert_each_kill_restored(replace(res, restored_from=res.restored_from[1:]), chaos, min_kills=len(chaos.after))


USERS, HOT_USERS, GAP = 3_000, 60, 10**9


def click_ts(r: tuple[str, int]) -> int:
    return r[1]


def click_user(r: tuple[str, int]) -> str:
    return r[0]


def test_incremental_session_windows_under_sigkills_are_exact(tmp_path):
    """Sessions of every user stay open to the end; after the first checkpoints only a few
    hot users click: the windows' checkpoints are deltas (keys, their timers, the
    watermark), and the sessions that fire at the end are the batch oracle's."""
    from operators import SessionWindows

    users = list(range(USERS)) + [i % HOT_USERS for i in range(150_000)]
    clicks = [(f"u{u}", i) for i, u in enumerate(users)]
    gate = tmp_path / "gate"
    f = Dataflow("sessions", parallelism=2)
    source = GatedSource(TestingSource(clicks, batch_size=300), gate, after=(USERS + 30_000) // 2)
    (f.source(source, name="clicks", timestamps=click_ts).key_by(click_user)
     .window(SessionWindows(GAP), click_ts).aggregate(zero, plus_one, merge=add, name="sessions")
     .sink(CapturingSink(tmp_path / "out"), name="sink", parallelism=1))
    chaos = KillOnCheckpoints([3, 6], seed=5)
    res = f.run(checkpoint_interval=0.02, checkpoint_dir=str(tmp_path / "ck"), incremental_checkpoints=True,
                chaos=chaos, restart_delay=0,
                stop_when=lambda r: len(chaos.killed) == 2 and any(c.delta_tasks for c in r.checkpoints)
                and gate.touch())
    assert_each_kill_restored(res, chaos, min_kills=2)
    assert any(c.delta_tasks for c in res.checkpoints), "no window checkpoint was incremental"
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    count: collections.Counter[str] = collections.Counter()
    for u, t in clicks:
        first.setdefault(u, t)
        last[u] = t
        count[u] += 1
    expected = collections.Counter((u, first[u], last[u] + GAP, count[u]) for u in count)
    assert collections.Counter(tuple(r) for r in CapturingSink(tmp_path / "out").records()) == expected


def zero() -> int:
    return 0


def plus_one(n: int, r: Any) -> int:
    return n + 1


def add(a: int, b: int) -> int:
    return a + b
