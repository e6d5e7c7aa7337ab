"""The state-file format: one module writes it (``encode``) and reads it (``decode_snapshot``).

A task's state file for a checkpoint is the msgpack map {task, checkpoint_id, operators,
logs, finished}; a delta file (checkpoint/incremental.py) adds {base, deltas}, one whose
channel-state logs spilled (checkpoint/spill.py) adds {spilled}: its spill files in order.
``operators`` maps each operator's name to its state, packed on its own (so the task can
splice a state encoded elsewhere -- by a forked child -- into the file without a second
encoding). Reading never raises a msgpack error: a file that passed its checksum but does
not decode is a CheckpointError(CORRUPT_STATE).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from .. import codec
from ..errors import CheckpointError, CheckpointErrorReason
from . import spill


def encode(task: str, checkpoint_id: int, operators: bytes, logs: dict[str, bytes], finished: bool,
                  base: int | None = None, deltas: list[str] | None = None,
                  spilled: list[tuple[str, int, str]] | None = None) -> bytes:
    """A task's state file (read by ``decode_snapshot``): the msgpack map
    {task, checkpoint_id, operators, logs, finished}, with ``operators`` spliced in as the
    already packed map it is (no second encoding of the state); a delta file also has
    {base, deltas} (checkpoint/incremental.py), one whose logs spilled {spilled}: its
    spill files in order (checkpoint/spill.py)."""
    p = msgpack.Packer(use_bin_type=True)
    extra = [p.pack("base"), p.pack(base), p.pack("deltas"), p.pack(deltas)] if deltas else []
    if spilled:
        extra += [p.pack("spilled"), p.pack([list(r) for r in spilled])]
    return b"".join([p.pack_map_header(5 + len(extra) // 2), p.pack("task"), p.pack(task), p.pack("checkpoint_id"),
                     p.pack(checkpoint_id), p.pack("operators"), operators, p.pack("logs"), p.pack(logs),
                     p.pack("finished"), p.pack(finished), *extra])


@dataclass(frozen=True)
class TaskSnapshotData:
    states: dict[str, Any]  #: operator -> decoded state (arrays as lists, map keys as tuples)
    logs: dict[str, list[Any]]  #: back-edge channel -> records logged in flight (arrays as tuples)
    finished: bool  #: the task had finished (end of stream sent) when it snapshotted
    #: Incremental files: the checkpoint this file's deltas apply to, and the operators
    #: stored as deltas (checkpoint/incremental.py); None and empty for a full file.
    base: int | None = None
    deltas: frozenset[str] = frozenset()
    #: Spill files (checkpoint/spill.py) holding the older part of ``logs``, not read yet:
    #: empty once resolved (every reader here resolves them).
    spilled: tuple[tuple[str, int, str], ...] = ()


def decode_snapshot(blob: bytes, path: str, checkpoint_id: int | None = None) -> TaskSnapshotData:
    """A task's state file, decoded. Raises CheckpointError(CORRUPT_STATE), never a msgpack error.

    Operator states decode with ``codec.unpack_state`` (lists stay lists); back-edge
    records with ``codec.unpack`` (records cross processes as tuples)."""
    try:
        doc = codec.unpack(blob)
        if not isinstance(doc, dict) or not isinstance(doc.get("operators"), dict):
            raise ValueError("not a map with an 'operators' map")
        logs_raw = doc.get("logs", {})
        if not isinstance(logs_raw, dict):
            raise ValueError("'logs' is not a map")
        states = {name: codec.unpack_state(data) for name, data in doc["operators"].items()}
        logs = {ch: list(codec.unpack(data)) for ch, data in logs_raw.items()}
        base, deltas = doc.get("base"), doc.get("deltas", [])
        if not isinstance(deltas, (list, tuple)) or not all(isinstance(n, str) and n in states for n in deltas):
            raise ValueError("'deltas' is not a list of its operators")
        if deltas and (not isinstance(base, int) or isinstance(base, bool) or base < 0):
            raise ValueError(f"a delta file's base {base!r} is not a checkpoint id")
        return TaskSnapshotData(states, logs, bool(doc.get("finished", False)), base if deltas else None,
                                frozenset(deltas), spill.parse_refs(doc.get("spilled")))
    except Exception as e:
        raise CheckpointError(CheckpointErrorReason.CORRUPT_STATE,
                              f"state file {path} passes its checksum but cannot be decoded ({e}): it was "
                              "written by another program or version; the checkpoint is unusable",
                              checkpoint_id) from e


def decode_state(blob: bytes, path: str) -> dict[str, Any]:
    """A task's state file -> {operator: decoded state}."""
    return decode_snapshot(blob, path).states
