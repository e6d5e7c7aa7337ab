"""KeyedProcess: users' keyed operators with runtime-owned per-key state (value and map
state), snapshotted, re-split by key group and tracked for incremental checkpoints."""

from __future__ import annotations

import pytest

from abs_engine import codec
from abs_engine.checkpoint.incremental import apply
from abs_engine.keygroups import key_group, key_group_range
from abs_engine.runtime.increments import Increments
from operators import KeyedProcess
from operators.base import OperatorContext, RecordError


class Mean(KeyedProcess):
    def process_key(self, key, record, state):  # type: ignore[no-untyped-def]
        n, total = state.value or (0, 0)
        if record is None:
            del state.value  # forget the key
            return None
        state.value = (n + 1, total + record[1])
        return [(key, (total + record[1]) / (n + 1))]


class Seen(KeyedProcess):
    def __init__(self) -> None:  # no super().__init__(): allowed
        self.label = "seen"

    def process_key(self, key, record, state):  # type: ignore[no-untyped-def]
        m = state.map
        m[record[1]] = m.get(record[1], 0) + 1
        return [(key, len(m))]


def opened(op, index=0, parallelism=1):  # type: ignore[no-untyped-def]
    op.open(OperatorContext("op", index, parallelism, 0, False))
    return op


def test_value_state_per_key_and_forgetting_a_key():
    op = opened(Mean(key_fn=lambda r: r[0] if r else None))
    assert op.process([("a", 2), ("b", 10), ("a", 4)]) == [("a", 2.0), ("b", 10.0), ("a", 3.0)]
    assert op.snapshot(1) == {"a": (2, 6), "b": (1, 10)}
    op.key_fn = lambda r: "a" if r is None else r[0]
    assert op.process([None]) == []
    assert op.snapshot(2) == {"b": (1, 10)}


def test_map_state_and_an_init_without_super():
    op = opened(Seen())
    op.key_fn = lambda r: r[0]
    assert op.process([("k", 1), ("k", 2), ("k", 1), ("j", 1)]) == [("k", 1), ("k", 2), ("k", 2), ("j", 1)]
    assert op.snapshot(1) == {"k": {1: 2, 2: 1}, "j": {1: 1}}
    op.state["x"] = 5
    op.key_fn = lambda r: "x"
    with pytest.raises(RecordError) as info:  # names the record; the cause is the TypeError
        op.process([("x", 1)])
    assert info.value.record == ("x", 1) and "not a map" in str(info.value.__cause__)
    assert isinstance(info.value.__cause__, TypeError)


def test_restore_and_rescale_by_key_group():
    old = [opened(Mean(key_fn=lambda r: r[0]), i, 2) for i in range(2)]
    for i, op in enumerate(old):
        op.process([(k, 1) for k in range(i, 400, 2)])
    states = [codec.unpack_state(codec.pack(op.snapshot(1))) for op in old]
    new = []
    for i in range(3):
        groups = key_group_range(128, 3, i)
        op = opened(Mean(key_fn=lambda r: r[0]), i, 3)
        op.restore(op.rescale_state(states, i, 3, lambda k: key_group(k, 128) in groups))
        new.append(op)
    merged = {k: v for op in new for k, v in op.state.items()}
    assert merged == {k: [1, 1] for k in range(400)}
    assert sum(len(op.state) for op in new) == 400  # each key in exactly one subtask


def test_incremental_deltas_carry_changes_and_forgotten_keys():
    op = opened(Mean(key_fn=lambda r: r[0] if r else "gone"))
    inc = Increments([("mean", op)], True)
    op.process([(f"k{i}", 1) for i in range(2000)] + [("gone", 1)])
    states = {"mean": op.snapshot(1)}
    assert inc.prepare(1, states)[0] is None  # the first is full; tracking starts after it
    full = codec.unpack_state(codec.pack(states["mean"]))
    inc.completed(1)
    op.process([("k5", 3), None])  # one key changed, one forgotten
    states = {"mean": op.snapshot(2)}
    base, deltas, _ = inc.prepare(2, states)
    assert (base, deltas) == (1, ["mean"])
    d = codec.unpack_state(codec.pack(states["mean"].build()))
    assert d == {"upserts": {"k5": [2, 4]}, "deletes": {"gone": None}}
    assert apply(full, d) == codec.unpack_state(codec.pack(op.state))
