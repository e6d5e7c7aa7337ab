"""Durable checkpoint storage on a file system, with the directory distrusted.

Layout: ``DIR/chk-000042/`` holds one ``<task>.<tag>.state`` msgpack file per task
(written by the workers; the tag names the attempt that wrote it) and ``_metadata``
(written by the coordinator, last); ``DIR/_lock`` is the job's directory lock (see
lock.py). The checks below are safe_io.py's; the metadata schema is metadata.py's; the
state-file format snapshot_file.py's. Invariants:
- A checkpoint exists iff its ``_metadata`` is present and valid. The metadata is written
  to a temp file, fsynced, renamed into place, and the directory fsynced.
- The metadata carries size and sha256 of every state file it references and a sha256 of
  itself; ``verify`` checks all of them, and decodes every state file, before anything is
  restored. A checkpoint that fails any check is skipped by ``latest_valid``.
- No pickle: every file is msgpack.
- Anyone who can write the directory can plant files in it, so nothing found there is
  trusted: names read from metadata must be plain file names (no separator, no ``..``,
  not absolute, no leading dot); every file and directory is opened relative to its
  parent's descriptor with ``O_NOFOLLOW`` (a symlink is refused, never followed), files
  with ``O_NONBLOCK`` (a FIFO cannot block the open) and must be regular files
  (``fstat``); reads are bounded by the recorded size (or ``MAX_METADATA``), so a file
  that grows, or a device, cannot exhaust memory.
- Private: checkpoint directories are made 0700 and files 0600 (checkpoint/directory.py
  makes the root 0700), so no other local user reads a record of the job.
- Writes never follow or overwrite what is planted: directories are made with ``mkdir``
  and refused if they are symlinks or not directories; files are created with
  ``O_CREAT | O_EXCL | O_NOFOLLOW``. Pruning unlinks a symlinked ``chk-N``, never follows it.
- The root given to ``CheckpointStorage`` is resolved once (``realpath``): the user chose
  it; below it, no symlink is followed. The low-level functions refuse a symlinked root.
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from typing import Any

from ..errors import CheckpointError, CheckpointErrorReason
from . import spill
from .incremental import load_chain, merge, referenced
from .snapshot_file import TaskSnapshotData, decode_snapshot
from .metadata import Metadata, encode_metadata, parse_metadata
from .safe_io import (METADATA, METADATA_TMP, MAX_METADATA, DIR_RE, chk_name, check_name, unsafe_kind,
                      open_root, open_chk, read_at, verified_blob, read_local, create_exclusive)

_R = CheckpointErrorReason

# ---- the storage ------------------------------------------------------------------------------


class CheckpointStorage:
    def __init__(self, root: str, retain: int = 3):
        if retain < 1:
            raise ValueError("retain must be >= 1")
        self.root = os.path.realpath(root)
        self.shown = self.root  #: how the root appears in messages (a URI without credentials)
        self.retain = retain

    def dir_of(self, checkpoint_id: int) -> str:
        return os.path.join(self.root, chk_name(checkpoint_id))

    def ids_on_disk(self) -> list[int]:
        """Every ``chk-N`` entry (directory or not: anything planted is reported by verify),
        with or without valid metadata, ascending. Other names (``_lock``) are ignored."""
        if not os.path.isdir(self.root):
            return []
        ids = [int(m.group(1)) for n in os.listdir(self.root) if (m := DIR_RE.match(n))]
        return sorted(ids)

    def _has_metadata(self, checkpoint_id: int) -> bool:
        """Something named ``_metadata`` is in a real ``chk-N`` directory (validity is
        checked on load; a planted link or FIFO counts, so that it is reported)."""
        d = self.dir_of(checkpoint_id)
        if unsafe_kind(d) is not None:
            return os.path.islink(d)  # a planted link is a candidate, reported as UNSAFE_PATH
        return os.path.lexists(os.path.join(d, METADATA))

    def completed_ids(self) -> list[int]:
        """Checkpoints whose metadata file is present (validity is checked on load)."""
        return [i for i in self.ids_on_disk() if self._has_metadata(i)]

    # ---- writing ------------------------------------------------------------------------

    def write_metadata(self, meta: Metadata) -> str:
        """Commit a checkpoint: ``_metadata`` written to an exclusive temp file, fsynced,
        renamed into place, the directories fsynced. Refuses unsafe names (UNSAFE_PATH)."""
        cid = meta.checkpoint_id
        for task, e in meta.tasks.items():
            check_name(e.file, f"checkpoint {cid}: state file of task {task}", cid)
        return self._put_metadata(cid, encode_metadata(meta))

    def _put_metadata(self, cid: int, doc: bytes) -> str:
        """Make ``doc`` the checkpoint's ``_metadata``, atomically (the commit point)."""
        d = self.dir_of(cid)
        chk_fd = open_chk(self.root, cid, create=True)
        try:
            try:
                os.unlink(METADATA_TMP, dir_fd=chk_fd)  # a stale temp (or a link: removed, not followed)
            except FileNotFoundError:
                pass
            except IsADirectoryError:
                raise CheckpointError(_R.UNSAFE_PATH, f"{os.path.join(d, METADATA_TMP)} is a directory: remove it",
                                      cid) from None
            create_exclusive(chk_fd, METADATA_TMP, doc, os.path.join(d, METADATA_TMP), cid)
            try:
                os.replace(METADATA_TMP, METADATA, src_dir_fd=chk_fd, dst_dir_fd=chk_fd)
            except IsADirectoryError:
                raise CheckpointError(_R.UNSAFE_PATH, f"{os.path.join(d, METADATA)} is a directory: remove it",
                                      cid) from None
            os.fsync(chk_fd)
        finally:
            os.close(chk_fd)
        root_fd = open_root(self.root)
        try:
            os.fsync(root_fd)  # the chk-N entry itself must survive a power loss
        finally:
            os.close(root_fd)
        return os.path.join(d, METADATA)

    def _remove(self, checkpoint_id: int) -> None:
        """Delete ``chk-N``: a link or file is unlinked (never followed), a directory removed
        with rmtree (which does not follow links inside it)."""
        d = self.dir_of(checkpoint_id)
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(d, ignore_errors=True)
        else:
            try:
                os.unlink(d)
            except OSError:
                pass

    def prune(self, protect: dict[int, set[str]] | None = None) -> list[int]:
        """Keep the newest ``retain`` completed checkpoints; delete older ones and orphans
        (directories without metadata) older than the newest completed one. Files that a
        kept checkpoint's incremental chains reference, or that ``protect`` names
        (checkpoint id -> file names: what running tasks may still build on), survive: a
        directory holding such files only loses its ``_metadata`` and its other files
        (checkpoint/incremental.py). Returns the ids that are no longer checkpoints."""
        completed = self.completed_ids()
        keep = set(completed[-self.retain :])
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
                if self._has_metadata(i) or self._has_unneeded(i, needed[i]):
                    self._retire(i, needed[i])
                    removed.append(i)
                continue
            self._remove(i)
            removed.append(i)
        return removed

    def _has_unneeded(self, checkpoint_id: int, files: set[str]) -> bool:
        try:
            return bool(set(os.listdir(self.dir_of(checkpoint_id))) - files)
        except OSError:
            return False

    def _retire(self, checkpoint_id: int, files: set[str]) -> None:
        """``chk-N`` stops being a checkpoint (its ``_metadata`` goes first) but keeps
        ``files``, which others reference; everything else in it is deleted. A link is
        unlinked, never followed."""
        try:
            chk_fd = open_chk(self.root, checkpoint_id)
        except CheckpointError:
            self._remove(checkpoint_id)  # a planted link or file: nothing of ours is behind it
            return
        try:
            names = os.listdir(chk_fd)
            for name in sorted(names, key=lambda n: n != METADATA):  # _metadata first
                if name in files:
                    continue
                try:
                    os.unlink(name, dir_fd=chk_fd)
                except IsADirectoryError:
                    shutil.rmtree(os.path.join(self.dir_of(checkpoint_id), name), ignore_errors=True)
                except OSError:
                    pass
            os.fsync(chk_fd)
        finally:
            os.close(chk_fd)

    def remove_orphans_after(self, checkpoint_id: int) -> list[int]:
        """At a restart: directories newer than the checkpoint restored from are from the
        failed attempt (incomplete or unusable); delete those without metadata."""
        removed = []
        for i in self.ids_on_disk():
            if i > checkpoint_id and not self._has_metadata(i):
                self._remove(i)
                removed.append(i)
        return removed

    # ---- reading ------------------------------------------------------------------------

    def load_metadata(self, checkpoint_id: int) -> Metadata:
        """The metadata of a checkpoint, read safely (bounded by MAX_METADATA, no link
        followed, a FIFO never waited on) and validated field by field."""
        raw, path = self._read_metadata_raw(checkpoint_id)
        return parse_metadata(raw, checkpoint_id, path)

    def _read_metadata_raw(self, checkpoint_id: int) -> tuple[bytes, str]:
        """The bytes of ``_metadata`` (bounded by MAX_METADATA) and how its path is shown;
        MISSING_METADATA if there is none."""
        path = os.path.join(self.dir_of(checkpoint_id), METADATA)
        try:
            chk_fd = open_chk(self.root, checkpoint_id)
        except CheckpointError as e:
            if e.reason is _R.NOT_FOUND:
                raise CheckpointError(_R.MISSING_METADATA, f"checkpoint {checkpoint_id} has no metadata ({e})",
                                      checkpoint_id) from None
            raise
        try:
            raw = read_at(chk_fd, METADATA, None, MAX_METADATA, f"checkpoint {checkpoint_id}: metadata {path}",
                           checkpoint_id)
        except CheckpointError as e:
            if e.reason is _R.MISSING_FILE:
                raise CheckpointError(_R.MISSING_METADATA, f"checkpoint {checkpoint_id} has no metadata ({path})",
                                      checkpoint_id) from None
            raise
        finally:
            os.close(chk_fd)
        return raw, path

    def _read_blobs(self, checkpoint_id: int, meta: Metadata, tasks: list[str]) -> dict[str, tuple[bytes, str]]:
        """The verified bytes of the given tasks' state files (size and sha256 as in
        ``meta``), each with how its path is shown."""
        d = self.dir_of(checkpoint_id)
        chk_fd = open_chk(self.root, checkpoint_id)
        try:
            out = {}
            for task in tasks:
                e = meta.tasks[task]
                blob = verified_blob(chk_fd, d, task, e.file, e.size, e.sha256, checkpoint_id)
                out[task] = (blob, os.path.join(d, e.file))
            return out
        finally:
            os.close(chk_fd)

    def _read_file(self, checkpoint_id: int, file: str, size: int, sha256: str) -> tuple[bytes, str]:
        """The verified bytes of one state file (of this or an earlier checkpoint: a chain's)."""
        return read_local(self.root, checkpoint_id, file, size, sha256)

    def _snapshots(self, checkpoint_id: int, meta: Metadata, tasks: list[str] | None = None,
                   keep_spilled: bool = True) -> dict[str, TaskSnapshotData]:
        """The tasks' snapshots, every file verified and decoded; ``keep_spilled=False``
        (verification only): spill files are checked one at a time and not kept."""
        tasks = list(meta.tasks) if tasks is None else tasks
        plain = [t for t in tasks if t not in meta.chains]
        blobs = self._read_blobs(checkpoint_id, meta, plain)
        out = {task: spill.attach(decode_snapshot(blob, f"{shown} (task {task})", checkpoint_id), self._read_file,
                                  checkpoint_id, keep_spilled)
               for task, (blob, shown) in blobs.items()}
        for t in tasks:
            if t in meta.chains:
                e = meta.tasks[t]
                out[t] = load_chain(self._read_file, checkpoint_id, (e.file, e.size, e.sha256), meta.chains[t],
                                    keep_spilled)
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
