"""Planning a restore at another parallelism (checkpoint/rescale.py): which old state files
each new task reads and which of its operators are re-split; what is refused."""

from __future__ import annotations

import pytest

from abs_engine import Dataflow
from abs_engine.checkpoint.rescale import restore_specs
from abs_engine.checkpoint.restore_spec import Rescale, SamePlan
from abs_engine.checkpoint.metadata import FileRef, Metadata
from abs_engine.errors import RescaleError, RescaleErrorReason
from abs_engine.testing import TestingSource
from operators import FileSink


def plan(parallelism: int, extra_map: bool = False):  # type: ignore[no-untyped-def]
    flow = Dataflow("wc", parallelism=parallelism)
    s = flow.source(TestingSource(["a b"]), name="src").flat_map(str.split, name="split")
    if extra_map:
        s = s.map(str.upper, name="upper")
    s.key_by().count_final(name="count").sink(FileSink("/nonexistent/out"), name="sink", parallelism=1)
    return flow.compile()


def meta_of(p, cid: int = 7, final: bool = False) -> Metadata:  # type: ignore[no-untyped-def]
    tasks = {t.id: FileRef(f"{t.id}.x.state", 10, "0" * 64) for t in p.tasks}
    return Metadata(checkpoint_id=cid, job="wc", fingerprint=p.fingerprint(), created=0.0, final=final,
                    tasks=tasks, alignment_ms={}, duration_ms=1.0, layout=p.layout())


def test_the_shape_ignores_parallelism_and_chaining_but_not_operators():
    assert plan(1).shape() == plan(2).shape() == plan(4).shape()
    assert plan(1).fingerprint() != plan(2).fingerprint()
    assert plan(2, extra_map=True).shape() != plan(2).shape()


def test_the_same_plan_restores_one_file_per_task():
    p = plan(2)
    specs = restore_specs(p, meta_of(p), "/ck", 128)
    assert set(specs) == {t.id for t in p.tasks}
    assert all(isinstance(s, SamePlan) and s.file.file == f"{t}.x.state" for t, s in specs.items())


@pytest.mark.parametrize("before,after", [(2, 3), (4, 1), (1, 4)])
def test_a_rescale_gives_each_new_subtask_every_old_subtask_of_a_changed_operator(before, after):
    old, new = plan(before), plan(after)
    specs = restore_specs(new, meta_of(old), "/ck", 128)
    old_counts = old.layout()["operators"]["count"]
    for t in new.tasks:
        r = specs[t.id]
        assert isinstance(r, Rescale)
        inflight = {f.operator: f for f in r.inflight}
        if "count" in r.operators:
            assert list(r.operators["count"]) == old_counts and "count" in r.changed
            # count's channel state is re-routed, by key group: count is keyed
            assert inflight["count"].route and list(inflight["count"].sources) == old_counts
            assert inflight["count"].keyed
        if "sink" in r.operators:  # parallelism 1 before and after: its own state, untouched
            assert list(r.operators["sink"]) == old.layout()["operators"]["sink"] and "sink" not in r.changed
        from_logs = {x for f in r.inflight for x in f.sources}
        assert set(r.files) == {x for ids in r.operators.values() for x in ids} | from_logs


def test_rescaling_from_a_final_checkpoint_is_refused():
    with pytest.raises(RescaleError) as info:
        restore_specs(plan(3), meta_of(plan(2), final=True), "/ck", 128)
    assert info.value.reason is RescaleErrorReason.FINISHED


def test_state_of_an_operator_the_job_lacks_is_refused_naming_it():
    old = plan(2, extra_map=True)
    with pytest.raises(RescaleError) as info:
        restore_specs(plan(3), meta_of(old), "/ck", 128)
    assert info.value.reason is RescaleErrorReason.REMOVED_OPERATOR and info.value.operator == "upper"


def test_another_key_group_count_is_refused():
    old = plan(2)
    meta = meta_of(old)
    meta.layout["max_parallelism"] = 64
    with pytest.raises(RescaleError) as info:
        restore_specs(plan(3), meta, "/ck", 128)
    assert info.value.reason is RescaleErrorReason.MAX_PARALLELISM


def test_logs_come_only_from_old_tasks_headed_by_the_same_operator():
    old, new = plan(1), plan(2)  # at 1, count and sink share a chain headed by count
    assert [c.operators for c in old.chains if "sink" in c.operators] == [("count", "sink")]
    specs = restore_specs(new, meta_of(old), "/ck", 128)
    sink_task = [t.id for t in new.tasks if t.chain == "sink"][0]
    r = specs[sink_task]
    assert isinstance(r, Rescale)
    assert r.operators["sink"] == ("count#0",) and r.inflight == ()  # count#0's logs are count's
    count_tasks = [t.id for t in new.tasks if t.chain == "count"]
    rescales = [specs[t] for t in count_tasks]
    assert all(isinstance(s, Rescale) and [f.operator for f in s.inflight] == ["count"] for s in rescales)
    assert all(isinstance(s, Rescale) and s.inflight[0].sources == ("count#0",) for s in rescales)


def test_channel_state_into_an_operator_now_fused_behind_another_is_kept_for_it():
    """At 2, sink (parallelism 1) heads its own task and holds what was in flight into it;
    at 1, count and sink are one chain: that task replays sink's channel state into sink,
    not into count (restore.replay starts at the operator's place in the chain)."""
    old, new = plan(2), plan(1)
    (task,) = [t for t in new.tasks if t.chain == "count"]
    assert new.chain("count").operators == ("count", "sink")
    spec = restore_specs(new, meta_of(old), "/ck", 128)[task.id]
    assert isinstance(spec, Rescale)
    assert {f.operator: f.sources for f in spec.inflight} == {"count": ("count#0", "count#1"), "sink": ("sink#0",)}
    assert {f.operator: f.route for f in spec.inflight} == {"count": True, "sink": False}


def test_a_changed_dataflow_is_refused_naming_the_removed_operator_and_the_flag():
    old = plan(2, extra_map=True)
    with pytest.raises(RescaleError) as info:
        restore_specs(plan(2), meta_of(old), "/ck", 128)
    assert info.value.reason is RescaleErrorReason.REMOVED_OPERATOR and info.value.operator == "upper"
    assert "allow_non_restored_state=True" in str(info.value)


@pytest.mark.parametrize("before,after", [(2, 2), (2, 3)])
def test_allow_non_restored_state_drops_removed_operators_and_starts_added_ones_empty(before, after):
    # Removed: "upper" (its state is dropped). Then added back: it starts empty.
    specs = restore_specs(plan(after), meta_of(plan(before, extra_map=True)), "/ck", 128,
                          allow_non_restored_state=True)
    for s in specs.values():
        assert isinstance(s, Rescale)
        assert "upper" not in s.operators
        assert not any(t.startswith("upper#") for t in s.files)
    specs = restore_specs(plan(after, extra_map=True), meta_of(plan(before)), "/ck", 128,
                          allow_non_restored_state=True)
    restored = {op for s in specs.values() if isinstance(s, Rescale) for op in s.operators}
    assert "upper" not in restored and {"src", "split", "count", "sink"} <= restored


def test_an_operator_whose_kind_changed_is_refused_even_when_allowed():
    old = plan(2)
    flow = Dataflow("wc", parallelism=2)
    s = flow.source(TestingSource(["a b"]), name="src").flat_map(str.split, name="split")
    s.map(str.upper, name="count").sink(FileSink("/nonexistent/out"), name="sink", parallelism=1)
    with pytest.raises(RescaleError) as info:
        restore_specs(flow.compile(), meta_of(old), "/ck", 128, allow_non_restored_state=True)
    assert info.value.reason is RescaleErrorReason.CHANGED_OPERATOR and info.value.operator == "count"


def test_a_checkpoint_with_no_operator_in_common_is_refused_even_when_allowed():
    flow = Dataflow("other", parallelism=1)
    flow.source(TestingSource([1]), name="numbers").sink(FileSink("/nonexistent/o"), name="out")
    with pytest.raises(RescaleError) as info:
        restore_specs(flow.compile(), meta_of(plan(2)), "/ck", 128, allow_non_restored_state=True)
    assert "none of this dataflow's operators" in str(info.value)


@pytest.mark.parametrize("keyed", [True, False])
def test_channel_state_into_a_map_after_key_by_is_rerouted_by_key(keyed: bool) -> None:
    """A map after key_by keeps no keyed state, but its input is a hash edge: what was in
    flight into it goes to the subtask that now owns each key, as the live shuffle would send
    it (every n-th record instead would split a key over subtasks). After rebalance: every n-th."""
    def build(p: int):  # type: ignore[no-untyped-def]
        flow = Dataflow("m", parallelism=p)
        s = flow.source(TestingSource(["a"]), name="src", parallelism=1)
        (s.key_by(lambda w: w) if keyed else s.rebalance()).map(str.upper, name="up").sink(
            FileSink("/nonexistent/o"), name="sink")
        return flow.compile()

    old, new = build(2), build(3)
    specs = restore_specs(new, meta_of(old), "/ck", 128)
    ups = [specs[t.id] for t in new.tasks if t.chain == "up"]
    assert all(isinstance(s, Rescale) and [(f.operator, f.route, f.keyed) for f in s.inflight] == [("up", True, keyed)]
               for s in ups)
