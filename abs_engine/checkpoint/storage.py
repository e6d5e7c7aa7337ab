"""Durable checkpoint storage: what a checkpoint is, which one to restore, which to keep.

The logic is here, once; the bytes move through a ``CheckpointStore`` (stores.py): a local
directory (``LocalStore``, descriptor-safe), a remote one (remote.py's ``RemoteStore``), or
memory (the simulation's, simulation/storage.py), so the simulation runs this retention
and verification, not a copy.

Layout: ``ROOT/chk-000042/`` holds one ``<task>.<tag>.state`` msgpack file per task
(written by the workers; the tag names the attempt that wrote it) and ``_metadata``
(written by the coordinator, last); a local ``ROOT/_lock`` is the job's directory lock
(see lock.py). The metadata schema is metadata.py's; the state-file format
snapshot_file.py's. Invariants:
- A checkpoint exists iff its ``_metadata`` is present and valid; the store's
  ``put_metadata`` is the commit point.
- The metadata carries size and sha256 of every state file it references and a sha256 of
  itself; ``verify`` checks all of them, and decodes every state file, before anything is
  restored. A checkpoint that fails any check is skipped by ``latest_valid``; a store
  that cannot be reached (UNREACHABLE) is never skipped past.
- No pickle: every file is msgpack.
- Nothing read back is trusted: names read from metadata must be plain file names (no
  separator, no ``..``, not absolute, no leading dot: checked when the metadata is parsed,
  and again by the store before it reads), and every read is bounded by the recorded size
  (or ``MAX_METADATA``).
- Retention (``prune``) keeps the newest ``retain`` completed checkpoints (``retained``)
  and every file they, or running tasks, may still build on; it never touches a
  directory newer than the newest completed checkpoint (in progress).
- The root given to ``CheckpointStorage`` as a path is resolved once (``realpath``): the
  user chose it; below it, the local store follows no symlink.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ..errors import CheckpointError, CheckpointErrorReason
from . import spill
from .incremental import load_chain, merge, referenced
from .snapshot_file import TaskSnapshotData, decode_snapshot
from .metadata import Metadata, encode_metadata, parse_metadata
from .safe_io import check_name
from .stores import CheckpointStore, LocalStore

_R = CheckpointErrorReason


def retained(completed: list[int], retain: int) -> set[int]:
    """The completed checkpoints (ascending) retention keeps: the newest ``retain``."""
    return set(completed[-retain:])


class CheckpointStorage:
    """Checkpoints in ``store`` (or a local directory, given as a path), the newest
    ``retain`` kept."""

    def __init__(self, store: CheckpointStore | str, retain: int = 3):
        if retain < 1:
            raise ValueError("retain must be >= 1")
        self.store: CheckpointStore = LocalStore(os.path.realpath(store)) if isinstance(store, str) else store
        self.root = self.store.root
        self.shown = self.store.shown  #: how the root appears in messages (a URI without credentials)
        self.retain = retain

    def dir_of(self, checkpoint_id: int) -> str:
        return self.store.dir_of(checkpoint_id)

    def make_root(self) -> None:
        self.store.make_root()

    def ids_on_disk(self) -> list[int]:
        """Every ``chk-N`` entry (directory or not: anything planted is reported by verify),
        with or without valid metadata, ascending. Other names (``_lock``) are ignored."""
        return self.store.ids()

    def completed_ids(self) -> list[int]:
        """Checkpoints whose metadata file is present (validity is checked on load)."""
        return [i for i in self.ids_on_disk() if self.store.has_metadata(i)]

    # ---- writing ------------------------------------------------------------------------

    def write_metadata(self, meta: Metadata) -> str:
        """Commit a checkpoint: its ``_metadata``, put atomically by the store. Refuses
        unsafe names (UNSAFE_PATH)."""
        cid = meta.checkpoint_id
        for task, e in meta.tasks.items():
            check_name(e.file, f"checkpoint {cid}: state file of task {task}", cid)
        return self.store.put_metadata(cid, encode_metadata(meta))

    def prune(self, protect: dict[int, set[str]] | None = None) -> list[int]:
        """Keep the newest ``retain`` completed checkpoints; delete older ones and orphans
        (directories without metadata) older than the newest completed one. Files that a
        kept checkpoint's incremental chains reference, or that ``protect`` names
        (checkpoint id -> file names: what running tasks may still build on), survive: a
        directory holding such files only loses its ``_metadata`` and its other files
        (checkpoint/incremental.py). Returns the ids that are no longer checkpoints."""
        completed = self.completed_ids()
        keep = retained(completed, self.retain)
        newest = completed[-1] if completed else 0
        metas = []
        for i in sorted(keep):
            try:
                metas.append(self.load_metadata(i))
            except CheckpointError as e:
                if e.reason is _R.UNREACHABLE:
                    return []  # cannot tell what is referenced: delete nothing now
                # unusable: what it references does not matter
        needed = merge(referenced(metas), protect or {})
        removed = []
        for i in self.ids_on_disk():
            if i in keep or i > newest:
                continue
            if i in needed:
                if self.store.has_metadata(i) or self.store.list_files(i) - needed[i]:
                    self.store.retire(i, needed[i])
                    removed.append(i)
                continue
            self.store.remove(i)
            removed.append(i)
        return removed

    def remove_orphans_after(self, checkpoint_id: int) -> list[int]:
        """At a restart: directories newer than the checkpoint restored from are from the
        failed attempt (incomplete or unusable); delete those without metadata."""
        removed = []
        for i in self.ids_on_disk():
            if i > checkpoint_id and not self.store.has_metadata(i):
                self.store.remove(i)
                removed.append(i)
        return removed

    # ---- reading ------------------------------------------------------------------------

    def load_metadata(self, checkpoint_id: int) -> Metadata:
        """The metadata of a checkpoint, read safely (bounded by MAX_METADATA, nothing
        followed) and validated field by field."""
        raw, path = self.store.read_metadata(checkpoint_id)
        return parse_metadata(raw, checkpoint_id, path)

    def read_blobs(self, checkpoint_id: int, meta: Metadata, tasks: list[str]) -> dict[str, tuple[bytes, str]]:
        """The verified bytes of the given tasks' state files (size and sha256 as in
        ``meta``), each with how its path is shown."""
        entries = {t: meta.tasks[t] for t in tasks}
        return {t: self.store.read_file(checkpoint_id, e.file, e.size, e.sha256, t) for t, e in entries.items()}

    def _snapshots(self, checkpoint_id: int, meta: Metadata, tasks: list[str] | None = None,
                   keep_spilled: bool = True) -> dict[str, TaskSnapshotData]:
        """The tasks' snapshots, every file verified and decoded; ``keep_spilled=False``
        (verification only): spill files are checked one at a time and not kept."""
        tasks = list(meta.tasks) if tasks is None else tasks
        plain = [t for t in tasks if t not in meta.chains]
        blobs = self.read_blobs(checkpoint_id, meta, plain)
        read = self.store.read_file
        out = {task: spill.attach(decode_snapshot(blob, f"{shown} (task {task})", checkpoint_id), read,
                                  checkpoint_id, keep_spilled)
               for task, (blob, shown) in blobs.items()}
        for t in tasks:
            if t in meta.chains:
                e = meta.tasks[t]
                out[t] = load_chain(read, checkpoint_id, (e.file, e.size, e.sha256), meta.chains[t], keep_spilled)
        for t, snap in out.items():
            if snap.deltas and t not in meta.chains:
                raise CheckpointError(_R.CORRUPT_STATE, f"checkpoint {checkpoint_id}: the state file of task {t} "
                                      "holds deltas but the metadata names no chain for it: the checkpoint is "
                                      "unusable", checkpoint_id)
        return out

    def verify(self, checkpoint_id: int) -> Metadata:
        """Load the metadata, check size and sha256 of every file it references, and decode
        each one (CORRUPT_STATE if it does not decode)."""
        meta = self.load_metadata(checkpoint_id)
        self._snapshots(checkpoint_id, meta, keep_spilled=False)
        return meta

    def latest_valid(self, fingerprint: str | None = None, job_id: str | None = None,
                     unusable: dict[int, str] | None = None, shape: str | None = None,
                     any_shape: bool = False, operators: set[str] | None = None
                     ) -> tuple[Metadata | None, list[CheckpointError]]:
        """The newest checkpoint that passes verification; the errors of those skipped.

        With ``job_id``, a checkpoint taken by another job (a different, non-empty job id)
        is skipped with FOREIGN_JOB. With ``fingerprint``, the newest valid checkpoint of
        another plan shape raises PLAN_MISMATCH, unless ``shape`` is given and equals the
        checkpoint's (the same dataflow at another parallelism: the caller rescales), or
        ``any_shape`` (allow_non_restored_state: the caller restores operators by name).
        ``operators`` (the dataflow's) only make a PLAN_MISMATCH say what changed.
        ``unusable`` (id -> why) are skipped too: checkpoints a worker already failed to restore."""
        skipped: list[CheckpointError] = []
        for cid in reversed(self.completed_ids()):
            if unusable and cid in unusable:
                skipped.append(CheckpointError(_R.CORRUPT_STATE, f"checkpoint {cid} could not be restored: "
                                               f"{unusable[cid]}", cid))
                continue
            try:
                meta = self.verify(cid)
            except CheckpointError as e:
                if e.reason is _R.UNREACHABLE:
                    raise  # the store is down, not the checkpoint: never fall back past it
                skipped.append(e)
                continue
            if job_id is not None and meta.job_id and meta.job_id != job_id:
                skipped.append(CheckpointError(
                    _R.FOREIGN_JOB,
                    f"checkpoint {cid} in {self.shown} belongs to job id {meta.job_id!r}, not {job_id!r}: "
                    "two jobs must not share a checkpoint directory; give each job a directory of its own",
                    cid,
                ))
                continue
            if fingerprint is not None and meta.fingerprint != fingerprint:
                if (shape is not None and meta.layout.get("shape") == shape) or (any_shape and meta.layout):
                    return meta, skipped  # the same dataflow at another parallelism, or a changed one
                old = set(meta.layout.get("operators", {}))
                diff = ""
                if operators is not None and old and old != operators:
                    diff = (f"; operators removed: {sorted(old - operators) or 'none'}, "
                            f"added: {sorted(operators - old) or 'none'}")
                raise CheckpointError(
                    _R.PLAN_MISMATCH,
                    f"checkpoint {cid} in {self.shown} was taken by a job of another shape "
                    f"(operators or edges changed{diff}; a change of parallelism alone is rescaled): restore "
                    "with the same dataflow, or use an empty checkpoint directory; to restore it into the "
                    "changed dataflow on purpose (operators matched by name, state of removed ones dropped, "
                    "added ones starting empty) pass allow_non_restored_state=True",
                    cid,
                )
            return meta, skipped
        return None, skipped

    def read_snapshot(self, checkpoint_id: int, task: str, meta: Metadata | None = None) -> TaskSnapshotData:
        """One task's decoded snapshot, read with every check (``meta`` defaults to
        verify()'s; the file is checked against it again either way)."""
        meta = meta or self.verify(checkpoint_id)
        return self._snapshots(checkpoint_id, meta, [task])[task]

    def read_state(self, checkpoint_id: int, task: str, meta: Metadata | None = None) -> dict[str, Any]:
        """Decoded per-operator state of one task (``meta`` as in read_snapshot)."""
        return self.read_snapshot(checkpoint_id, task, meta).states

    def read_logs(self, checkpoint_id: int, task: str, meta: Metadata | None = None) -> dict[str, list[Any]]:
        """The records a task logged on its back-edges for this checkpoint (``meta`` as in
        read_snapshot)."""
        return self.read_snapshot(checkpoint_id, task, meta).logs

    def describe(self, checkpoint_id: int) -> dict[str, Any]:
        meta = self.load_metadata(checkpoint_id)
        d = self.dir_of(checkpoint_id)
        size = sum(e.size for e in meta.tasks.values())
        return {
            "checkpoint_id": checkpoint_id,
            "created": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(meta.created)),
            "final": meta.final,
            "tasks": len(meta.tasks),
            "bytes": size,
            "duration_ms": round(meta.duration_ms, 1),
            "path": d,
            #: incremental: the checkpoints whose files this one's state builds on
            "builds_on": sorted({r.checkpoint_id for refs in meta.chains.values() for r in refs}),
        }
