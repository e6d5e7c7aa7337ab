"""Compiler: logical graph -> networkx.DiGraph -> validated -> back-edges (BFS) -> Plan.

Back-edges. BFS from the sources numbers every node by discovery order. An edge (u, v)
is a back-edge iff order[v] <= order[u] *and* v reaches u. This gives, for any graph:
- an acyclic graph has none (no edge closes a cycle, so the reachability test fails);
- every back-edge closes a cycle (v reaches u, by construction);
- removing them leaves a DAG: on any cycle, the BFS order cannot increase along every
  edge, so some edge (u, v) has order[v] <= order[u]; it closes that cycle, so it is marked.
("An edge to an already visited node" alone is wrong: in a DAG with a long and a short
path to the same node it marks edges that close no cycle.)
"""

from __future__ import annotations

from collections import deque
from typing import Any, Hashable

import networkx as nx

from operators.state_layout import Part

from .errors import GraphError, GraphErrorReason
from .graph import LogicalGraph, NodeKind, Partition
from .ids import channel_id, task_id
from .plan import ChainSpec, ChannelSpec, EdgeSpec, OperatorSpec, OutputSpec, Plan, TaskSpec


def bfs_order(g: nx.DiGraph) -> dict[Hashable, int]:
    """Discovery order of a BFS from the sources (nodes with no in-edges).

    Nodes no source reaches are numbered afterwards, by further BFS runs started from them
    in the graph's node order, so every node gets a number.
    """
    order: dict[Hashable, int] = {}
    starts = [n for n in g.nodes if g.in_degree(n) == 0] + list(g.nodes)
    for start in starts:
        if start in order:
            continue
        order[start] = len(order)
        queue = deque([start])
        while queue:
            u = queue.popleft()
            for v in g.successors(u):
                if v not in order:
                    order[v] = len(order)
                    queue.append(v)
    return order


def find_back_edges(g: nx.DiGraph) -> set[tuple[Any, Any]]:
    """The edges (u, v) that close a cycle: BFS order goes backwards and v reaches u."""
    order = bfs_order(g)
    return {(u, v) for u, v in g.edges if order[v] <= order[u] and (u == v or nx.has_path(g, v, u))}


def state_parts(template: Any) -> tuple[tuple[str, str], ...]:
    """An operator's declared state layout as data: (field, part) pairs ("" for the whole)."""
    layout = getattr(type(template), "state_layout", None)
    if layout is None:
        return ()
    if isinstance(layout, Part):
        return (("", layout.value),)
    return tuple((str(f), p.value) for f, p in layout.items())


def to_networkx(graph: LogicalGraph) -> nx.DiGraph:
    g = nx.DiGraph(name=graph.name)
    for n in graph.nodes.values():
        g.add_node(
            n.name,
            kind=n.kind,
            parallelism=n.parallelism or graph.default_parallelism,
            keyed=n.keyed,
            label=n.label,
            parts=state_parts(n.template),
        )
    for e in graph.edges:
        if g.has_edge(e.src, e.dst):
            raise GraphError(
                GraphErrorReason.BAD_ARGUMENT,
                f"{e.src!r} is connected to {e.dst!r} twice: connect a stream to an operator once",
                e.dst,
            )
        g.add_edge(e.src, e.dst, partition=e.partition, side=e.side)
    return g


def validate(graph: LogicalGraph, g: nx.DiGraph) -> None:
    def fail(reason: GraphErrorReason, msg: str, op: str | None = None) -> None:
        raise GraphError(reason, msg, op)

    sources = [n for n, k in g.nodes(data="kind") if k is NodeKind.SOURCE]
    if not sources:
        fail(GraphErrorReason.NO_SOURCES, "the dataflow has no source: add one with Dataflow.source(...)")
    for n in graph.nodes.values():
        if n.feedback and not n.connected:
            fail(
                GraphErrorReason.BAD_ARGUMENT,
                f"feedback {n.name!r} was never connected: call .connect(stream) to close the loop",
                n.name,
            )
    for n, p in g.nodes(data="parallelism"):
        if p > graph.max_parallelism:
            fail(GraphErrorReason.BAD_PARALLELISM,
                 f"operator {n!r} has parallelism {p}, more than the job's max_parallelism "
                 f"({graph.max_parallelism} key groups): lower it, or raise Dataflow(max_parallelism=...) "
                 "(fixed for the life of the job: checkpoints record it)", n)
    for n, kind in g.nodes(data="kind"):
        if kind is NodeKind.SOURCE and g.in_degree(n):
            fail(GraphErrorReason.SOURCE_WITH_INPUTS, f"source {n!r} has inputs: a source cannot consume a stream", n)
        if kind is NodeKind.SINK and g.out_degree(n):
            fail(GraphErrorReason.SINK_WITH_OUTPUTS, f"sink {n!r} has outputs: nothing may follow a sink", n)
        if kind is not NodeKind.SOURCE and g.in_degree(n) == 0:
            fail(GraphErrorReason.UNREACHABLE, f"operator {n!r} has no input: connect it to a stream", n)
    reached = set(sources)
    for s in sources:
        reached |= nx.descendants(g, s)
    for n in g.nodes:
        if n not in reached:
            on_cycle = any(n in c for c in nx.simple_cycles(g.subgraph(set(g.nodes) - reached)))
            if on_cycle:
                fail(
                    GraphErrorReason.CYCLE_WITHOUT_SOURCE,
                    f"operator {n!r} is on a cycle that no source feeds: connect a source into the loop",
                    n,
                )
            fail(GraphErrorReason.UNREACHABLE, f"operator {n!r} is not reachable from any source", n)
    if not any(k is NodeKind.SINK for _, k in g.nodes(data="kind")):
        fail(GraphErrorReason.NO_SINK, "the dataflow has no sink: end a stream with .sink(...)")
    for u, v, p in g.edges(data="partition"):
        pu, pv = g.nodes[u]["parallelism"], g.nodes[v]["parallelism"]
        if p is Partition.FORWARD and pu != pv:
            fail(
                GraphErrorReason.FORWARD_PARALLELISM,
                f"forward edge {u!r} -> {v!r} joins parallelism {pu} to {pv}: "
                "give both the same parallelism or use .rebalance()",
                v,
            )
        if g.nodes[v]["keyed"] and p is not Partition.HASH:
            fail(
                GraphErrorReason.BAD_ARGUMENT,
                f"keyed operator {v!r} must be fed through .key_by(); {u!r} feeds it directly",
                v,
            )


def resolve_partition(g: nx.DiGraph, u: str, v: str) -> Partition:
    p: Partition | None = g.edges[u, v]["partition"]
    if p is not None:  # explicit, and always HASH into a keyed operator (validate() checks)
        return p
    if g.nodes[u]["parallelism"] == g.nodes[v]["parallelism"]:
        return Partition.FORWARD
    return Partition.REBALANCE


def compile_graph(graph: LogicalGraph) -> Plan:
    g = to_networkx(graph)
    validate(graph, g)
    back = find_back_edges(g)
    for u, v in g.edges:
        g.edges[u, v]["partition"] = resolve_partition(g, u, v)

    # Chains: u -> v fuse when the edge is forward, not a back-edge, and neither branches.
    def chainable(u: str, v: str) -> bool:
        return (
            g.edges[u, v]["partition"] is Partition.FORWARD
            and (u, v) not in back
            and not g.edges[u, v]["side"]  # a side output's records are set aside, never passed on
            and g.out_degree(u) == 1
            and g.in_degree(v) == 1
        )

    order = bfs_order(g)
    head_of: dict[str, str] = {}
    chains: list[ChainSpec] = []
    for n in sorted(g.nodes, key=order.__getitem__):
        preds = list(g.predecessors(n))
        if len(preds) == 1 and chainable(preds[0], n):
            continue
        ops = [n]
        while g.out_degree(ops[-1]) == 1:
            (nxt,) = g.successors(ops[-1])
            if not chainable(ops[-1], nxt) or nxt in ops:
                break
            ops.append(nxt)
        for o in ops:
            head_of[o] = n
        chains.append(
            ChainSpec(n, tuple(ops), g.nodes[n]["parallelism"], g.nodes[n]["kind"] is NodeKind.SOURCE)
        )

    operators = tuple(
        OperatorSpec(n, g.nodes[n]["kind"].value, g.nodes[n]["label"], g.nodes[n]["parallelism"],
                     g.nodes[n]["keyed"], head_of[n], g.nodes[n]["parts"])
        for n in sorted(g.nodes, key=order.__getitem__)
    )
    # Loops: the strongly connected components that hold a cycle. Each ends on its own
    # (after everything feeding it has finished), so they are numbered upstream first.
    loop_of: dict[str, int] = {}
    comps = [c for c in nx.strongly_connected_components(g) if len(c) > 1 or any(g.has_edge(n, n) for n in c)]
    comps.sort(key=lambda c: min(order[n] for n in c))
    for lid, comp in enumerate(comps):
        for n in comp:
            loop_of[n] = lid
    feeds_of: dict[str, set[int]] = {n: set() for n in g.nodes}
    for lid, comp in enumerate(comps):
        for n in set().union(*(nx.ancestors(g, m) for m in comp)) - comp:
            feeds_of[n].add(lid)
    chains = [
        ChainSpec(c.name, c.operators, c.parallelism, c.is_source,
                  loop=next((loop_of[o] for o in c.operators if o in loop_of), -1),
                  feeds=tuple(sorted(set().union(*(feeds_of[o] for o in c.operators))
                                     - {loop_of.get(o, -1) for o in c.operators})))
        for c in chains
    ]

    # Edges inside a chain are function calls; the others become channels.
    edges = tuple(
        EdgeSpec(u, v, g.edges[u, v]["partition"].value, (u, v) in back, bool(g.edges[u, v].get("side")))
        for u, v in sorted(g.edges, key=lambda e: (order[e[0]], order[e[1]]))
        if head_of[v] == v
    )

    inputs: dict[str, list[ChannelSpec]] = {}
    outputs: dict[str, list[OutputSpec]] = {}
    for ei, e in enumerate(edges):
        src_chain, dst_chain = head_of[e.src], e.dst
        pu, pv = g.nodes[src_chain]["parallelism"], g.nodes[dst_chain]["parallelism"]
        for i in range(pu):
            producer = task_id(src_chain, i)
            targets = [i] if e.partition == Partition.FORWARD.value else list(range(pv))
            chans = []
            for j in targets:
                consumer = task_id(dst_chain, j)
                ch = ChannelSpec(channel_id(producer, consumer), producer, consumer, ei, e.back_edge)
                inputs.setdefault(consumer, []).append(ch)
                chans.append(ch.id)
            outputs.setdefault(producer, []).append(OutputSpec(ei, e.partition, e.dst, tuple(chans), e.side))

    tasks = tuple(
        TaskSpec(
            id=task_id(c.name, i),
            chain=c.name,
            index=i,
            parallelism=c.parallelism,
            inputs=tuple(inputs.get(task_id(c.name, i), ())),
            outputs=tuple(outputs.get(task_id(c.name, i), ())),
        )
        for c in chains
        for i in range(c.parallelism)
    )
    return Plan(graph.name, operators, tuple(chains), edges, tasks, graph.max_parallelism)


def explain(plan: Plan) -> str:
    """A human-readable plan: chains (fused operators), edges with back-edges marked, tasks,
    pipelines and their regions."""
    from .pipelines import describe, find_pipelines

    lines = [f"job {plan.job!r}: {len(plan.tasks)} tasks in {len(plan.chains)} chains"]
    lines.append("chains (operators fused into one task, records passed by function call):")
    for c in plan.chains:
        ops = " -> ".join(f"{o} [{plan.operator(o).label}]" for o in c.operators)
        lines.append(f"  {c.name} x{c.parallelism}{' (source)' if c.is_source else ''}: {ops}")
    lines.append("edges between chains:")
    for e in plan.edges:
        mark = "  <-- BACK-EDGE (records logged during checkpoints)" if e.back_edge else ""
        side = ", side output" if e.side else ""
        lines.append(f"  {e.src} -> {e.dst}  [{e.partition}{side}]{mark}")
    lines.append("tasks:")
    for t in plan.tasks:
        ins = len(t.inputs)
        outs = sum(len(o.channels) for o in t.outputs)
        lines.append(f"  {t.id}: {ins} input channel(s), {outs} output channel(s)")
    lines.append("pipelines and their regions (a failure restarts its region, or its pipeline; failover='job': the whole job):")
    lines += [describe(p) for p in find_pipelines(plan)]
    return "\n".join(lines)
