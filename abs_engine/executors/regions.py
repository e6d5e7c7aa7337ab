"""Region failover inside a running attempt: a failed parallel lane restarts alone.

A *region* is a set of tasks joined by channels (pipelines.py): in a pipeline without a
shuffle, each parallel lane (subtask k of every chain, joined by forward edges). Lanes
exchange no record, so when a task of one lane fails, only that lane's tasks are stopped
and started again, restored from the latest completed checkpoint, while the other lanes run
on (Flink's pipelined-region failover). It is consistent: a completed checkpoint holds
every task's state at one cut, the restored lane's part of it is a state that lane was in,
its sources rewind to their offsets in it, and its 2PC sinks roll back to what it
committed; no other lane ever saw a record of it. Checkpoints pending at the failure are
aborted (the failed tasks will never acknowledge them); the next ones cover every task.

When this is used (``regions``): the local executor (a Spark barrier stage fails as a
whole), a plan of several regions, aligned or unaligned checkpoints (stop-the-world counts
every channel of the job), no loops, no incremental checkpoints (a restored task would
build deltas on a checkpoint this coordinator no longer tracks); not while a savepoint is
being taken, after the final checkpoint, or for a failure to restore. Anything else is the
attempt's failure: the master's failover restarts the whole pipeline, as before.

Invariants: a region's old workers have exited (killed and reaped, launcher.stop) before
its new ones start, so no process of the old lane can publish output after the new one
restored (the fence token is the attempt's, unchanged); the restart counts against
``restart_attempts`` and the failure manager's rules (a poison record fails the job) as
any failover does.
"""

from __future__ import annotations

import time
from typing import Callable

from ..checkpoint.coordinator import CheckpointCoordinator
from ..checkpoint.metadata import Metadata
from ..messages import FailureCause
from ..plan import Plan
from ..pipelines import find_pipelines
from .attempt import DeployOf, ProcessAttempt
from .config import JobConfig
from .failures import WorkerFailure


def failover_regions(plan: Plan, cfg: JobConfig) -> dict[str, frozenset[str]] | None:
    """task -> its region, when a region may restart alone (the module docstring); None
    when every failure restarts the attempt."""
    if (cfg.failover != "pipeline" or cfg.executor != "local" or cfg.mode not in ("aligned", "unaligned")
            or cfg.incremental_checkpoints or plan.loops()):
        return None
    regions = [frozenset(r) for p in find_pipelines(plan) for r in p.regions]
    if len(regions) < 2:
        return None
    return {t: r for r in regions for t in r}


class RegionRestarts:
    """What an attempt's driver needs to restart a region: the regions, the newest
    checkpoint to restore (updated as checkpoints complete), how to deploy a task that
    restores it, and the master's verdict on a failure."""

    def __init__(self, regions: dict[str, frozenset[str]], restored: Metadata | None, restored_root: str,
                 redeploy: Callable[[Metadata | None, str], DeployOf],
                 on_failure: Callable[[WorkerFailure, int | None], int], log: Callable[[str], None]):
        self.regions = regions
        self.latest, self.latest_root = restored, restored_root  #: what a restarted region restores
        self.redeploy = redeploy
        #: The master's bookkeeping and verdict (raises JobFailed when the job must fail;
        #: else the failovers so far, the restarted workers' attempt number).
        self.on_failure = on_failure
        self.log = log
        #: Tasks of restarted regions not running yet: (the tasks, since when).
        self.down: dict[str, float] = {}
        self.restarts = 0  #: regions restarted in this attempt

    def completed(self, meta: Metadata, root: str) -> None:
        """Checkpoint ``meta`` completed: a region restarted from now on restores it."""
        if self.latest is None or meta.checkpoint_id > self.latest.checkpoint_id:
            self.latest, self.latest_root = meta, root

    def applies(self, f: WorkerFailure, coord: CheckpointCoordinator, started: bool, final_restore: bool) -> bool:
        """Whether failure ``f`` restarts its region alone (else: the attempt fails)."""
        return (started and not final_restore and f.task in self.regions and f.cause is not FailureCause.RESTORE
                and not coord.stopping and coord.savepoint_id is None and coord.final_completed is None
                and (self.latest is None or not self.latest.final))

    def restart(self, f: WorkerFailure, attempt: ProcessAttempt,
                coord: CheckpointCoordinator) -> tuple[frozenset[str], dict[str, int | None]]:
        """Restart ``f``'s region: the master's verdict first, then pending checkpoints
        aborted, the old workers stopped, new ones deployed from the newest checkpoint.
        Returns the region's tasks (the driver waits for them to run again) and their
        new workers' pids."""
        region = self.regions[f.task]
        restored = self.latest.checkpoint_id if self.latest is not None else None
        number = self.on_failure(f, restored)  # raises when the job must fail instead
        self.restarts += 1
        aborted = coord.restart_tasks(region)
        self.log(f"restarting region {sorted(region)} alone (the other lanes run on) from "
                 f"{f'checkpoint {restored}' if restored is not None else 'the start'} after: {f}"
                 + (f"; aborted pending checkpoint(s) {aborted}" if aborted else ""))
        pids = attempt.restart(sorted(region), self.redeploy(self.latest, self.latest_root), number)
        now = time.monotonic()
        self.down.update({t: now for t in region})
        return region, pids

    def running(self, task: str) -> frozenset[str] | None:
        """``task`` runs again; its region when every task of it does (else None)."""
        if self.down.pop(task, None) is None:
            return None
        region = self.regions[task]
        return None if any(t in self.down for t in region) else region

    def check_startup(self, timeout: float) -> None:
        """A restarted region that does not run within ``timeout``: the attempt's failure."""
        now = time.monotonic()
        late = sorted(t for t, since in self.down.items() if now - since > timeout)
        if late:
            raise WorkerFailure(late[0], None, f"restarted tasks {late} did not restore and start within "
                                               f"startup_timeout={timeout}s")
