"""Tests of abs_engine/compiler.py: back-edge detection, validation, chaining, the plan."""

from __future__ import annotations

import itertools
from typing import Any

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from abs_engine import codec
from abs_engine.api import Dataflow
from abs_engine.compiler import bfs_order, compile_graph, explain, find_back_edges, to_networkx
from abs_engine.errors import GraphError, GraphErrorReason
from abs_engine.graph import Edge, LogicalGraph, Node, NodeKind, Partition
from abs_engine.ids import channel_id, task_id
from abs_engine.plan import Plan
from operators.base import Sink, Source
from abs_engine.testing import CapturingSink, TestingSource
from operators.basic import Identity, Map


# ---------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------


class ListSource(Source):
    def __init__(self, items: list[Any] | None = None):
        self.items = list(items or [])
        self.pos = 0

    def read_batch(self) -> list[Any] | None:
        if self.pos >= len(self.items):
            return None
        self.pos = len(self.items)
        return self.items

    def snapshot(self, checkpoint_id: int) -> Any:
        return self.pos

    def restore(self, state: Any) -> None:
        self.pos = state


class NullSink(Sink):
    def process(self, batch: list[Any]) -> list[Any]:
        return []


def inc(x: int) -> int:
    return x + 1


def split(x: str) -> list[str]:
    return x.split()


def keep(x: Any) -> bool:
    return True


def node(name: str, kind: NodeKind, parallelism: int | None = None, keyed: bool = False) -> Node:
    template: Any = {NodeKind.SOURCE: ListSource(), NodeKind.SINK: NullSink()}.get(kind, Identity())
    return Node(name, kind, template, name, parallelism, keyed=keyed)


def hand_graph(nodes: list[Node], edges: list[tuple[str, str]] | list[Edge], parallelism: int = 1) -> LogicalGraph:
    g = LogicalGraph("hand", parallelism)
    for n in nodes:
        g.nodes[n.name] = n
    for e in edges:
        g.edges.append(e if isinstance(e, Edge) else Edge(e[0], e[1]))
    return g


def graph_error(fn: Any) -> GraphError:
    with pytest.raises(GraphError) as info:
        fn()
    return info.value


def assert_names(err: GraphError, op: str) -> None:
    assert err.operator == op
    assert repr(op) in str(err) or op in str(err), str(err)


# ---------------------------------------------------------------------------------------
# find_back_edges: properties on random graphs
# ---------------------------------------------------------------------------------------


@st.composite
def digraphs(draw: st.DrawFn) -> nx.DiGraph:
    n = draw(st.integers(1, 12))
    labels = draw(st.permutations(range(n)))  # random node insertion order
    edges = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n))
    g = nx.DiGraph()
    g.add_nodes_from(labels)
    g.add_edges_from(edges)  # self-loops included when drawn
    return g


@st.composite
def dags(draw: st.DrawFn) -> nx.DiGraph:
    """Edges only from a lower to a higher topological index; labels shuffled."""
    n = draw(st.integers(1, 12))
    perm = draw(st.permutations(range(n)))  # topological index -> label
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    chosen = draw(st.lists(st.sampled_from(pairs), max_size=3 * n)) if pairs else []
    g = nx.DiGraph()
    g.add_nodes_from(draw(st.permutations(range(n))))
    g.add_edges_from((perm[i], perm[j]) for i, j in chosen)
    # Sometimes add a "long and short path to the same node" diamond:
    # a -> b -> c -> d plus the shortcut a -> d (and a -> c).
    if n >= 4 and draw(st.booleans()):
        a, b, c, d = sorted(draw(st.lists(st.integers(0, n - 1), min_size=4, max_size=4, unique=True)))
        g.add_edges_from([(perm[a], perm[b]), (perm[b], perm[c]), (perm[c], perm[d]), (perm[a], perm[d])])
        if draw(st.booleans()):
            g.add_edge(perm[a], perm[c])
    return g


FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(dags())
def test_acyclic_graph_has_no_back_edges(g: nx.DiGraph) -> None:
    assert nx.is_directed_acyclic_graph(g)
    assert find_back_edges(g) == set()


@FAST
@given(digraphs())
def test_removing_back_edges_leaves_a_dag(g: nx.DiGraph) -> None:
    back = find_back_edges(g)
    assert back <= set(g.edges)
    h = g.copy()
    h.remove_edges_from(back)
    assert nx.is_directed_acyclic_graph(h)


@FAST
@given(digraphs())
def test_every_back_edge_closes_a_cycle(g: nx.DiGraph) -> None:
    for u, v in find_back_edges(g):
        assert u == v or nx.has_path(g, v, u), (u, v)


@FAST
@given(digraphs())
def test_nodes_reached_from_a_source_keep_a_regular_input(g: nx.DiGraph) -> None:
    """The runtime aligns barriers on non-back-edge inputs only: a node a source reaches
    must keep at least one input that is not a back-edge, or it would never snapshot."""
    back = find_back_edges(g)
    sources = [n for n in g.nodes if g.in_degree(n) == 0]
    reached = set(sources).union(*(nx.descendants(g, s) for s in sources)) if sources else set()
    for n in reached:
        if g.in_degree(n):
            assert any((p, n) not in back for p in g.predecessors(n)), n


@FAST
@given(digraphs())
def test_back_edges_exist_iff_cyclic_and_include_self_loops(g: nx.DiGraph) -> None:
    back = find_back_edges(g)
    assert bool(back) == (not nx.is_directed_acyclic_graph(g))
    for u, v in g.edges:
        if u == v:
            assert (u, v) in back
    order = bfs_order(g)
    assert set(order) == set(g.nodes)
    assert sorted(order.values()) == list(range(g.number_of_nodes()))


@pytest.mark.parametrize("insertion", list(itertools.permutations("abcd")))
def test_diamond_long_and_short_path_has_no_back_edges(insertion: tuple[str, ...]) -> None:
    g = nx.DiGraph()
    g.add_nodes_from(insertion)
    g.add_edges_from([("a", "b"), ("b", "c"), ("c", "d"), ("a", "d")])
    assert find_back_edges(g) == set()


def test_simple_loop_marks_exactly_the_closing_edge() -> None:
    g = nx.DiGraph([("s", "a"), ("a", "b"), ("b", "c"), ("c", "a"), ("c", "t")])
    assert find_back_edges(g) == {("c", "a")}


# ---------------------------------------------------------------------------------------
# validation errors
# ---------------------------------------------------------------------------------------


def test_no_sources_via_api() -> None:
    flow = Dataflow("empty")
    err = graph_error(flow.compile)
    assert err.reason is GraphErrorReason.NO_SOURCES
    assert "source" in str(err)


def test_no_sources_hand_built() -> None:
    g = hand_graph([node("a", NodeKind.OPERATOR), node("k", NodeKind.SINK)], [("a", "k")])
    err = graph_error(lambda: compile_graph(g))
    assert err.reason is GraphErrorReason.NO_SOURCES


def test_sink_with_outputs_hand_built() -> None:
    g = hand_graph(
        [node("src", NodeKind.SOURCE), node("out", NodeKind.SINK), node("after", NodeKind.OPERATOR),
         node("out2", NodeKind.SINK)],
        [("src", "out"), ("out", "after"), ("after", "out2")],
    )
    err = graph_error(lambda: compile_graph(g))
    assert err.reason is GraphErrorReason.SINK_WITH_OUTPUTS
    assert_names(err, "out")


def test_source_with_inputs_hand_built() -> None:
    g = hand_graph(
        [node("s1", NodeKind.SOURCE), node("s2", NodeKind.SOURCE), node("out", NodeKind.SINK)],
        [("s1", "s2"), ("s2", "out")],
    )
    err = graph_error(lambda: compile_graph(g))
    assert err.reason is GraphErrorReason.SOURCE_WITH_INPUTS
    assert_names(err, "s2")


def test_operator_without_input_is_unreachable_hand_built() -> None:
    g = hand_graph(
        [node("src", NodeKind.SOURCE), node("out", NodeKind.SINK), node("orphan", NodeKind.OPERATOR),
         node("out2", NodeKind.SINK)],
        [("src", "out"), ("orphan", "out2")],
    )
    err = graph_error(lambda: compile_graph(g))
    assert err.reason is GraphErrorReason.UNREACHABLE
    assert_names(err, "orphan")


def test_downstream_of_unfed_cycle_is_unreachable_hand_built() -> None:
    # x is fed only by the cycle a <-> b, which no source feeds; x itself is not on it.
    g = hand_graph(
        [node("src", NodeKind.SOURCE), node("out", NodeKind.SINK), node("x", NodeKind.OPERATOR),
         node("a", NodeKind.OPERATOR), node("b", NodeKind.OPERATOR)],
        [("src", "out"), ("a", "b"), ("b", "a"), ("a", "x"), ("x", "out")],
    )
    err = graph_error(lambda: compile_graph(g))
    assert err.reason is GraphErrorReason.UNREACHABLE
    assert_names(err, "x")


def test_cycle_no_source_feeds_hand_built() -> None:
    g = hand_graph(
        [node("src", NodeKind.SOURCE), node("out", NodeKind.SINK), node("a", NodeKind.OPERATOR),
         node("b", NodeKind.OPERATOR)],
        [("src", "out"), ("a", "b"), ("b", "a")],
    )
    err = graph_error(lambda: compile_graph(g))
    assert err.reason is GraphErrorReason.CYCLE_WITHOUT_SOURCE
    assert err.operator in {"a", "b"}
    assert_names(err, err.operator)


def test_cycle_no_source_feeds_via_api() -> None:
    flow = Dataflow("loop")
    flow.source(ListSource([1])).sink(NullSink())
    fb = flow.feedback(name="loop_head")
    body = fb.map(inc, name="body")
    fb.connect(body)
    err = graph_error(flow.compile)
    assert err.reason is GraphErrorReason.CYCLE_WITHOUT_SOURCE
    assert err.operator in {"loop_head", "body"}
    assert_names(err, err.operator)


def test_forward_with_mismatched_parallelism() -> None:
    flow = Dataflow("fwd", parallelism=2)
    flow.source(ListSource(), name="src").forward().map(inc, name="wide", parallelism=3).sink(NullSink())
    err = graph_error(flow.compile)
    assert err.reason is GraphErrorReason.FORWARD_PARALLELISM
    assert_names(err, "wide")
    assert "'src'" in str(err)


def test_forward_with_equal_parallelism_compiles_and_chains() -> None:
    flow = Dataflow("fwd", parallelism=2)
    flow.source(ListSource(), name="src").forward().map(inc, name="m").sink(NullSink(), name="out")
    plan = flow.compile()
    assert plan.chain("src").operators == ("src", "m", "out")


def test_duplicate_operator_name() -> None:
    flow = Dataflow("dup")
    s = flow.source(ListSource(), name="twice")
    err = graph_error(lambda: s.map(inc, name="twice"))
    assert err.reason is GraphErrorReason.DUPLICATE_NAME
    assert_names(err, "twice")
    # the failed call left the graph unchanged
    assert list(flow.graph.nodes) == ["twice"]
    assert flow.graph.edges == []


def test_auto_names_skip_user_names() -> None:
    flow = Dataflow("names")
    s = flow.source(ListSource())
    s.map(inc, name="map_2")
    a = s.map(inc)
    b = s.map(inc)
    assert len({"map_2", a.node, b.node}) == 3
    assert len(flow.graph.nodes) == 4


@pytest.mark.parametrize("bad", [0, -1, "2", 1.0, None])
def test_bad_default_parallelism(bad: Any) -> None:
    err = graph_error(lambda: Dataflow("p", parallelism=bad))
    assert err.reason is GraphErrorReason.BAD_PARALLELISM
    assert repr(bad) in str(err)


@pytest.mark.parametrize("bad", [0, -1, "2", 2.5])
@pytest.mark.parametrize("where", ["source", "map", "sink", "keyed", "feedback"])
def test_bad_operator_parallelism(bad: Any, where: str) -> None:
    flow = Dataflow("p")
    s = flow.source(ListSource(), name="src")

    def build() -> None:
        if where == "source":
            flow.source(ListSource(), name="bad_op", parallelism=bad)
        elif where == "map":
            s.map(inc, name="bad_op", parallelism=bad)
        elif where == "sink":
            s.sink(NullSink(), name="bad_op", parallelism=bad)
        elif where == "keyed":
            s.key_by().count(name="bad_op", parallelism=bad)
        else:
            flow.feedback(name="bad_op", parallelism=bad)

    err = graph_error(build)
    assert err.reason is GraphErrorReason.BAD_PARALLELISM
    assert_names(err, "bad_op")
    assert repr(bad) in str(err)
    assert "bad_op" not in flow.graph.nodes


def test_no_sink() -> None:
    flow = Dataflow("nosink")
    flow.source(ListSource()).map(inc)
    err = graph_error(flow.compile)
    assert err.reason is GraphErrorReason.NO_SINK
    assert "sink" in str(err)


def test_unconnected_feedback() -> None:
    flow = Dataflow("fb")
    src = flow.source(ListSource())
    fb = flow.feedback(name="dangling")
    src.union(fb).sink(NullSink())
    err = graph_error(flow.compile)
    assert err.reason is GraphErrorReason.BAD_ARGUMENT
    assert_names(err, "dangling")


def test_feedback_connected_twice() -> None:
    flow = Dataflow("fb")
    src = flow.source(ListSource())
    fb = flow.feedback(name="head")
    u = src.union(fb)
    fb.connect(u.map(inc))
    err = graph_error(lambda: fb.connect(u))
    assert err.reason is GraphErrorReason.BAD_ARGUMENT
    assert_names(err, "head")


def test_keyed_operator_fed_directly_hand_built() -> None:
    g = hand_graph(
        [node("src", NodeKind.SOURCE), node("cnt", NodeKind.OPERATOR, keyed=True), node("out", NodeKind.SINK)],
        [Edge("src", "cnt", Partition.REBALANCE), Edge("cnt", "out")],
    )
    err = graph_error(lambda: compile_graph(g))
    assert err.reason is GraphErrorReason.BAD_ARGUMENT
    assert_names(err, "cnt")


def test_same_stream_connected_twice() -> None:
    flow = Dataflow("twice")
    s = flow.source(ListSource(), name="src")
    s.union(s, name="u").sink(NullSink())
    err = graph_error(flow.compile)
    assert err.reason is GraphErrorReason.BAD_ARGUMENT
    assert_names(err, "u")


def test_union_of_foreign_streams() -> None:
    a, b = Dataflow("a"), Dataflow("b")
    sa, sb = a.source(ListSource()), b.source(ListSource())
    err = graph_error(lambda: sa.union(sb))
    assert err.reason is GraphErrorReason.FOREIGN_STREAM


def test_source_and_sink_type_checks() -> None:
    flow = Dataflow("types")
    err = graph_error(lambda: flow.source([1, 2, 3]))  # type: ignore[arg-type]
    assert err.reason is GraphErrorReason.BAD_ARGUMENT
    s = flow.source(ListSource())
    err = graph_error(lambda: s.sink(Map(inc)))  # type: ignore[arg-type]
    assert err.reason is GraphErrorReason.BAD_ARGUMENT


# ---------------------------------------------------------------------------------------
# compilation: chains, partitions, tasks, channels
# ---------------------------------------------------------------------------------------


def wordcount(p_src: int = 2, p_count: int = 2, p_sink: int = 1) -> Dataflow:
    flow = Dataflow("wc", parallelism=p_src)
    words = flow.source(ListSource(["a b"]), name="src").flat_map(split, name="words")
    words.key_by().count(name="count", parallelism=p_count).sink(NullSink(), name="out", parallelism=p_sink)
    return flow


def test_source_flat_map_fuse_and_hash_edge_is_not_chained() -> None:
    plan = wordcount().compile()
    assert [c.operators for c in plan.chains] == [("src", "words"), ("count",), ("out",)]
    assert plan.chain("src").is_source and not plan.chain("count").is_source
    assert {o.name: o.chain for o in plan.operators} == {"src": "src", "words": "src", "count": "count", "out": "out"}
    assert [(e.src, e.dst, e.partition) for e in plan.edges] == [
        ("words", "count", "hash"),
        ("count", "out", "rebalance"),
    ]
    assert plan.operator("count").keyed and not plan.operator("words").keyed


def test_task_and_channel_counts() -> None:
    plan = wordcount(2, 2, 1).compile()
    assert len(plan.tasks) == 5
    chans = {c.id: c for t in plan.tasks for c in t.inputs}
    by_edge: dict[int, list[Any]] = {}
    for c in chans.values():
        by_edge.setdefault(c.edge, []).append(c)
    hash_edge = next(i for i, e in enumerate(plan.edges) if e.partition == "hash")
    sink_edge = next(i for i, e in enumerate(plan.edges) if e.dst == "out")
    assert len(by_edge[hash_edge]) == 4
    assert len(by_edge[sink_edge]) == 2
    assert len(chans) == 6
    # every (producer, consumer) pair of a hash edge is connected once
    assert {(c.producer, c.consumer) for c in by_edge[hash_edge]} == {
        (task_id("src", i), task_id("count", j)) for i in range(2) for j in range(2)
    }
    assert plan.task(task_id("out", 0)).inputs and len(plan.task(task_id("out", 0)).inputs) == 2
    # outputs: channels ordered by consumer subtask index, and ids match consumers' inputs
    for i in range(2):
        (out,) = plan.task(task_id("src", i)).outputs
        assert out.partition == "hash" and out.key_operator == "count"
        assert out.channels == tuple(channel_id(task_id("src", i), task_id("count", j)) for j in range(2))
    assert plan.task(task_id("out", 0)).outputs == ()


def test_explain_lists_everything() -> None:
    plan = wordcount().compile()
    text = explain(plan)
    assert f"{len(plan.tasks)} tasks in {len(plan.chains)} chains" in text
    for t in plan.tasks:
        assert t.id in text
    assert "BACK-EDGE" not in text
    assert wordcount().explain() == text


def test_equal_parallelism_is_forward_and_different_is_rebalance() -> None:
    flow = Dataflow("parts", parallelism=2)
    src = flow.source(ListSource(), name="src")
    src.map(inc, name="same").sink(NullSink(), name="k1")
    src.map(inc, name="wider", parallelism=3).sink(NullSink(), name="k2", parallelism=3)
    plan = flow.compile()
    parts = {(e.src, e.dst): e.partition for e in plan.edges}
    assert parts[("src", "same")] == "forward"
    assert parts[("src", "wider")] == "rebalance"
    # src branches: the chain ends at src, both maps head their own chains, which fuse their sinks
    assert plan.chain("src").operators == ("src",)
    assert plan.chain("same").operators == ("same", "k1")
    assert plan.chain("wider").operators == ("wider", "k2")
    # forward channels join subtask i to subtask i only
    fwd = [c for t in plan.tasks for c in t.inputs if plan.edges[c.edge].partition == "forward"]
    assert sorted((c.producer, c.consumer) for c in fwd) == [
        (task_id("src", i), task_id("same", i)) for i in range(2)
    ]
    rb = [c for t in plan.tasks for c in t.inputs if plan.edges[c.edge].partition == "rebalance"]
    assert len(rb) == 2 * 3


def test_explicit_rebalance_with_equal_parallelism_is_not_chained() -> None:
    flow = Dataflow("rb", parallelism=2)
    flow.source(ListSource(), name="src").rebalance().map(inc, name="m").sink(NullSink(), name="out")
    plan = flow.compile()
    assert [c.operators for c in plan.chains] == [("src",), ("m", "out")]
    assert plan.edges[0].partition == "rebalance"


def test_join_node_starts_a_chain() -> None:
    flow = Dataflow("join")
    a = flow.source(ListSource(), name="a")
    b = flow.source(ListSource(), name="b")
    a.union(b, name="u").map(inc, name="m").sink(NullSink(), name="out")
    plan = flow.compile()
    assert plan.chain("u").operators == ("u", "m", "out")
    assert plan.chain("a").operators == ("a",) and plan.chain("b").operators == ("b",)
    assert {(e.src, e.dst) for e in plan.edges} == {("a", "u"), ("b", "u")}


def test_plan_round_trips_through_msgpack() -> None:
    plan = wordcount().compile()
    again = Plan.from_dict(codec.unpack(codec.pack(plan.to_dict())))
    assert again == plan
    assert again.fingerprint() == plan.fingerprint()


def test_fingerprint_changes_with_parallelism() -> None:
    base = wordcount(2, 2, 1).compile().fingerprint()
    assert wordcount(2, 2, 1).compile().fingerprint() == base  # deterministic
    assert wordcount(3, 2, 1).compile().fingerprint() != base
    assert wordcount(2, 3, 1).compile().fingerprint() != base
    assert wordcount(2, 2, 2).compile().fingerprint() != base


def loop_flow() -> Dataflow:
    flow = Dataflow("loop", parallelism=2)
    src = flow.source(ListSource([5]), name="src")
    fb = flow.feedback(name="fb")
    u = src.union(fb, name="u")
    step = u.map(inc, name="step")
    fb.connect(step.filter(keep, name="again"))
    step.sink(NullSink(), name="out")
    return flow


def test_feedback_loop_compiles_with_back_edge_marked() -> None:
    flow = loop_flow()
    plan = flow.compile()
    back = plan.back_edges
    assert [(e.src, e.dst) for e in back] == [("fb", "u")]
    # the marked edge closes a cycle of the logical graph; no other edge does
    g = to_networkx(flow.graph)
    h = g.copy()
    h.remove_edges_from((e.src, e.dst) for e in back)
    assert not nx.is_directed_acyclic_graph(g) and nx.is_directed_acyclic_graph(h)
    # channels of the back-edge carry the flag, others do not
    for t in plan.tasks:
        for c in t.inputs:
            assert c.back_edge == plan.edges[c.edge].back_edge
    u_inputs = plan.task(task_id("u", 0)).inputs
    assert sum(c.back_edge for c in u_inputs) == 1  # fb -> u is forward (same parallelism)
    assert sum(not c.back_edge for c in u_inputs) == 1
    text = explain(plan)
    (line,) = [ln for ln in text.splitlines() if "BACK-EDGE" in ln]
    assert "fb -> u" in line
    # the feedback node chains behind the filter; the back-edge is never fused
    assert plan.chain("again").operators == ("again", "fb")
    assert plan.chain("u").operators == ("u", "step")
    assert Plan.from_dict(codec.unpack(codec.pack(plan.to_dict()))) == plan


# ---------------------------------------------------------------------------------------
# compilation: properties of random valid DAG dataflows
# ---------------------------------------------------------------------------------------


@st.composite
def valid_graphs(draw: st.DrawFn) -> LogicalGraph:
    n = draw(st.integers(2, 9))
    default_p = draw(st.integers(1, 3))
    preds: dict[int, set[int]] = {i: set() for i in range(n)}
    is_source = [True] + [False] * (n - 1)
    for i in range(1, n - 1):
        is_source[i] = draw(st.integers(0, 4)) == 0
    for i in range(1, n):
        if is_source[i]:
            continue
        candidates = [j for j in range(i)]
        preds[i] |= set(draw(st.lists(st.sampled_from(candidates), min_size=1, max_size=3)))
    has_out = {j for i in range(n) for j in preds[i]}
    nodes: list[Node] = []
    par: dict[int, int] = {}
    keyed: dict[int, bool] = {}
    for i in range(n):
        p = draw(st.one_of(st.none(), st.integers(1, 3)))
        par[i] = p or default_p
        if is_source[i]:
            kind = NodeKind.SOURCE
        elif i not in has_out:
            kind = NodeKind.SINK
        else:
            kind = NodeKind.OPERATOR
        keyed[i] = kind is not NodeKind.SOURCE and draw(st.integers(0, 3)) == 0
        nodes.append(node(f"n{i}", kind, p, keyed[i]))
    edges: list[Edge] = []
    for i in range(n):
        for j in sorted(preds[i]):
            if keyed[i]:
                part: Partition | None = Partition.HASH  # what KeyedStream always sets
            else:
                options: list[Partition | None] = [None, Partition.REBALANCE, Partition.HASH]
                if par[i] == par[j]:
                    options.append(Partition.FORWARD)
                part = draw(st.sampled_from(options))
            edges.append(Edge(f"n{j}", f"n{i}", part))
    order = draw(st.permutations(range(n)))
    g = LogicalGraph("random", default_p)
    for i in order:
        g.nodes[nodes[i].name] = nodes[i]
    g.edges = draw(st.permutations(edges))
    return g


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_graphs())
def test_random_dag_plans_are_consistent(graph: LogicalGraph) -> None:
    plan = compile_graph(graph)
    g = to_networkx(graph)
    par = {n: g.nodes[n]["parallelism"] for n in g.nodes}

    # partitions: explicit ones are kept, keyed -> hash, else forward iff equal parallelism
    def expected_partition(u: str, v: str) -> str:
        p = g.edges[u, v]["partition"]
        if p is not None:
            return p.value
        if g.nodes[v]["keyed"]:
            return "hash"
        return "forward" if par[u] == par[v] else "rebalance"

    # every operator lies in exactly one chain, and OperatorSpec.chain names it
    members = [o for c in plan.chains for o in c.operators]
    assert sorted(members) == sorted(g.nodes)
    chain_of = {o: c.name for c in plan.chains for o in c.operators}
    assert {o.name: o.chain for o in plan.operators} == chain_of
    for c in plan.chains:
        assert c.operators[0] == c.name
        assert c.parallelism == par[c.name]
        assert c.is_source == (g.nodes[c.name]["kind"] is NodeKind.SOURCE)

    def fusable(u: str, v: str) -> bool:
        return expected_partition(u, v) == "forward" and g.out_degree(u) == 1 and g.in_degree(v) == 1

    # chains are runs of fusable edges, and maximal
    internal = set()
    for c in plan.chains:
        for a, b in zip(c.operators, c.operators[1:]):
            assert g.has_edge(a, b) and fusable(a, b), (a, b)
            internal.add((a, b))
    for u, v in g.edges:
        if fusable(u, v):
            assert (u, v) in internal, (u, v)

    # the edges between chains are exactly the other edges, with the right partition
    assert {(e.src, e.dst) for e in plan.edges} == set(g.edges) - internal
    assert len(plan.edges) == len(set(g.edges) - internal)
    for e in plan.edges:
        assert e.partition == expected_partition(e.src, e.dst)
        assert not e.back_edge
        assert chain_of[e.dst] == e.dst
        assert plan.chain(chain_of[e.src]).operators[-1] == e.src
    assert plan.back_edges == ()

    # tasks: one per chain subtask
    assert sorted(t.id for t in plan.tasks) == sorted(
        task_id(c.name, i) for c in plan.chains for i in range(c.parallelism)
    )
    # channels: forward joins i -> i, the others all pairs; each channel is produced once and consumed once
    produced = [ch for t in plan.tasks for o in t.outputs for ch in o.channels]
    consumed = [c for t in plan.tasks for c in t.inputs]
    assert len(produced) == len(set(produced))
    assert sorted(produced) == sorted(c.id for c in consumed)
    for ei, e in enumerate(plan.edges):
        pu, pv = par[chain_of[e.src]], par[e.dst]
        pairs = sorted((c.producer, c.consumer) for c in consumed if c.edge == ei)
        if e.partition == "forward":
            want = [(task_id(chain_of[e.src], i), task_id(e.dst, i)) for i in range(pu)]
        else:
            want = [(task_id(chain_of[e.src], i), task_id(e.dst, j)) for i in range(pu) for j in range(pv)]
        assert pairs == sorted(want)
    for t in plan.tasks:
        for c in t.inputs:
            assert c.consumer == t.id and c.id == channel_id(c.producer, c.consumer)
        for o in t.outputs:
            assert o.partition == plan.edges[o.edge].partition
            assert o.key_operator == plan.edges[o.edge].dst
            consumers = [c.split("->")[1] for c in o.channels]
            assert consumers == sorted(consumers, key=lambda x: int(x.rsplit("#", 1)[1]))
    assert Plan.from_dict(codec.unpack(codec.pack(plan.to_dict()))) == plan


def test_fingerprint_changes_when_partitioning_changes():
    from operators.basic import Identity

    def build(keyed: bool):
        flow = Dataflow("fp", parallelism=2)
        s = flow.source(TestingSource([1]), name="s")
        nxt = s.key_by().count(name="c") if keyed else s.rebalance().apply(Identity(), name="c")
        nxt.sink(CapturingSink("/tmp/unused-fp"), name="k")
        return flow.compile().fingerprint()

    assert build(True) != build(False)


def test_bool_parallelism_is_rejected():
    with pytest.raises(GraphError) as ei:
        Dataflow("b", parallelism=True)
    assert ei.value.reason is GraphErrorReason.BAD_PARALLELISM
