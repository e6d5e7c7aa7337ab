"""Savepoints: a completed checkpoint copied where retention never reaches, to restart a
job from later, at any parallelism.

A savepoint is a directory ``<savepoint dir>/savepoint-<job>-<checkpoint id>-<UTC time>``
laid out as a checkpoint directory holding one checkpoint (``chk-N/<task>...state`` and
``chk-N/_metadata``), so it is read with every check storage.py makes. Invariants:
- Self-contained: every state file is copied, not referenced (with an incremental
  checkpoint, every file of its chains too, into ``chk-M`` directories without metadata,
  and every spill file of its channel state: checkpoint/spill.py); each is read back from the
  checkpoint with its size and sha256 verified before it is written, and the metadata
  (carrying the same sizes and sha256s) is written last, so a savepoint without
  ``_metadata`` (a crash mid-copy) does not exist.
- Retention never removes it: it lives outside the checkpoints' ``chk-N`` namespace.
- Restoring from one (``restore_from=PATH``) reads it like any checkpoint: a corrupt or
  truncated file fails verification with a typed CheckpointError, never a fresh start.
"""

from __future__ import annotations

import re
import time

from .. import fs
from ..errors import CheckpointError, CheckpointErrorReason
from .remote import open_storage, write_task_state
from .snapshot_file import decode_snapshot
from .metadata import Metadata
from .storage import CheckpointStorage

PREFIX = "savepoint-"


def savepoint_name(job: str, checkpoint_id: int, now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    safe_job = re.sub(r"[^A-Za-z0-9_.-]", "_", job)[:64] or "job"
    return f"{PREFIX}{safe_job}-{checkpoint_id:06d}-{stamp}"


def write_savepoint(source: CheckpointStorage, meta: Metadata, directory: str) -> str:
    """Copy checkpoint ``meta`` of ``source`` into a new savepoint below ``directory``;
    returns the savepoint's location (a path, or a URI without credentials)."""
    name = savepoint_name(meta.job, meta.checkpoint_id)
    target = fs.join(directory, name)
    if not fs.is_remote(directory):
        fs.LocalDir(directory, private=True).make_root()
    return copy_checkpoint(source, meta, target)


def copy_checkpoint(source: CheckpointStorage, meta: Metadata, target: str) -> str:
    """Copy checkpoint ``meta`` of ``source``, every file verified, into the checkpoint
    directory ``target`` (made if missing), its metadata last; returns how it is shown."""
    if not fs.is_remote(target):
        fs.LocalDir(target, private=True).make_root()
    blobs = source.read_blobs(meta.checkpoint_id, meta, list(meta.tasks))  # verified: size and sha256
    for task, entry in meta.tasks.items():
        write_task_state(target, meta.checkpoint_id, entry.file, blobs[task][0])
        for f, size, sha in decode_snapshot(blobs[task][0], blobs[task][1], meta.checkpoint_id).spilled:
            blob, _ = source.store.read_file(meta.checkpoint_id, f, size, sha)  # its logs' spill files
            write_task_state(target, meta.checkpoint_id, f, blob)
        for ref in meta.chains.get(task, []):  # incremental: the files it builds on come along
            blob, _ = source.store.read_file(ref.checkpoint_id, ref.file, ref.size, ref.sha256)
            write_task_state(target, ref.checkpoint_id, ref.file, blob)
    dest = open_storage(target)
    dest.write_metadata(meta)  # last: the savepoint exists from here on
    return dest.shown


def load_savepoint(location: str, fingerprint: str, shape: str,
                   any_shape: bool = False) -> tuple[CheckpointStorage, Metadata]:
    """The savepoint at ``location``, verified (every file), and its storage: a
    CheckpointError (NOT_FOUND, CHECKSUM_MISMATCH, ...) if it is not a usable savepoint of
    this dataflow (PLAN_MISMATCH for another dataflow unless ``any_shape``: then operators
    are restored by name; another parallelism is rescaled)."""
    storage = open_storage(location)
    meta, skipped = storage.latest_valid(fingerprint, shape=shape, any_shape=any_shape)
    if meta is None:
        if skipped:
            raise skipped[0]
        from ..pipelines import DIR_PREFIX

        if any(n.startswith(DIR_PREFIX) for n in fs.open_dir(location).list()):
            raise CheckpointError(
                CheckpointErrorReason.PLAN_MISMATCH,
                f"{storage.shown} is a savepoint of a job run pipeline by pipeline (failover='pipeline'), and "
                "this run restores the job as one (failover='job', the in-process executor, or a dataflow of "
                "one pipeline): restore it as it was run, or name a savepoint taken with failover='job'")
        raise CheckpointError(CheckpointErrorReason.NOT_FOUND,
                              f"no savepoint at {storage.shown}: restore_from must name a savepoint directory "
                              f"(a '{PREFIX}...' directory that abs-engine wrote)")
    return storage, meta
