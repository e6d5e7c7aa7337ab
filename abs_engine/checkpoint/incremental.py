"""Incremental checkpoints: what a delta file holds, how a chain of files is read back, and
which files retention must keep.

A task's state file may hold, for its keyed operators (those that track the keys they
change: operators/keyed.py), only the keys changed since the file the task wrote for an
earlier *completed* checkpoint, its *base*: ``{"upserts": {key: value}, "deletes": {key:
None}}`` (deletes as a map so that keys decode exactly as the full state's keys do). The
file then records ``base`` (that checkpoint's id) and ``deltas`` (the operators stored so).
Other operators (sources, user operators) are written whole in every file.

Timed operators (windows, timers, joins: operators/timers.py) snapshot ``{"keys": map,
"timers": rows, "watermark": w}``; their delta is the keys' delta plus ``"timers"``, every
timer of the changed keys (upserted and deleted alike), and ``"watermark"``: applying it
replaces the changed keys' values and timers and takes the watermark.

Invariants:
- The metadata of checkpoint n lists, per task, the *chain* its state needs: the files,
  oldest first, from a full file to the base, each a delta on the one before, with size and
  sha256 like its own files (``ChainRef``). Restoring reads and verifies every file of the
  chain before decoding any; a corrupt, missing or mislinked one makes the checkpoint
  unusable and recovery falls back to an older one, as for any other file.
- Files are shared between checkpoints and reference-counted by the metadata themselves:
  retention recomputes, at each prune, the files that the retained checkpoints reference
  (``referenced``), plus those that tasks may still use as a base (the coordinator's
  ``protected``), and deletes a ``chk-N`` directory only when nothing references it; a
  referenced one only loses its ``_metadata`` (it is no longer a checkpoint) and its
  unreferenced files. Counting from what is on disk leaves nothing to get out of step in
  a crash.
- Chains stay short: a task writes a full file (compaction by rebasing) after
  ``MAX_CHAIN`` deltas and for the first snapshot after any start or restore, and an
  operator whose changes exceed a share of its state is written whole (runtime/increments.py). Savepoints copy the whole
  chain, so they stay self-contained.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

from ..codec import freeze
from ..errors import CheckpointError, CheckpointErrorReason
from . import spill
from .snapshot_file import TaskSnapshotData, decode_snapshot

MAX_CHAIN = 8  #: deltas on top of a full file before a task writes a full one again
_R = CheckpointErrorReason


@dataclass(frozen=True)
class ChainRef:
    """A file of another (earlier) checkpoint that this checkpoint's state needs."""

    checkpoint_id: int
    file: str
    size: int
    sha256: str

    def to_list(self) -> list[Any]:
        return [self.checkpoint_id, self.file, self.size, self.sha256]


def delta(state: dict[Any, Any], changed: Iterable[Any]) -> dict[str, dict[Any, Any]]:
    """The delta of ``state`` for the keys in ``changed`` (keys set or deleted)."""
    upserts: dict[Any, Any] = {}
    deletes: dict[Any, None] = {}
    for k in changed:
        if k in state:
            upserts[k] = state[k]
        else:
            deletes[k] = None
    return {"upserts": upserts, "deletes": deletes}


class PendingDelta:
    """A delta not built yet: the state and what changed in each epoch since the base,
    either key -> value maps (operators that record values: the delta is their merge, read
    in order, never looked up in the state) or key sets (the values are looked up). The
    encoder builds it (``build``), on the task thread when it encodes inline, in the forked
    child otherwise, so the task thread's share stays O(1) either way."""

    __slots__ = ("state", "changes", "field")

    def __init__(self, state: dict[Any, Any], changes: list[Any], field: str | None = None):
        self.state = state
        self.changes = changes
        #: None: ``state`` is the map; "keys": a timed operator's state, whose map is that field
        self.field = field

    @property
    def values(self) -> bool:
        """The changes carry their values (no lookups in the state)."""
        return bool(self.changes) and isinstance(self.changes[0], dict)

    def __len__(self) -> int:
        return sum(len(c) for c in self.changes)  # at least the keys in the delta (epochs overlap)

    def build(self) -> dict[str, Any]:
        if self.field is not None:
            return self._timed()
        if self.values:
            if len(self.changes) == 1:
                return {"upserts": self.changes[0], "deletes": {}}
            merged: dict[Any, Any] = {}
            for c in self.changes:  # oldest first: a later epoch's value wins
                merged.update(c)
            return {"upserts": merged, "deletes": {}}
        changed = self.changes[0] if len(self.changes) == 1 else set().union(*self.changes)
        return delta(self.state, changed)

    def _timed(self) -> dict[str, Any]:
        """A timed operator's delta: its changed keys, their timers, the watermark."""
        assert self.field is not None
        changed = set().union(*self.changes)
        out: dict[str, Any] = delta(self.state[self.field], changed)
        timers = []
        for domain, ts, keys in self.state["timers"]:
            mine = [k for k in keys if k in changed]
            if mine:
                timers.append([domain, ts, mine])
        out["timers"] = timers
        out["watermark"] = self.state["watermark"]
        return out


_TIMED = {"upserts", "deletes", "timers", "watermark"}


def apply(state: Any, change: Any) -> dict[Any, Any]:
    """``state`` (decoded, owned by the caller: changed in place) with a decoded delta
    applied; ValueError if either is not what a delta chain holds."""
    if isinstance(change, dict) and set(change) == _TIMED:
        return _apply_timed(state, change)
    if state is None:
        state = {}
    if not isinstance(state, dict):
        raise ValueError(f"the state under a delta is a {type(state).__name__}, not a map")
    if (not isinstance(change, dict) or set(change) != {"upserts", "deletes"}
            or not isinstance(change["upserts"], dict) or not isinstance(change["deletes"], dict)):
        raise ValueError("a delta is not {upserts: map, deletes: map}")
    for k in change["deletes"]:
        state.pop(k, None)
    state.update(change["upserts"])
    return state


def _apply_timed(state: Any, change: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(state, dict) or set(state) != {"keys", "timers", "watermark"}:
        raise ValueError("the state under a timed operator's delta is not {keys, timers, watermark}")
    timers = change["timers"]
    if not isinstance(timers, list) or not all(isinstance(r, list) and len(r) == 3 and isinstance(r[2], list)
                                               for r in timers):
        raise ValueError("a timed delta's timers are not [domain, timestamp, [keys]] rows")
    keys = apply(state["keys"], {"upserts": change["upserts"], "deletes": change["deletes"]})
    changed = set(change["upserts"]) | set(change["deletes"])
    rows: dict[tuple[Any, Any], list[Any]] = {}  # (domain, timestamp) -> keys: one row each, as a snapshot has
    for domain, ts, bucket in state["timers"]:
        kept = [k for k in bucket if freeze(k) not in changed]
        if kept:
            rows.setdefault((domain, ts), []).extend(kept)
    for domain, ts, bucket in timers:
        rows.setdefault((domain, ts), []).extend(bucket)
    return {"keys": keys, "timers": [[d, ts, ks] for (d, ts), ks in rows.items()], "watermark": change["watermark"]}


def resolve(files: list[tuple[int, TaskSnapshotData]], shown: str, checkpoint_id: int) -> TaskSnapshotData:
    """The task snapshot that a chain of decoded files (snapshot_file.TaskSnapshotData, oldest
    first, the checkpoint's own file last) stands for: every delta applied in order.
    CORRUPT_STATE if the files do not link up (each delta's base must be the file before)."""

    first_id, first = files[0]
    try:
        if first.deltas:
            raise ValueError(f"the chain starts at checkpoint {first_id}'s file, which is itself a delta")
        states = dict(first.states)
        prev = first_id
        for cid, snap in files[1:]:
            if snap.base != prev:
                raise ValueError(f"checkpoint {cid}'s file is a delta on {snap.base}, but the chain has {prev}")
            for name, st in snap.states.items():
                states[name] = apply(states.get(name), st) if name in snap.deltas else st
            prev = cid
    except ValueError as e:
        raise CheckpointError(_R.CORRUPT_STATE, f"{shown}: the incremental chain does not link up ({e}); the "
                              "checkpoint is unusable (an older one is used if there is one)", checkpoint_id) from e
    top = files[-1][1]
    return TaskSnapshotData({n: states[n] for n in top.states}, top.logs, top.finished)


def load_chain(read: Callable[[int, str, int, str], tuple[bytes, str]], checkpoint_id: int,
               own: tuple[str, int, str], chain: list[ChainRef], keep_spilled: bool = True) -> TaskSnapshotData:
    """A task's resolved snapshot: ``read(cid, file, size, sha256)`` returns the verified
    bytes of one file (and how it is shown); every file of the chain is read and verified
    before any is decoded."""

    blobs = []
    for ref in chain:
        try:
            blobs.append((ref.checkpoint_id, *read(ref.checkpoint_id, ref.file, ref.size, ref.sha256)))
        except CheckpointError as e:
            if e.reason is _R.UNREACHABLE:
                raise
            # Reported as this checkpoint's failure: it is the one that cannot be restored.
            raise CheckpointError(e.reason, f"checkpoint {checkpoint_id} builds on a file of checkpoint "
                                  f"{ref.checkpoint_id} (incremental): {e}", checkpoint_id) from e
    blobs.append((checkpoint_id, *read(checkpoint_id, *own)))
    snaps = [(cid, decode_snapshot(blob, shown, checkpoint_id)) for cid, blob, shown in blobs]
    # Logs are the own file's only (with its spill files); the chain's files add state.
    own_snap = spill.attach(snaps[-1][1], read, checkpoint_id, keep_spilled)
    if len(snaps) == 1 and not own_snap.deltas:
        return own_snap
    return resolve(snaps[:-1] + [(checkpoint_id, own_snap)], blobs[-1][2], checkpoint_id)


def referenced(metas: Iterable[Any]) -> dict[int, set[str]]:
    """checkpoint id -> the file names in its directory that the given checkpoints
    (storage.Metadata) need: their own files and their chains."""
    out: dict[int, set[str]] = {}
    for meta in metas:
        out.setdefault(meta.checkpoint_id, set()).update(e.file for e in meta.tasks.values())
        for refs in meta.chains.values():
            for ref in refs:
                out.setdefault(ref.checkpoint_id, set()).add(ref.file)
    return out


def merge(*needs: dict[int, set[str]]) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for need in needs:
        for cid, files in need.items():
            out.setdefault(cid, set()).update(files)
    return out
