"""Keyed operators (Count, CountFinal, Reduce, ReduceFinal) and the stateless ones, against
plain-Python oracles; snapshot -> msgpack -> restore continues identically."""

from __future__ import annotations

import functools
import operator
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from abs_engine import codec
from operators.base import OperatorContext
from operators.basic import Filter, FlatMap, Identity, Map
from operators.keyed import Count, CountFinal, Reduce, ReduceFinal

CTX = OperatorContext(operator="op", subtask_index=0, parallelism=1, attempt=0, restored=False)
CTX_RESTORED = OperatorContext(operator="op", subtask_index=0, parallelism=1, attempt=1, restored=True)

keys = st.one_of(st.integers(-5, 5), st.sampled_from(["a", "b", "c", "é", ""]),
                 st.tuples(st.integers(0, 2), st.sampled_from(["x", "y"])))
batches = st.lists(st.lists(keys, max_size=20), max_size=8)
int_batches = st.lists(st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.integers(-100, 100)),
                                max_size=20), max_size=8)


def through_checkpoint(state):
    """State as a task writes it (codec.pack right at the snapshot) and reads it back."""
    return codec.unpack(codec.pack(state))


def run(op, batches):
    out = []
    for b in batches:
        out.extend(op.process(list(b)))
    return out


def fresh(op_factory):
    op = op_factory()
    op.open(CTX)
    return op


def split_run(op_factory, batches, cut):
    """Process batches[:cut], snapshot, restore into a fresh operator, process the rest.
    Returns (outputs, final results of the restored operator)."""
    first = fresh(op_factory)
    out = run(first, batches[:cut])
    state = through_checkpoint(first.snapshot(3))
    # the original keeps going after the barrier: that must not leak into the snapshot
    run(first, batches[cut:])
    second = op_factory()
    second.open(CTX_RESTORED)
    second.restore(state)
    out += run(second, batches[cut:])
    return out, second


def running_count_oracle(records, key=lambda r: r):
    c: Counter = Counter()
    out = []
    for r in records:
        k = key(r)
        c[k] += 1
        out.append((k, c[k]))
    return out


def running_reduce_oracle(records, fn, key):
    acc: dict = {}
    out = []
    for r in records:
        k = key(r)
        acc[k] = fn(acc[k], r) if k in acc else r
        out.append((k, acc[k]))
    return out


def flat(batches):
    return [r for b in batches for r in b]


# ---- Count -------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(batches=batches)
def test_count_matches_counter(batches):
    op = fresh(Count)
    assert run(op, batches) == running_count_oracle(flat(batches))
    assert op.state == dict(Counter(flat(batches)))


@settings(max_examples=150, deadline=None)
@given(batches=batches, data=st.data())
def test_count_snapshot_restore_continues_identically(batches, data):
    cut = data.draw(st.integers(0, len(batches)))
    out, second = split_run(Count, batches, cut)
    assert out == running_count_oracle(flat(batches))
    assert second.state == dict(Counter(flat(batches)))


def test_count_with_key_fn():
    op = Count(key_fn=lambda r: r[0])
    op.open(CTX)
    assert op.process([("a", 1), ("b", 2), ("a", 3)]) == [("a", 1), ("b", 1), ("a", 2)]
    assert op.process([]) == []
    assert op.finish() == []


def test_count_snapshot_is_msgpack_encodable_with_tuple_keys():
    op = fresh(Count)
    op.process([(1, "x"), (1, "x"), "s"])
    state = through_checkpoint(op.snapshot(1))
    assert state == {(1, "x"): 2, "s": 1}
    again = Count()
    again.restore(state)
    assert again.process([(1, "x")]) == [((1, "x"), 3)]


# ---- CountFinal ------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(batches=batches, data=st.data())
def test_count_final_matches_counter(batches, data):
    cut = data.draw(st.integers(0, len(batches)))
    out, second = split_run(CountFinal, batches, cut)
    assert out == []  # emits nothing until the end of input
    result = second.finish()
    assert len(result) == len({k for k, _ in result})
    assert dict(result) == Counter(flat(batches))


def test_count_final_with_key_fn_and_restore_type():
    op = CountFinal(key_fn=str.lower)
    op.open(CTX)
    op.process(["A", "a", "B"])
    state = through_checkpoint(op.snapshot(1))
    again = CountFinal(key_fn=str.lower)
    again.restore(state)
    assert isinstance(again.state, Counter)
    again.process(["b", "c"])
    assert dict(again.finish()) == {"a": 2, "b": 2, "c": 1}


def test_count_final_empty_input():
    op = fresh(CountFinal)
    assert op.finish() == []


# ---- Reduce / ReduceFinal -----------------------------------------------------------------


def add_values(acc, rec):
    return (rec[0], acc[1] + rec[1])


def max_values(acc, rec):
    return acc if acc[1] >= rec[1] else rec


def first_key(rec):
    return rec[0]


@settings(max_examples=150, deadline=None)
@given(batches=int_batches, data=st.data(), fn=st.sampled_from([add_values, max_values]))
def test_reduce_matches_functools_reduce(batches, data, fn):
    records = flat(batches)
    cut = data.draw(st.integers(0, len(batches)))
    out, second = split_run(lambda: Reduce(fn, key_fn=first_key), batches, cut)
    assert out == running_reduce_oracle(records, fn, first_key)
    for k in {r[0] for r in records}:
        assert second.state[k] == functools.reduce(fn, [r for r in records if r[0] == k])


@settings(max_examples=150, deadline=None)
@given(batches=int_batches, data=st.data(), fn=st.sampled_from([add_values, max_values]))
def test_reduce_final_matches_functools_reduce(batches, data, fn):
    records = flat(batches)
    cut = data.draw(st.integers(0, len(batches)))
    out, second = split_run(lambda: ReduceFinal(fn, key_fn=first_key), batches, cut)
    assert out == []
    expected = {k: functools.reduce(fn, [r for r in records if r[0] == k]) for k in {r[0] for r in records}}
    result = second.finish()
    assert len(result) == len(expected)
    assert dict(result) == expected


@settings(max_examples=100, deadline=None)
@given(batches=st.lists(st.lists(st.integers(-50, 50), max_size=15), max_size=6), data=st.data())
def test_reduce_without_key_fn_keys_by_record(batches, data):
    # key = the record itself: the running sum per key is k * occurrences
    cut = data.draw(st.integers(0, len(batches)))
    out, _ = split_run(lambda: Reduce(operator.add), batches, cut)
    assert out == running_reduce_oracle(flat(batches), operator.add, lambda r: r)


def test_reduce_first_record_is_the_initial_accumulator():
    calls = []

    def fn(acc, rec):
        calls.append((acc, rec))
        return acc + rec

    op = Reduce(fn, key_fn=lambda r: r % 2)
    op.open(CTX)
    assert op.process([1, 2, 3, 4]) == [(1, 1), (0, 2), (1, 4), (0, 6)]
    assert calls == [(1, 3), (2, 4)]


# ---- stateless operators ---------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(batch=st.lists(st.integers(-1000, 1000), max_size=30))
def test_stateless_operators(batch):
    assert fresh(lambda: Map(lambda x: x * 2)).process(list(batch)) == [x * 2 for x in batch]
    assert fresh(lambda: FlatMap(lambda x: [x] * (x % 3))).process(list(batch)) == [
        y for x in batch for y in [x] * (x % 3)]
    assert fresh(lambda: Filter(lambda x: x > 0)).process(list(batch)) == [x for x in batch if x > 0]
    assert fresh(Identity).process(list(batch)) == batch
    for op in (Map(str), FlatMap(lambda x: [x]), Filter(bool), Identity()):
        assert op.snapshot(1) is None
        assert op.finish() == []
