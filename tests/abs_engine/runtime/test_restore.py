"""A worker's side of a restore (runtime/restore.py): in what order channel state is replayed
into a chain, and which records of a rescaled operator's channel state a subtask keeps."""

from __future__ import annotations

from typing import Any

from abs_engine.checkpoint.restore_spec import Inflight
from abs_engine.checkpoint.snapshot_file import TaskSnapshotData
from abs_engine.keygroups import key_group, key_group_range
from abs_engine.plan import TaskSpec
from abs_engine.runtime import restore


def snap(logs: dict[str, list[Any]]) -> TaskSnapshotData:
    return TaskSnapshotData({}, logs, False)


def test_a_rescaled_chain_replays_downstream_operators_first():
    """count -> sink fused: what was in flight into sink was sent before the cut, so sink
    must get it before what count emits when it replays its own channel state."""
    batches = restore.replay(snap({"count": ["a"], "sink": [("a", 5)]}), ["count", "sink"], rescaled=True)
    assert batches == [(1, [("a", 5)]), (0, ["a"])]


def test_a_restore_of_the_same_plan_replays_every_channel_into_the_head():
    assert restore.replay(snap({"x#0->y#0": [1, 2], "x#1->y#0": [3]}), ["y", "z"], rescaled=False) == [(0, [1, 2, 3])]
    assert restore.replay(snap({}), ["y"], rescaled=False) == []


def spec(index: int, parallelism: int) -> TaskSpec:
    return TaskSpec(f"op#{index}", "op", index, parallelism, (), ())


def test_keyed_channel_state_goes_to_the_owner_of_each_key_and_the_rest_is_dealt():
    """Pooled from two old subtasks, re-split over three: keyed records each to the subtask
    owning its key group (whatever channel carried it, even one whose producer's name holds
    '->'), unkeyed ones round robin; every record exactly once."""
    records = [(f"k{i}", i) for i in range(200)]
    snaps = {"op#0": snap({"in->put#0->op#0": records[:120]}), "op#1": snap({"in->put#1->op#1": records[120:]})}
    key_fns = {"op": lambda r: r[0]}
    for keyed in (True, False):
        f = Inflight("op", ("op#0", "op#1"), route=True, keyed=keyed)
        got = []
        for i in range(3):
            groups = key_group_range(128, 3, i)
            mine = restore._routed(f, snaps, spec(i, 3), key_fns, lambda k, g=groups: key_group(k, 128) in g)
            if keyed:
                assert all(key_group(r[0], 128) in groups for r in mine)
            got += mine
        assert sorted(got) == sorted(records)
