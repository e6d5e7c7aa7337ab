"""A job's pipelines and failover regions (abs_engine/pipelines.py): on random dataflows
they partition the tasks, no edge joins two pipelines and no channel two regions; by hand,
independent pipelines, lanes without a shuffle, one region with one, and loops."""

from __future__ import annotations

import networkx as nx
from hypothesis import HealthCheck, given, settings

from abs_engine.api import Dataflow
from abs_engine.compiler import compile_graph, explain, to_networkx
from abs_engine.graph import LogicalGraph
from abs_engine.pipelines import find_pipelines, restrict
from abs_engine.plan import Plan
from abs_engine.testing import CapturingSink, TestingSource

from .test_compiler import valid_graphs


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_graphs())
def test_pipelines_and_regions_partition_the_tasks_of_random_dataflows(graph: LogicalGraph) -> None:
    plan = compile_graph(graph)
    found = find_pipelines(plan)
    assert [p.id for p in found] == list(range(len(found)))
    # the pipelines are the weakly connected components of the user's graph
    chain_of = {o.name: o.chain for o in plan.operators}
    expected = {frozenset(chain_of[o] for o in comp) for comp in nx.weakly_connected_components(to_networkx(graph))}
    assert {frozenset(p.chains) for p in found} == expected
    pipeline_of = {t: p.id for p in found for t in p.tasks}
    region_of = {t: (p.id, i) for p in found for i, r in enumerate(p.regions) for t in r}
    tasks = [t.id for t in plan.tasks]
    assert sorted(pipeline_of) == sorted(region_of) == sorted(tasks)  # each task once
    assert sum(len(p.tasks) for p in found) == sum(len(r) for p in found for r in p.regions) == len(tasks)
    for t in plan.tasks:
        for ch in t.inputs:  # a channel never leaves its region (so never its pipeline)
            assert region_of[ch.producer] == region_of[ch.consumer], ch
    # and a region is not bigger than its channels make it: each one is connected
    links = nx.Graph([(ch.producer, ch.consumer) for t in plan.tasks for ch in t.inputs])
    for p in found:
        for r in p.regions:
            assert len(r) == 1 or (set(r) <= set(links) and nx.is_connected(links.subgraph(r))), r


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_graphs())
def test_a_plan_restricted_to_each_pipeline_loses_and_adds_nothing(graph: LogicalGraph) -> None:
    plan = compile_graph(graph)
    found = find_pipelines(plan)
    parts = [restrict(plan, p) for p in found]
    assert sorted(t.id for q in parts for t in q.tasks) == sorted(t.id for t in plan.tasks)
    assert sorted(o.name for q in parts for o in q.operators) == sorted(o.name for o in plan.operators)
    assert sum(len(q.edges) for q in parts) == len(plan.edges)
    for p, q in zip(found, parts):
        assert Plan.from_dict(q.to_dict()) == q  # pure data, as a Deploy carries it
        assert [t.id for t in q.tasks] == list(p.tasks) and [c.name for c in q.chains] == list(p.chains)
        # the pipeline's first operator names it (and its checkpoint directory)
        assert p.name == q.operators[0].name and p.directory == "pipeline-" + p.name
        for t in q.tasks:
            whole = plan.task(t.id)
            # renumbered edges point at the same producer and consumer operators
            for mine, orig in zip(t.inputs, whole.inputs):
                assert (q.edges[mine.edge].src, q.edges[mine.edge].dst) == \
                    (plan.edges[orig.edge].src, plan.edges[orig.edge].dst)
            for mine_o, orig_o in zip(t.outputs, whole.outputs):
                assert q.edges[mine_o.edge] == plan.edges[orig_o.edge] and mine_o.channels == orig_o.channels
        assert q.loops().keys() <= plan.loops().keys()


def sink(tmp_path, name: str) -> CapturingSink:  # type: ignore[no-untyped-def]
    return CapturingSink(tmp_path / name)


def test_independent_pipelines_lanes_and_shuffles(tmp_path) -> None:  # type: ignore[no-untyped-def]
    flow = Dataflow("three", parallelism=3)
    # a shuffle: one region
    flow.source(TestingSource(range(9)), name="words").map(lambda x: (x % 2, 1)).key_by(lambda kv: kv[0]) \
        .count().sink(sink(tmp_path, "a"))
    # forward only (a map at another name than the source, fused): each lane a region
    flow.source(TestingSource(range(9)), name="copy").map(str).sink(sink(tmp_path, "b"))
    # forward only but not fused (a union of two sources): lanes still
    left = flow.source(TestingSource(range(3)), name="left")
    right = flow.source(TestingSource(range(3)), name="right")
    left.union(right).map(str, name="joined").sink(sink(tmp_path, "c"))
    plan = flow.compile()
    found = find_pipelines(plan)
    assert [p.chains[0] for p in found] == ["words", "copy", "left"]
    words, copy, union = found
    assert len(words.tasks) == 6 and words.regions == (words.tasks,)
    assert copy.regions == (("copy#0",), ("copy#1",), ("copy#2",))
    assert set(union.chains) >= {"left", "right"}
    assert len(union.regions) == 3 and all({t.split("#")[1] for t in r} == {str(i)} for i, r in enumerate(union.regions))
    text = explain(plan)
    assert "pipeline 1 ('copy'): copy; 3 task(s) in 3 regions (parallel lanes joined only by forward edges)" in text
    assert "pipeline 0 ('words'): words, count; 6 task(s) in 1 region" in text


def test_a_loop_is_one_pipeline_with_what_feeds_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    flow = Dataflow("loop", parallelism=2)
    loop = flow.feedback(name="loop")
    merged = flow.source(TestingSource(range(1, 20)), name="numbers").union(loop, name="merge")
    step = merged.map(lambda n: n // 2, name="halve")
    loop.connect(step.filter(lambda n: n > 1, name="again"))
    step.filter(lambda n: n <= 1, name="done").sink(sink(tmp_path, "o"))
    flow.source(TestingSource(range(3)), name="other").sink(sink(tmp_path, "p"))
    plan = flow.compile()
    assert plan.back_edges
    looped, other = find_pipelines(plan)
    assert other.chains == ("other",) and other.tasks == ("other#0", "other#1")
    assert set(looped.chains) == {c.name for c in plan.chains} - {"other"}
