"""The savepoint of a job of several pipelines (executors/pipelined.py): a directory,
``<savepoints>/savepoint-<job>-pipelines-<UTC time>``, holding per pipeline a
``pipeline-<name>`` directory of that pipeline's savepoints (each an ordinary savepoint,
checkpoint/savepoint.py: verified, self-contained).

Invariants: ``restore_from`` that directory restores each pipeline from its own newest
savepoint there (the highest checkpoint id with its metadata: a pipeline's ids only grow,
and a copy cut short does not exist). A pipeline that had finished before the savepoint
gets its final checkpoint copied in before the set is handed out, and again when the job
ends (``complete_set``, idempotent), so that restoring it commits and writes nothing again;
a pipeline that has none is refused by name (or starts empty with
``allow_non_restored_state``, as a new operator does). A pipeline whose savepoint is such a
final checkpoint of its own shape is not run again (``finished_in``: at any parallelism,
since it has nothing left to read or commit), and that checkpoint becomes its own
(``adopt_final``), so a resume of that run or its next savepoint finds it finished too. A
savepoint of a job run as one pipeline is refused with the fix.
"""

from __future__ import annotations

import os
import re
import time
from typing import TYPE_CHECKING, Callable, Sequence

from .. import fs
from ..checkpoint.remote import open_storage
from ..checkpoint.savepoint import PREFIX, copy_checkpoint, write_savepoint
from ..errors import CheckpointError, CheckpointErrorReason
from ..lifecycle import Phase
from ..pipelines import Pipeline
from .config import JobConfig

if TYPE_CHECKING:
    from .master import JobMaster

#: ``savepoint-<job>-<checkpoint id>-<time>``: a pipeline's savepoints, newest by id then time.
_NAME = re.compile(r"^" + PREFIX + r".*-(\d{6,})-(\d{8}T\d{6}Z)$")


def set_location(cfg: JobConfig, location: str, job: str) -> str:
    """Where this run's savepoints go: as a one-pipeline job's (``savepoint_dir``, else
    ``checkpoint_dir/savepoints``, else ``./savepoints``), one directory per run."""
    where = cfg.savepoint_dir or (os.path.join(fs.local_path(cfg.checkpoint_dir), "savepoints")
                                  if cfg.checkpoint_dir and not fs.is_remote(cfg.checkpoint_dir)
                                  else os.path.abspath("savepoints"))
    safe_job = re.sub(r"[^A-Za-z0-9_.-]", "_", job)[:64] or "job"
    return fs.join(where, f"{PREFIX}{safe_job}-pipelines-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")


def pipeline_savepoint(restore_from: str | None, p: Pipeline, any_shape: bool) -> str | None:
    """The savepoint pipeline ``p`` restores from when the job restores from the job's
    savepoint ``restore_from`` (None: none to restore; it starts empty)."""
    if restore_from is None:
        return None
    top = fs.open_dir(restore_from)
    names = top.list()
    if any(n.startswith("chk-") for n in names):
        raise CheckpointError(
            CheckpointErrorReason.PLAN_MISMATCH,
            f"{fs.redact(restore_from)} is a savepoint of this job run as one pipeline (failover='job'), and this "
            "dataflow runs its pipelines apart: restore from it with failover='job', or from a savepoint "
            "taken with failover='pipeline' (a 'savepoint-<job>-pipelines-...' directory)")
    found = sorted(((int(m.group(1)), m.group(2), n) for n in top.list(p.directory) if (m := _NAME.match(n))))
    for _, _, name in reversed(found):
        # (one without metadata was cut short: it does not exist, savepoint.py; an older one does)
        if open_storage(fs.join(restore_from, p.directory, name)).completed_ids():
            return fs.join(restore_from, p.directory, name)
    if any_shape:
        return None
    raise CheckpointError(
        CheckpointErrorReason.NOT_FOUND,
        f"savepoint {fs.redact(restore_from)} has no savepoint of pipeline {p.name!r} (no "
        f"{p.directory}/{PREFIX}... directory in it): name a savepoint directory this job wrote "
        "('savepoint-<job>-pipelines-...'), or pass allow_non_restored_state=True to start that pipeline empty")


def complete_set(location: str, pipelines: Sequence[Pipeline], masters: Sequence["JobMaster"],
                 log: Callable[[str], None]) -> None:
    """A pipeline that had finished and whose final checkpoint is not in the set at
    ``location`` yet (it may hold an older savepoint of it): that final checkpoint copied
    in, so the set restores every pipeline, a finished one as finished. Idempotent."""
    for p, m in zip(pipelines, masters):
        # (FINISHED: every task committed its final checkpoint, so restoring it has nothing to commit)
        if m.config.checkpoint_dir is None or m.lifecycle.phase is not Phase.FINISHED:
            continue
        storage = open_storage(m.config.checkpoint_dir)
        meta, _ = storage.latest_valid(m.fingerprint, shape=m.shape)
        if meta is None or not meta.final:
            continue
        have = {int(x.group(1)) for n in fs.open_dir(location).list(p.directory) if (x := _NAME.match(n))}
        if meta.checkpoint_id not in have:
            at = write_savepoint(storage, meta, fs.join(location, p.directory))
            log(f"savepoint: pipeline {p.name!r} had finished; its final checkpoint {meta.checkpoint_id}: {at}")


def adopt_final(savepoint: str, checkpoint_dir: str) -> None:
    """A pipeline not run because ``savepoint`` is its final checkpoint (``finished_in``):
    that checkpoint copied into the pipeline's own ``checkpoint_dir`` (unless it holds one
    already), so that a resume of this run, and its savepoints, find it finished too,
    instead of running it again from nothing."""
    own = open_storage(checkpoint_dir)
    if own.completed_ids():
        return
    source = open_storage(savepoint)
    meta, _ = source.latest_valid()
    if meta is not None and meta.final:
        copy_checkpoint(source, meta, checkpoint_dir)


def finished_in(savepoint: str | None, shape: str) -> int | None:
    """The checkpoint id if ``savepoint`` (a pipeline's, from ``pipeline_savepoint``) is the
    final checkpoint of a pipeline that had finished and committed it (``complete_set``)
    and of this pipeline's ``shape``: there is nothing to run or commit, at any
    parallelism. None otherwise (a changed pipeline is restored as any savepoint is: refused,
    or with ``allow_non_restored_state`` restored by operator)."""
    if savepoint is None:
        return None
    meta, _ = open_storage(savepoint).latest_valid()
    if meta is None or not meta.final or meta.layout.get("shape") != shape:
        return None
    return meta.checkpoint_id
