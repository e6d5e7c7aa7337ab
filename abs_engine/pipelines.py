"""A job's pipelines and failover regions, read off its compiled plan (pure data).

A *pipeline* is a set of operators connected upstream and downstream, loops included: a
weakly connected component of the chain graph (SeaTunnel's unit of checkpoint and
failover). Two pipelines exchange no record, so one can restart while the other runs on.

A *region* is a set of tasks joined by channels: a connected component of the task graph
(Flink's pipelined region). Inside a pipeline without a shuffle each parallel lane is a
region (forward edges join subtask i to subtask i only); one hash or rebalance edge joins
every producer to every consumer, so the region is then the whole pipeline.

Invariants (tests/abs_engine/test_pipelines.py): every task is in exactly one region of
exactly one pipeline; no channel joins two regions, no edge two pipelines; ids number the
pipelines in the order of their first chain in the plan, so they are stable for a plan.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import networkx as nx

from .plan import Plan, TaskSpec

#: A pipeline's checkpoints (and savepoints) live in ``DIR/pipeline-<name>/``.
DIR_PREFIX = "pipeline-"


@dataclass(frozen=True)
class Pipeline:
    id: int
    chains: tuple[str, ...]  #: in plan order
    tasks: tuple[str, ...]  #: in plan order
    #: its failover regions: tasks joined by channels, each in plan order
    regions: tuple[tuple[str, ...], ...]
    #: its first operator in the plan: its name in messages and its directory's
    #: (``pipeline-<name>``); unlike ``id`` and chain heads, it does not change when
    #: another pipeline is added or when parallelism changes chaining
    name: str = ""

    @property
    def directory(self) -> str:
        return DIR_PREFIX + self.name


def find_pipelines(plan: Plan) -> tuple[Pipeline, ...]:
    chain_of = {o.name: o.chain for o in plan.operators}
    order = {c.name: i for i, c in enumerate(plan.chains)}
    chains: nx.Graph = nx.Graph()
    chains.add_nodes_from(order)
    chains.add_edges_from((chain_of[e.src], chain_of[e.dst]) for e in plan.edges)
    task_order = {t.id: i for i, t in enumerate(plan.tasks)}
    tasks: nx.Graph = nx.Graph()
    tasks.add_nodes_from(task_order)
    tasks.add_edges_from((ch.producer, ch.consumer) for t in plan.tasks for ch in t.inputs)
    region_of: dict[str, int] = {}
    regions: list[tuple[str, ...]] = []
    for component in nx.connected_components(tasks):
        for t in component:
            region_of[t] = len(regions)
        regions.append(tuple(sorted(component, key=task_order.__getitem__)))
    out: list[Pipeline] = []
    for component in sorted(nx.connected_components(chains), key=lambda c: min(order[n] for n in c)):
        mine = tuple(t.id for t in plan.tasks if t.chain in component)
        ids = sorted({region_of[t] for t in mine}, key=lambda r: task_order[regions[r][0]])
        first = next(o.name for o in plan.operators if o.chain in component)
        out.append(Pipeline(len(out), tuple(sorted(component, key=order.__getitem__)), mine,
                            tuple(regions[r] for r in ids), first))
    return tuple(out)


def restrict(plan: Plan, pipeline: Pipeline) -> Plan:
    """The plan of ``pipeline`` alone: its operators, chains, edges and tasks, edges
    renumbered (a pipeline runs as a job of its own: its fingerprint, shape and layout
    are its own). Nothing is lost: no edge or channel leaves a pipeline."""
    chains = set(pipeline.chains)
    ops = {o.name for o in plan.operators if o.chain in chains}
    kept = [i for i, e in enumerate(plan.edges) if e.src in ops]
    renumber = {old: new for new, old in enumerate(kept)}

    def task(t: TaskSpec) -> TaskSpec:
        return dataclasses.replace(
            t, inputs=tuple(dataclasses.replace(c, edge=renumber[c.edge]) for c in t.inputs),
            outputs=tuple(dataclasses.replace(o, edge=renumber[o.edge]) for o in t.outputs))

    return dataclasses.replace(
        plan,
        operators=tuple(o for o in plan.operators if o.name in ops),
        chains=tuple(c for c in plan.chains if c.name in chains),
        edges=tuple(plan.edges[i] for i in kept),
        tasks=tuple(task(t) for t in plan.tasks if t.chain in chains))


def describe(pipeline: Pipeline) -> str:
    """One line for ``explain``: its chains, tasks and regions."""
    n = len(pipeline.regions)
    regions = "1 region" if n == 1 else f"{n} regions (parallel lanes joined only by forward edges)"
    return f"  pipeline {pipeline.id} ({pipeline.name!r}): {', '.join(pipeline.chains)}; {len(pipeline.tasks)} task(s) in {regions}"
