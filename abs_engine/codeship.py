"""Shipping the user's code (operators, key functions) from the driver to the workers.

The one place cloudpickle is used. Invariant: it serialises *code the user wrote*, made in
this job's driver and sent straight to its workers; it never reads anything back from disk
or a checkpoint (those are msgpack). cloudpickle, not pickle, because lambdas, closures and
functions defined in ``__main__`` must travel by value.
"""

from __future__ import annotations

from typing import Any

import cloudpickle

from .graph import LogicalGraph


def ship(graph: LogicalGraph) -> bytes:
    """The operator templates and key functions of every node, for the workers."""
    blob: bytes = cloudpickle.dumps(
        {
            "ops": {n.name: n.template for n in graph.nodes.values()},
            "keys": {n.name: n.key_fn for n in graph.nodes.values()},
        }
    )
    return blob


def load(blob: bytes) -> dict[str, Any]:
    """On a worker: the {"ops": ..., "keys": ...} tables the driver shipped (Deploy.code)."""
    tables: dict[str, Any] = cloudpickle.loads(blob)
    return tables
