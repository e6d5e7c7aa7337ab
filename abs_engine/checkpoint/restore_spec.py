"""What one task restores, as the driver plans it (checkpoint/rescale.py) and a worker
reads it (runtime/restore.py): one type per case, and one way each travels in a Deploy.

- ``SamePlan``: a checkpoint of the same plan: the task's own state file (a ``FileRef``,
  as the checkpoint's metadata records it, with its incremental chain).
- ``Rescale``: a checkpoint of the same dataflow at another parallelism, or of a changed
  dataflow restored operator by operator: the old subtasks' files to read, which old
  subtasks' state each operator of the new chain rebuilds from, and where channel state is
  replayed.

Invariant: ``from_data(to_data(spec)) == spec``; anything else ``from_data`` is given
raises ProtocolError(MALFORMED), naming the field (a Deploy is the authenticated driver's
data, so that is a bug or a tampered connection, never a user's error).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from ..errors import ProtocolError, ProtocolErrorReason
from .incremental import ChainRef
from .metadata import FileRef

__all__ = ["Inflight", "Rescale", "RestoreSpec", "SamePlan", "from_data", "to_data"]


@dataclass(frozen=True)
class SamePlan:
    checkpoint_id: int
    root: str  #: the checkpoint directory the files are under
    file: FileRef
    chain: tuple[ChainRef, ...] = ()  #: incremental: the earlier files ``file`` builds on, oldest first


@dataclass(frozen=True)
class Inflight:
    """Channel state one operator of the new chain replays: what ``sources`` (old subtasks
    it headed) logged; ``route``: its parallelism changed, so each record goes to the
    subtask that now owns it (by key group when ``keyed``: the operator is keyed or all its
    inputs are hash edges; else every n-th)."""

    operator: str
    sources: tuple[str, ...]
    route: bool
    keyed: bool


@dataclass(frozen=True)
class Rescale:
    checkpoint_id: int
    root: str
    files: dict[str, FileRef]  #: old task id -> its state file
    chains: dict[str, tuple[ChainRef, ...]]  #: old task id -> the incremental chain of its file
    operators: dict[str, tuple[str, ...]]  #: operator -> the old subtasks whose state it rebuilds from
    changed: frozenset[str]  #: operators whose parallelism changed (their states are split)
    inflight: tuple[Inflight, ...]
    max_parallelism: int


RestoreSpec = Union[SamePlan, Rescale]


def to_data(spec: RestoreSpec) -> dict[str, Any]:
    """``spec`` as msgpack-able data for a Deploy."""
    if isinstance(spec, SamePlan):
        return {"kind": "same", "checkpoint_id": spec.checkpoint_id, "root": spec.root, "file": _file(spec.file),
                "chain": [r.to_list() for r in spec.chain]}
    return {"kind": "rescale", "checkpoint_id": spec.checkpoint_id, "root": spec.root,
            "files": {t: _file(f) for t, f in spec.files.items()},
            "chains": {t: [r.to_list() for r in c] for t, c in spec.chains.items()},
            "operators": {op: list(olds) for op, olds in spec.operators.items()},
            "changed": sorted(spec.changed),
            "inflight": [[f.operator, list(f.sources), f.route, f.keyed] for f in spec.inflight],
            "max_parallelism": spec.max_parallelism}


def from_data(data: Any) -> RestoreSpec:
    """The spec ``to_data`` made; ProtocolError(MALFORMED) for anything else."""
    try:
        kind = _get(data, "kind", str)
        cid, root = _get(data, "checkpoint_id", int), _get(data, "root", str)
        if kind == "same":
            return SamePlan(cid, root, _file_of(data["file"]), _chain_of(data["chain"]))
        if kind == "rescale":
            return Rescale(
                cid, root,
                {_str(t): _file_of(f) for t, f in _get(data, "files", dict).items()},
                {_str(t): _chain_of(c) for t, c in _get(data, "chains", dict).items()},
                {_str(op): _strs(olds) for op, olds in _get(data, "operators", dict).items()},
                frozenset(_strs(data["changed"])),
                tuple(Inflight(_str(op), _strs(src), _bool(route), _bool(keyed))
                      for op, src, route, keyed in _seq(data["inflight"])),
                _get(data, "max_parallelism", int))
        raise ValueError(f"unknown kind {kind!r}")
    except (KeyError, TypeError, ValueError) as e:
        raise ProtocolError(ProtocolErrorReason.MALFORMED, f"malformed restore spec in a Deploy: {e}") from None


def _file(f: FileRef) -> list[Any]:
    return [f.file, f.size, f.sha256]


def _file_of(raw: Any) -> FileRef:
    name, size, sha = _seq(raw)
    return FileRef(_str(name), _int(size), _str(sha))


def _chain_of(raw: Any) -> tuple[ChainRef, ...]:
    return tuple(ChainRef(_int(c), _str(f), _int(n), _str(sha)) for c, f, n, sha in _seq(raw))


def _get(data: Any, key: str, t: type) -> Any:
    if not isinstance(data, dict):
        raise TypeError(f"not a map: {type(data).__name__}")
    v = data[key]
    if not isinstance(v, t) or (t is int and isinstance(v, bool)):
        raise TypeError(f"{key!r} is a {type(v).__name__}, not a {t.__name__}")
    return v


def _seq(v: Any) -> list[Any] | tuple[Any, ...]:
    if not isinstance(v, (list, tuple)):
        raise TypeError(f"not an array: {type(v).__name__}")
    return v


def _strs(v: Any) -> tuple[str, ...]:
    return tuple(_str(s) for s in _seq(v))


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"not a string: {type(v).__name__}")
    return v


def _int(v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"not an integer: {type(v).__name__}")
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"not a boolean: {type(v).__name__}")
    return v
