"""What each task of an attempt is deployed with: its ``Deploy`` message (messages.py).

Every task gets the plan and the user's shipped code, the attempt's fence token, where
checkpoints are written and the job's options for its runtime; a task of an attempt that
restores a checkpoint also gets what it restores (checkpoint/rescale.py, typed by
checkpoint/restore_spec.py: its own file at
the same parallelism, the old subtasks' files rebuilt at another), and whether that
checkpoint is the job's final one (then the task only commits it).
"""

from __future__ import annotations

from .. import messages
from ..checkpoint import restore_spec
from ..checkpoint.metadata import Metadata
from ..checkpoint.rescale import restore_specs
from ..plan import Plan
from .attempt import DeployOf, Silence
from .config import JobConfig


def deployer(plan: Plan, code: bytes, cfg: JobConfig, *, meta: Metadata | None, restore_root: str,
             max_parallelism: int, storage_root: str, token: str, fence_dir: str) -> DeployOf:
    """The Deploy of each task of an attempt that restores ``meta`` (None: starts afresh)
    from ``restore_root``. What each task restores is worked out now: a checkpoint that
    cannot be restored into this plan fails here, before any worker starts."""
    restores = {} if meta is None else {
        t: restore_spec.to_data(s)
        for t, s in restore_specs(plan, meta, restore_root, max_parallelism, cfg.allow_non_restored_state).items()}
    final = meta is not None and meta.final
    # A worker that may be elsewhere gives up on its driver after half the bound the driver
    # holds it to (so it is gone before it is replaced); one on the driver's machine never.
    give_up = Silence.of(cfg.heartbeat_bound(), cfg.task_timeout).seconds if cfg.heartbeat_bound() else 0.0

    def deploy(task: str, peers: dict[str, tuple[str, int]]) -> messages.Deploy:
        return messages.Deploy(
            plan.to_dict(), code, peers, restores.get(task), final, storage_root, token,
            cfg.heartbeat_interval, cfg.task_timeout, cfg.startup_timeout,
            fence_dir=fence_dir, snapshot_encoding=cfg.snapshot_encoding,
            incremental=cfg.incremental_checkpoints and cfg.mode != "none",
            aligned_timeout=cfg.aligned_timeout, unaligned=cfg.mode == "unaligned",
            channel_state_memory=cfg.channel_state_memory, channel_buffer=cfg.channel_buffer or 0,
            loop_memory=cfg.loop_memory, loop_disk=cfg.loop_disk,
            loop_spill_dir=cfg.loop_spill_dir or "", heartbeat_timeout=give_up,
            latency_interval=cfg.latency_interval)

    return deploy
