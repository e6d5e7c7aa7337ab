"""aggregate, aggregate_final, fold_final and stateful_map: against batch oracles, as
operators and in jobs under SIGKILLs, rescaled, with incremental checkpoints."""

from __future__ import annotations

import collections
import random
from dataclasses import replace

import pytest

from abs_engine import Dataflow
from abs_engine.errors import JobFailed
from abs_engine.testing import CapturingSink, GatedSource, KillOnCheckpoints, TestingSource
from operators import Aggregate, AggregateFinal, FoldFinal, StatefulMap
from operators.aggregate import MergeFinal, PreAggregate
from operators.base import OperatorContext, RecordError
from tests.chaos_checks import assert_each_kill_restored

EVENTS = [(f"u{random.Random(i).randrange(300)}", i % 97) for i in range(20_000)]  # (user, seconds)


def opened(op):  # type: ignore[no-untyped-def]
    op.open(OperatorContext("op", 0, 1, 0, False))
    return op


def user(r):  # type: ignore[no-untyped-def]
    return r[0]


def zero():  # type: ignore[no-untyped-def]
    return (0, 0)


def add(acc, r):  # type: ignore[no-untyped-def]
    return (acc[0] + 1, acc[1] + r[1])


def mean(acc):  # type: ignore[no-untyped-def]
    return acc[1] / acc[0]


def sessions(state, r):  # type: ignore[no-untyped-def]
    """Per user: the running total of a session; a record of 0 s ends it (state dropped)."""
    if r[1] == 0:
        return None, ("end", state or 0)
    total = (state or 0) + r[1]
    return total, ("open", total)


def oracle_running_mean(events):  # type: ignore[no-untyped-def]
    acc: dict[str, tuple[int, int]] = {}
    out = []
    for r in events:
        acc[r[0]] = add(acc.get(r[0], zero()), r)
        out.append((r[0], mean(acc[r[0]])))
    return out


def oracle_sessions(events):  # type: ignore[no-untyped-def]
    state: dict[str, int] = {}
    out = []
    for r in events:
        new, emitted = sessions(state.get(r[0]), r)
        if new is None:
            state.pop(r[0], None)
        else:
            state[r[0]] = new
        out.append((r[0], emitted))
    return out


def test_aggregate_emits_the_running_result_per_key():
    op = opened(Aggregate(zero, add, mean, key_fn=user))
    assert op.process(EVENTS[:1000]) + op.process(EVENTS[1000:3000]) == oracle_running_mean(EVENTS[:3000])


def test_aggregate_final_and_fold_final_emit_once_per_key_at_the_end():
    op = opened(AggregateFinal(zero, add, mean, key_fn=user))
    assert op.process(EVENTS) == []
    expected = dict(oracle_running_mean(EVENTS))  # the last running value of each key
    assert dict(op.finish()) == expected and len(op.finish()) == len(expected)
    fold = opened(FoldFinal(list, lambda acc, r: acc + [r[1]], key_fn=user))
    fold.process(EVENTS)
    by_user = collections.defaultdict(list)
    for u, s in EVENTS:
        by_user[u].append(s)
    assert dict(fold.finish()) == by_user


def merge(a, b):  # type: ignore[no-untyped-def]
    return (a[0] + b[0], a[1] + b[1])


def test_pre_aggregation_sends_one_partial_per_key_and_batch_and_merges_to_the_same_result():
    pre = opened(PreAggregate(zero, add, key_fn=user))
    final = opened(MergeFinal(merge, mean))
    sent = 0
    for i in range(0, len(EVENTS), 1000):
        partials = pre.process(EVENTS[i:i + 1000])
        assert len(partials) == len({u for u, _ in EVENTS[i:i + 1000]})  # one per key in the batch
        sent += len(partials)
        # Partials cross a process: a tuple accumulator arrives as msgpack decodes it.
        assert final.process([(k, list(acc)) for k, acc in partials]) == []
    assert sent < len(EVENTS) / 2
    assert dict(final.finish()) == dict(oracle_running_mean(EVENTS))
    skipping = opened(PreAggregate(zero, lambda a, r: add(a, r) if r[1] != 13 else 1 / 0, key_fn=user,
                                   on_error="skip"))
    assert dict(skipping.process([("a", 1), ("a", 13), ("a", 2)])) == {"a": (2, 3)}
    assert [r for r, _ in skipping.skipped] == [("a", 13)]
    with pytest.raises(RecordError) as info:
        opened(PreAggregate(zero, lambda a, r: 1 / 0, key_fn=user)).process([("b", 7)])
    assert info.value.record == ("b", 7)


def test_stateful_map_keeps_and_drops_state():
    op = opened(StatefulMap(sessions, key_fn=user))
    assert op.process(EVENTS) == oracle_sessions(EVENTS)
    assert all(v != 0 for v in op.state.values())


def test_a_failing_function_leaves_the_state_unchanged_and_names_the_record():
    def picky(acc, r):  # type: ignore[no-untyped-def]
        if r[1] == 13:
            raise ValueError("13")
        return add(acc, r)

    op = opened(Aggregate(zero, picky, key_fn=user, on_error="skip"))
    op.process([("a", 1), ("a", 13), ("a", 2)])
    assert op.state == {"a": (2, 3)} and [r for r, _ in op.skipped] == [("a", 13)]
    strict = opened(Aggregate(zero, picky, key_fn=user))
    with pytest.raises(RecordError) as info:
        strict.process([("a", 1), ("a", 13)])
    assert info.value.record == ("a", 13) and strict.state == {"a": (1, 1)}
    bad = opened(StatefulMap(lambda s, r: r[1], key_fn=user))  # not (state, output)
    with pytest.raises(RecordError) as info:
        bad.process([("a", 1)])
    assert "must return (state, output)" in str(info.value.__cause__)


def jobs(events, sink, parallelism, batch_size=100, gate=None):  # type: ignore[no-untyped-def]
    """With ``gate``: the source holds half-way through the events until the file exists."""
    f = Dataflow("dwell", parallelism=parallelism)
    source = TestingSource(events, batch_size=batch_size)
    if gate is not None:
        source = GatedSource(source, gate, after=len(events) // 2)
    # One source subtask: the running values depend on each key's record order, which it fixes.
    keyed = f.source(source, name="events", parallelism=1).key_by(user)
    means = keyed.aggregate(zero, add, mean, name="mean")
    ends = keyed.stateful_map(sessions, name="sessions").filter(lambda kv: kv[1][0] == "end", name="ends")
    means.union(ends, name="both").sink(sink, name="sink", parallelism=1)
    return f


def as_multiset(records):  # type: ignore[no-untyped-def]
    return collections.Counter(repr(tuple(r) if isinstance(r, list) else r) for r in records)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_aggregate_and_stateful_map_jobs_are_exact_under_sigkills_and_a_rescale(tmp_path):
    events = EVENTS * 20
    expected = oracle_running_mean(events) + [kv for kv in oracle_sessions(events) if kv[1][0] == "end"]
    sink, ck, gate = CapturingSink(tmp_path / "out"), str(tmp_path / "ck"), tmp_path / "gate"
    # Held half-way (the gate closed): the first run is stopped mid-job, however fast it runs;
    # the second resumes held too, until the chaos has made its kills and opens the gate.
    first = jobs(events, sink, 2, batch_size=20, gate=gate).run(checkpoint_interval=0.02, checkpoint_dir=ck,
                                                                incremental_checkpoints=True,
                                                                stop_when=lambda r: len(r.checkpoints) >= 2)
    assert first.cancelled
    last = max(c.checkpoint_id for c in first.checkpoints)
    chaos = KillOnCheckpoints([1, 3], seed=11, open_gate=gate)
    res = jobs(events, sink, 3, gate=gate).run(checkpoint_interval=0.02, checkpoint_dir=ck, resume=True,
                                               chaos=chaos, incremental_checkpoints=True, restart_delay=0)
    assert res.restored_from[0] == last
    # The run began with a restore (from `last`); every kill after it restored once more.
    assert_each_kill_restored(replace(res, restored_from=res.restored_from[1:]), chaos, min_kills=len(chaos.after))
    got = [(k, tuple(v) if isinstance(v, list) else v) for k, v in sink.records()]
    assert as_multiset(got) == as_multiset(expected)


@pytest.mark.slow
def test_a_poison_record_in_aggregate_fails_the_job_naming_it(tmp_path):
    def poison(acc, r):  # type: ignore[no-untyped-def]
        if r == ("u1", 42):
            raise ValueError("bad dwell time")
        return add(acc, r)

    f = Dataflow("poison", parallelism=1)
    f.source(TestingSource([("u0", 1), ("u1", 42)]), name="events").key_by(user).aggregate(
        zero, poison, name="mean").sink(CapturingSink(tmp_path / "o"), name="sink")
    with pytest.raises(JobFailed) as info:
        f.run(checkpoint_interval=0.05, restart_attempts=2, restart_delay=0)
    assert info.value.operator == "mean" and "42" in str(info.value)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_aggregate_final_with_merge_is_exact_under_sigkills_and_chains_the_pre_aggregation(tmp_path):
    events, gate = EVENTS * 10, tmp_path / "gate"
    f = Dataflow("dwell", parallelism=2)
    # Each source subtask holds half-way through its events until the chaos has made its kills.
    source = GatedSource(TestingSource(events, batch_size=50), gate, after=len(events) // 2 // 2)
    f.source(source, name="events").key_by(user).aggregate_final(
        zero, add, mean, merge=merge, name="mean").sink(CapturingSink(tmp_path / "out"), name="sink",
                                                         parallelism=1)
    plan = f.explain()
    # The pre-aggregation is fused into the source's task: only partials cross the shuffle.
    assert "events [GatedSource] -> mean_pre [pre_aggregate(key=user)]" in plan, plan
    assert "mean [aggregate_final(key=user, merge=merge)]" in plan, plan
    chaos = KillOnCheckpoints([1, 3], seed=5, open_gate=gate)
    res = f.run(checkpoint_interval=0.02, checkpoint_dir=str(tmp_path / "ck"), chaos=chaos, restart_delay=0)
    assert_each_kill_restored(res, chaos, min_kills=len(chaos.after))  # (all mid-job: held)
    got = CapturingSink(tmp_path / "out").records()
    expected = dict(oracle_running_mean(events))
    assert len(got) == len(expected) and {k: v for k, v in got} == expected
