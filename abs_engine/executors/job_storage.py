"""Where a job keeps its checkpoints, chosen and checked before any worker starts.

No ``checkpoint_dir``: a fresh temporary directory, removed when the job ends. A local
path: a directory of its own, private (0700), on a writable file system
(checkpoint/directory.py); with ``resume=True`` it must exist. A remote URI (``s3://``,
``hdfs://``...): its root is made at once, so an unreachable store or a missing bucket
fails here. Under the job's directory lock (master.py), ``check_resume`` refuses a
directory that holds an earlier run's checkpoints without ``resume``, and ``resume=True``
with nothing to resume from. ``check_spill_dir``: a ``loop_spill_dir`` must be a directory
the job can write. Each refusal is a typed error naming the fix.
"""

from __future__ import annotations

import os
import tempfile

from .. import fs
from ..checkpoint.directory import prepare as prepare_directory
from ..checkpoint.remote import RemoteStorage, open_storage
from ..checkpoint.storage import CheckpointStorage
from ..pipelines import DIR_PREFIX
from ..errors import CheckpointError, CheckpointErrorReason, ConfigError
from .config import JobConfig


def open_job_storage(cfg: JobConfig) -> tuple[CheckpointStorage, str, bool]:
    """The job's checkpoint storage, its location (a local path or a URI), and whether that
    is a temporary directory (the caller removes it when the job ends)."""
    temp = cfg.checkpoint_dir is None
    location = (tempfile.mkdtemp(prefix="abs-engine-ckpt-") if cfg.checkpoint_dir is None
                else cfg.checkpoint_dir if fs.is_remote(cfg.checkpoint_dir) else fs.local_path(cfg.checkpoint_dir))
    if not fs.is_remote(location):
        # Checked before anything is written; with resume=True it must exist.
        location = prepare_directory(location, must_exist=cfg.resume is True and not temp)
    storage = open_storage(location, cfg.retained_checkpoints)
    if isinstance(storage, RemoteStorage):
        storage.make_root()  # an unreachable store or a missing bucket fails here, at once
    return storage, location, temp


def check_resume(storage: CheckpointStorage, cfg: JobConfig) -> None:
    """What the directory holds agrees with ``resume`` (ask under the directory's lock)."""
    if not storage.completed_ids():
        pipelines = pipeline_dirs(storage.root)
        if pipelines:
            raise CheckpointError(
                CheckpointErrorReason.PLAN_MISMATCH,
                f"checkpoint directory {storage.shown} holds the checkpoints of a job run pipeline by pipeline "
                f"({', '.join(pipelines)}), and this run restores the job as one (failover='job', the in-process "
                "executor, or a dataflow of one pipeline): run it as it was run (failover='pipeline' with its "
                "pipelines), or use another directory")
    if storage.completed_ids() and not cfg.resume:
        raise CheckpointError(
            CheckpointErrorReason.DIRECTORY_NOT_EMPTY,
            f"checkpoint directory {storage.shown} already holds checkpoints {storage.completed_ids()} "
            "of an earlier run: pass resume=True (--resume) to continue from them, or use an empty directory",
        )
    if cfg.resume is True and not storage.completed_ids() and cfg.restore_from is None:
        raise CheckpointError(
            CheckpointErrorReason.NOT_FOUND,
            f"resume=True, but checkpoint directory {storage.shown} holds no checkpoint to resume from: "
            "check the path, or pass resume='if-present' to start afresh when there is none",
        )


def any_checkpoints(storage: CheckpointStorage) -> bool:
    """The directory holds a completed checkpoint: the job's, or one of its pipelines'
    (``pipeline-<name>/``, a job run pipeline by pipeline)."""
    if storage.completed_ids():
        return True
    return any(open_storage(fs.join(storage.root, n)).completed_ids() for n in pipeline_dirs(storage.root))


def pipeline_dirs(location: str) -> list[str]:
    """The ``pipeline-<name>`` directories at ``location`` (local or remote): those of a job
    run pipeline by pipeline."""
    try:
        return [n for n in fs.open_dir(location).list() if n.startswith(DIR_PREFIX)]
    except NotADirectoryError:
        return []


def check_spill_dir(cfg: JobConfig, has_loops: bool) -> None:
    """A job with loops spills back-edge input into ``loop_spill_dir``: it must be a
    directory its workers can write (checked for the local executor, whose workers run on
    this machine)."""
    spill = cfg.loop_spill_dir
    if spill is not None and cfg.executor == "local" and has_loops and not (
            os.path.isdir(spill) and os.access(spill, os.W_OK | os.X_OK)):
        raise ConfigError("loop_spill_dir", f"loop_spill_dir {spill!r} is not a directory you can write: "
                                            "create it, or pass None for the system's temporary directory")
