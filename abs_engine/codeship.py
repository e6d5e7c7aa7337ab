"""Shipping the user's code (operators, key functions) from the driver to the workers.

The one place cloudpickle is used. Invariant: it serialises *code the user wrote*, made in
this job's driver and sent straight to its workers; it never reads anything back from disk
or a checkpoint (those are msgpack). cloudpickle, not pickle, because lambdas, closures and
functions defined in ``__main__`` must travel by value.

Code that holds something no process can be sent (a lock, an open file or socket, a
database connection) is refused before any worker starts: a GraphError(UNSHIPPABLE) naming
the operator and the path to the object (``map function 'parse' -> global 'LOCK' (a
_thread.lock)``), never a bare ``TypeError: cannot pickle '_thread.lock' object``.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any, Iterator

import cloudpickle

from .errors import GraphError, GraphErrorReason
from .graph import LogicalGraph

#: How deep ``_culprit`` looks for the object that cannot be pickled.
MAX_DEPTH = 8


def ship(graph: LogicalGraph) -> bytes:
    """The operator templates and key functions of every node, for the workers: each
    pickled on its own, so that a worker unpickles only its own chain's code (and the key
    functions of its out-edges), and imports only what that code imports (a job whose
    sources use pyarrow does not load it into every worker)."""
    tables: dict[str, dict[str, bytes]] = {"ops": {}, "keys": {}}
    try:
        for n in graph.nodes.values():
            tables["ops"][n.name] = cloudpickle.dumps(n.template)
            tables["keys"][n.name] = cloudpickle.dumps(n.key_fn)
    except Exception as e:  # noqa: BLE001 - whatever pickling raises, find what and whose
        _explain(graph, e)
        raise
    blob: bytes = cloudpickle.dumps(tables)
    return blob


class _Unpickled(Mapping[str, Any]):
    """Node name -> its code, unpickled on first access (once)."""

    def __init__(self, blobs: dict[str, bytes]):
        self._blobs = blobs
        self._loaded: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        try:
            return self._loaded[name]
        except KeyError:
            pass
        value = self._loaded[name] = cloudpickle.loads(self._blobs[name])
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._blobs)

    def __len__(self) -> int:
        return len(self._blobs)


def load(blob: bytes) -> dict[str, Mapping[str, Any]]:
    """On a worker: the {"ops": ..., "keys": ...} tables the driver shipped (Deploy.code),
    each node's code unpickled when it is first looked up."""
    tables: dict[str, dict[str, bytes]] = cloudpickle.loads(blob)
    return {what: _Unpickled(table) for what, table in tables.items()}


def _picklable(obj: Any) -> Exception | None:
    try:
        cloudpickle.dumps(obj)
    except Exception as e:  # noqa: BLE001 - any failure to pickle counts
        return e
    return None


def _explain(graph: LogicalGraph, error: Exception) -> None:
    """Raise GraphError(UNSHIPPABLE) for the first node whose code cannot be pickled."""
    for node in graph.nodes.values():
        for what, obj in ((f"operator ({type(node.template).__name__})", node.template),
                          ("key function", node.key_fn)):
            if obj is None or _picklable(obj) is None:
                continue
            path, culprit, why = _culprit(obj, _label(obj), 0)
            raise GraphError(
                GraphErrorReason.UNSHIPPABLE,
                f"operator {node.name!r}: its {what} cannot be sent to the worker processes: {path} "
                f"(a {type(culprit).__module__}.{type(culprit).__qualname__}) cannot be pickled ({why}). "
                "Create such objects inside the function or in the operator's open(), not in the driver",
                node.name,
            ) from error


def _label(obj: Any) -> str:
    if isinstance(obj, (types.FunctionType, types.MethodType)):
        return f"function {obj.__qualname__!r}"
    return f"{type(obj).__name__} object"


def _children(obj: Any) -> Iterator[tuple[str, Any]]:
    """What ``obj`` refers to that pickling it would pickle too, with a label for each."""
    if isinstance(obj, types.MethodType):
        yield "its instance", obj.__self__
        yield f"function {obj.__func__.__qualname__!r}", obj.__func__
        return
    if isinstance(obj, types.FunctionType):
        code = obj.__code__
        for name, cell in zip(code.co_freevars, obj.__closure__ or ()):
            try:
                yield f"closure variable {name!r}", cell.cell_contents
            except ValueError:  # an empty cell
                continue
        g = obj.__globals__
        for name in _names(code):
            if name in g:
                yield f"global {name!r}", g[name]
        for i, d in enumerate(obj.__defaults__ or ()):
            yield f"default argument {i}", d
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield f"[{k!r}]", v
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        for i, v in enumerate(obj):
            yield f"[{i}]", v
        return
    state = getattr(obj, "__dict__", None)
    if isinstance(state, dict):
        for k, v in state.items():
            yield f"attribute {k!r}", v


def _names(code: types.CodeType) -> Iterator[str]:
    """Global names a code object (and the code nested in it) uses."""
    yield from code.co_names
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _names(c)


def _culprit(obj: Any, path: str, depth: int) -> tuple[str, Any, Exception]:
    """The innermost object below ``obj`` that cannot be pickled, its path and the error:
    descend into the first child that fails, until none of an object's children fails."""
    error = _picklable(obj)
    assert error is not None
    if depth < MAX_DEPTH and not isinstance(obj, (types.ModuleType, type)):
        for label, child in _children(obj):
            if _picklable(child) is not None:
                return _culprit(child, f"{path} -> {label}", depth + 1)
    return path, obj, error
