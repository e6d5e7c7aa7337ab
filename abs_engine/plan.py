"""The compiled physical plan: pure, frozen data (no operator objects, no sockets).

A *chain* is a run of operators joined by forward edges, fused into one task so records
pass between them by function call. A *task* is one parallel instance of a chain and runs
in its own worker process. A *channel* joins a producer task to a consumer task.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Any

from . import codec


@dataclass(frozen=True)
class OperatorSpec:
    name: str
    kind: str  #: graph.NodeKind value
    label: str
    parallelism: int
    keyed: bool
    chain: str
    #: The shape of its state (operators/state_layout.py), as (field, part) pairs: field ""
    #: for the whole state; empty for an operator that declares none. What ``checkpoints
    #: show`` reads the state by (keys, timers, a watermark).
    state_parts: tuple[tuple[str, str], ...] = ()


def operator_kind(o: OperatorSpec) -> str:
    """What an operator's state is shaped by: its node kind, its operator (the label without
    its function) and whether it is keyed, e.g. ``operator count_final keyed``; an operator
    of the same name but another kind cannot restore the old one's state."""
    return " ".join([o.kind, o.label.split("(", 1)[0]] + (["keyed"] if o.keyed else []))


@dataclass(frozen=True)
class ChainSpec:
    name: str  #: the head operator's name
    operators: tuple[str, ...]
    parallelism: int
    is_source: bool
    loop: int = -1  #: the loop (strongly connected component with a cycle) it is in, or -1
    feeds: tuple[int, ...] = ()  #: loops it is not in but its output reaches


@dataclass(frozen=True)
class EdgeSpec:
    src: str  #: producer operator (a chain's tail)
    dst: str  #: consumer operator (a chain's head)
    partition: str  #: graph.Partition value
    back_edge: bool
    side: bool = False  #: a side output (graph.Edge.side)


@dataclass(frozen=True)
class ChannelSpec:
    id: str
    producer: str  #: task id
    consumer: str  #: task id
    edge: int  #: index into Plan.edges
    back_edge: bool


@dataclass(frozen=True)
class OutputSpec:
    """One out-edge of a task's chain: the channels, ordered by consumer subtask index."""

    edge: int
    partition: str
    key_operator: str  #: whose key function partitions this edge (the consumer)
    channels: tuple[str, ...]
    side: bool = False  #: a side output: only the records the producer sets aside


@dataclass(frozen=True)
class TaskSpec:
    id: str
    chain: str
    index: int
    parallelism: int
    inputs: tuple[ChannelSpec, ...]
    outputs: tuple[OutputSpec, ...]


@dataclass(frozen=True)
class Plan:
    job: str
    operators: tuple[OperatorSpec, ...]
    chains: tuple[ChainSpec, ...]
    edges: tuple[EdgeSpec, ...]
    tasks: tuple[TaskSpec, ...]
    max_parallelism: int = 128  #: key groups (keygroups.py), fixed for the life of the job

    @property
    def back_edges(self) -> tuple[EdgeSpec, ...]:
        return tuple(e for e in self.edges if e.back_edge)

    def loops(self) -> dict[int, tuple[frozenset[str], frozenset[str]]]:
        """loop id -> (its tasks, the tasks outside it that feed it)."""
        out: dict[int, tuple[frozenset[str], frozenset[str]]] = {}
        for lid in sorted({c.loop for c in self.chains if c.loop >= 0}):
            inside = {c.name for c in self.chains if c.loop == lid}
            feeding = {c.name for c in self.chains if lid in c.feeds}
            out[lid] = (frozenset(t.id for t in self.tasks if t.chain in inside),
                        frozenset(t.id for t in self.tasks if t.chain in feeding))
        return out

    def task(self, task_id: str) -> TaskSpec:
        for t in self.tasks:
            if t.id == task_id:
                return t
        raise KeyError(task_id)

    def chain(self, name: str) -> ChainSpec:
        for c in self.chains:
            if c.name == name:
                return c
        raise KeyError(name)

    def operator(self, name: str) -> OperatorSpec:
        for o in self.operators:
            if o.name == name:
                return o
        raise KeyError(name)

    def fingerprint(self) -> str:
        """Identifies the plan's shape: a checkpoint only restores into the same shape."""
        shape = [
            [[c.name, c.operators] for c in self.chains],
            [[o.name, o.kind, o.keyed, o.parallelism] for o in self.operators],
            [[e.src, e.dst, e.partition, e.back_edge] + (["side"] if e.side else []) for e in self.edges],
            [[t.id, [c.id for c in t.inputs]] for t in self.tasks],
            self.max_parallelism,
        ]
        return hashlib.sha256(codec.pack(shape)).hexdigest()[:16]

    def logical_edges(self) -> list[tuple[str, str, bool, bool]]:
        """(producer, consumer, hash-partitioned, back-edge) for every operator-to-operator
        edge, inside chains too: what does not change when parallelism (and so chaining)
        does."""
        inner = [(a, b, False, False) for c in self.chains for a, b in zip(c.operators, c.operators[1:])]
        outer = [(e.src, e.dst, e.partition == "hash", e.back_edge) for e in self.edges]
        return sorted(inner + outer)

    def shape(self) -> str:
        """The dataflow without its parallelism: operators and logical edges. A checkpoint of
        the same shape restores at any parallelism (rescaling)."""
        ops = sorted([o.name, o.kind, o.keyed] for o in self.operators)
        return hashlib.sha256(codec.pack([ops, [list(e) for e in self.logical_edges()]])).hexdigest()[:16]

    def layout(self) -> dict[str, Any]:
        """What a rescale needs to know of the plan a checkpoint was taken with (pure data,
        stored in its metadata): its shape and, per operator, its tasks in subtask order."""
        tasks_of: dict[str, list[str]] = {}
        for c in self.chains:
            ids = [t.id for t in sorted((t for t in self.tasks if t.chain == c.name), key=lambda t: t.index)]
            for op in c.operators:
                tasks_of[op] = ids
        return {"shape": self.shape(), "operators": tasks_of, "max_parallelism": self.max_parallelism,
                "keyed": sorted(o.name for o in self.operators if o.keyed),
                "kinds": {o.name: operator_kind(o) for o in self.operators},
                "parts": {o.name: [list(p) for p in o.state_parts] for o in self.operators if o.state_parts}}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Plan":
        return Plan(
            job=d["job"],
            operators=tuple(OperatorSpec(**(o | {"state_parts": tuple(tuple(x) for x in o.get("state_parts", ()))}))
                            for o in d["operators"]),
            chains=tuple(
                ChainSpec(c["name"], tuple(c["operators"]), c["parallelism"], c["is_source"], c["loop"],
                          tuple(c["feeds"]))
                for c in d["chains"]
            ),
            edges=tuple(EdgeSpec(**e) for e in d["edges"]),
            tasks=tuple(
                TaskSpec(
                    id=t["id"],
                    chain=t["chain"],
                    index=t["index"],
                    parallelism=t["parallelism"],
                    inputs=tuple(ChannelSpec(**c) for c in t["inputs"]),
                    outputs=tuple(
                        OutputSpec(o["edge"], o["partition"], o["key_operator"], tuple(o["channels"]),
                                   bool(o.get("side", False)))
                        for o in t["outputs"]
                    ),
                )
                for t in d["tasks"]
            ),
            max_parallelism=int(d.get("max_parallelism", 128)),
        )
