"""The logical dataflow graph as the user built it: nodes (operators) and edges.

Nodes hold the user's operator *templates* (code); the compiler turns this into a
networkx DiGraph and then into a Plan, which is pure data.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable


class NodeKind(enum.Enum):
    SOURCE = "source"
    OPERATOR = "operator"
    SINK = "sink"


class Partition(enum.Enum):
    """How records cross a non-chained edge."""

    FORWARD = "forward"  #: subtask i -> subtask i (equal parallelism)
    HASH = "hash"  #: by hash of the consumer's key, into a keyed operator
    REBALANCE = "rebalance"  #: round robin, one batch at a time


@dataclass
class Node:
    name: str
    kind: NodeKind
    template: Any  #: an operators.Operator / Source / Sink instance, shipped to workers
    label: str  #: what explain() prints, e.g. "flat_map(split)"
    parallelism: int | None = None  #: None: the dataflow's default
    key_fn: Callable[[Any], Any] | None = None
    keyed: bool = False  #: input must be hash-partitioned by key_fn
    feedback: bool = False  #: a feedback placeholder (closes a loop when connected)
    connected: bool = True


@dataclass
class Edge:
    src: str
    dst: str
    partition: Partition | None = None  #: None: chosen by the compiler
    #: A side output (a window's late records): carries only what the producer sets aside
    #: (``take_side_output``), never its main output. Its producer ends its chain.
    side: bool = False


@dataclass
class LogicalGraph:
    name: str
    default_parallelism: int = 1
    max_parallelism: int = 128  #: key groups: the most subtasks a keyed operator can ever have
    nodes: dict[str, Node] = field(default_factory=dict)
    edges: list[Edge] = field(default_factory=list)
