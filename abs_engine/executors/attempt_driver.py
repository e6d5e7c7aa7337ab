"""Driving one running attempt: the driver's event loop between the attempt's tasks and its
checkpoint coordinator, from the tasks' start until every task has committed.

The job master (master.py) starts an attempt and a fresh coordinator for it, then hands
both to an ``AttemptDriver`` with the job's collaborators that outlive the attempt (the
tracker, the result, the savepoints asked for, the lifecycle, ...). The driver receives
the tasks' messages and routes the coordinator's share of them (checkpoint/routing.py: the
same routing the simulation runs), polls the coordinator and sends what it answers,
starts it once every task runs, writes the savepoints asked for, reports expired
checkpoints, and keeps the statistics and the progress line current.

Invariants: a failure of the attempt (a task's, a timeout, too many expired checkpoints in
a row, a malformed message) leaves ``run`` as a ``WorkerFailure`` for the master's restart
strategy; ``stop_when`` leaves it as ``JobCancelled``. Checkpoints are triggered only once
every task runs, and savepoints are asked for only then and never of an attempt that only
commits the job's final checkpoint. A savepoint is written before the tasks are told its
checkpoint completed.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Callable

from .. import fs, messages
from ..checkpoint.coordinator import CheckpointCoordinator
from ..checkpoint.metadata import Metadata
from ..checkpoint.pending import AckOutcome
from ..checkpoint.routing import route
from ..checkpoint.savepoint import write_savepoint
from ..monitor.model import CheckpointStatus
from ..monitor.store import StatsWriter
from ..monitor.tracker import JobTracker
from .attempt import Attempt, ProcessAttempt, Silence
from .chaos import Chaos
from .config import JobConfig, JobResult
from .failures import WorkerFailure
from ..lifecycle import Lifecycle, Phase
from .regions import RegionRestarts
from .requests import SavepointRequests
from .signals import Signals
from .source_records import SourceRecords


class JobCancelled(Exception):
    """``stop_when`` or the dashboard's cancel asked to stop (the first argument says which):
    the workers are killed; run() returns the result."""


class AttemptDriver:
    def __init__(self, attempt: Attempt, coord: CheckpointCoordinator, *, config: JobConfig, generation: int,
                 final_restore: bool, started: float, tracker: JobTracker, result: JobResult, lifecycle: Lifecycle,
                 requests: SavepointRequests, signals: Signals, sources: SourceRecords, chaos: Chaos,
                 stats_writer: StatsWriter | None, log: Callable[[str], None], regions: RegionRestarts | None = None):
        self.attempt = attempt
        self.coord = coord
        self.config = config
        self.generation = generation  #: this attempt's number (SavepointRequests.take)
        self.final_restore = final_restore  #: it restored the job's final checkpoint: it only commits it
        self.started = started  #: when the job started (time.monotonic())
        self.tracker = tracker
        self.result = result
        self.lifecycle = lifecycle
        self.requests = requests
        self.signals = signals
        self.sources = sources
        self.chaos = chaos
        self.stats_writer = stats_writer
        self.log = log
        self.running: set[str] = set()  #: tasks that reported Running
        self.consecutive_expired = 0  #: checkpoints expired since the last completion
        #: Region failover (regions.py): a failed lane restarts alone; None: the attempt fails.
        self.regions = regions
        self.coordinating = False  #: every task ran: the coordinator started
        #: Messages of a batch not handled yet when one of them raised a failure.
        self.carried: list[tuple[str, messages.Message]] = []

    def run(self) -> None:
        """Drive the attempt until every task has committed, then let the tasks go."""
        cfg, coord, attempt = self.config, self.coord, self.attempt
        self.next_progress = time.monotonic() + 1.0
        self.running_deadline = time.monotonic() + cfg.startup_timeout  # restore included
        while attempt.committed != coord.tasks:
            try:
                self._step()
            except WorkerFailure as f:
                if self.regions is None or not self.regions.applies(f, coord, self.coordinating, self.final_restore):
                    raise
                self._restart_region(f)
        if cfg.progress:
            self._print_progress()
        if self.result.stopped_with_savepoint:  # every task committed it and waits: now they may go
            for task in sorted(coord.tasks):
                with contextlib.suppress(WorkerFailure):  # one that is gone already has committed
                    attempt.send(task, messages.Shutdown())
        attempt.finish()

    def _step(self) -> None:
        """One turn of the loop: messages, start, triggers, liveness, progress."""
        cfg, coord, attempt = self.config, self.coord, self.attempt
        self.chaos.poll(attempt)
        now = time.monotonic()
        # (while a region restarts the coordinator is not polled: its deadline, maybe
        # already past, must not turn this loop into a busy wait)
        down = self.regions is not None and bool(self.regions.down)
        deadline = coord.deadline() if self.coordinating and not down else None
        timeout = 0.1 if deadline is None else max(0.0, min(0.1, deadline - now))
        batch, self.carried = self.carried or attempt.receive(timeout), []
        for i, (task, msg) in enumerate(batch):
            try:
                if isinstance(msg, messages.Failed) and msg.collateral:
                    self._reported_root(msg, batch[i + 1:])
                self.on_message(task, msg)
            except (TypeError, ValueError, KeyError, AttributeError) as e:
                # well typed (decode checks that) but naming what does not exist: that worker's fault
                self.carried = batch[i + 1:]
                raise WorkerFailure(task, None, f"sent a malformed message ({type(e).__name__}: {e})") from None
            except WorkerFailure:
                self.carried = batch[i + 1:]
                raise
        now = time.monotonic()
        if not self.coordinating:
            if self.running == coord.tasks:
                self.coordinating = True
                self._all_running()
            elif now > self.running_deadline:
                late = sorted(coord.tasks - self.running)
                raise WorkerFailure(late[0], None, f"tasks {late} did not restore and start within "
                                                   f"startup_timeout={cfg.startup_timeout}s")
        restarting = self.regions is not None and bool(self.regions.down)
        if restarting:
            assert self.regions is not None
            self.regions.check_startup(cfg.startup_timeout)
        if self.coordinating and not self.final_restore and not restarting:  # (no trigger reaches a region restarting)
            self._take_requests()
            for task, m in coord.poll():
                attempt.send(task, m)
            self._track_triggers()
            self._on_expired()
        attempt.check(now, Silence.of(cfg.heartbeat_bound(), cfg.task_timeout))
        if (cfg.stop_when is not None and cfg.stop_when(self.result)) or self.requests.cancelled:
            raise JobCancelled(self.requests.cancelled or "stop_when")
        if time.monotonic() >= self.next_progress:
            self.next_progress = time.monotonic() + 1.0
            self.tracker.set_source_records(self.sources.count())
            self.result.latency = self.tracker.latency_summary()
            if cfg.progress:
                self._print_progress()
        self.tracker.tick(time.monotonic())
        if self.stats_writer is not None:
            self.stats_writer.write(self.tracker)

    def _reported_root(self, msg: messages.Failed, later: list[tuple[str, messages.Message]]) -> None:
        """A task failed for a peer's sake (``msg``, collateral): if that peer's own Failed
        was read already (later in this batch, or held over from before a region restart),
        that is the failure (its record's digest: the poison-record rule), not its exit
        status, which is all ``root_cause`` could find on its connection."""
        held = later + (self.attempt.backlog if isinstance(self.attempt, ProcessAttempt) else [])
        regions = self.regions.regions if self.regions is not None else None

        def suspect(t: str) -> bool:  # (as root_cause's: the peer it names, else one it may have lost)
            if msg.peer is not None:
                return t == msg.peer
            return regions is None or regions.get(t) == regions.get(msg.task)

        for t, m in held:
            if isinstance(m, messages.Failed) and not m.collateral and suspect(t):
                raise WorkerFailure.of(m)

    def _restart_region(self, f: WorkerFailure) -> None:
        """``f``'s region restarts alone (regions.py); the other tasks run on."""
        assert self.regions is not None and isinstance(self.attempt, ProcessAttempt)
        self.tracker.abort_pending(f"region failover: {f.public}", at=f.time)
        region, pids = self.regions.restart(f, self.attempt, self.coord)
        self.running -= region
        self.consecutive_expired = 0  # (the aborted checkpoints are not expiries)
        self.carried = [(t, m) for t, m in self.carried if t not in region]  # the old workers' last words
        self.sources.restarted(region)  # (what the old workers read stays counted)
        self.tracker.region_restarting(sorted(region), self.regions.latest.checkpoint_id
                                       if self.regions.latest is not None else None)
        self.tracker.workers_connected(pids)

    def _all_running(self) -> None:
        """Every task restored and runs: the job is RUNNING, the coordinator starts."""
        self.result.running_after_s = time.monotonic() - self.started
        self.tracker.all_running()
        self.lifecycle.to(Phase.RUNNING)
        self.result.recoveries = list(self.tracker.recoveries)
        self.coord.start()

    def _take_requests(self) -> None:
        """Ask the coordinator for the savepoints asked for (signals, ``abs-engine savepoint``)."""
        signals, coord = self.signals, self.coord
        for stop in self.requests.take(self.generation):
            if stop and not signals.stop_requested:
                signals.stop_requested = True
                self.log("abs-engine savepoint --stop: taking a savepoint, then stopping")
            elif not stop:
                signals.savepoint_requested = True
        if signals.stop_requested and not coord.stopping:
            self.lifecycle.to(Phase.STOPPING)
            coord.request_savepoint(stop=True)
        if signals.savepoint_requested:
            signals.savepoint_requested = False
            coord.request_savepoint(stop=False)

    def on_message(self, task: str, msg: messages.Message) -> None:
        """One message of task ``task``: the coordinator's share routed (checkpoint/routing.py),
        the rest (statistics, the result, failures) handled here."""
        if isinstance(msg, messages.Finished):
            self.tracker.task_finished(msg.task, msg.records_in, msg.records_out,
                                       (msg.left, msg.total, msg.unit, msg.position), msg.late)
            if msg.task in self.coord.source_tasks:
                self.sources.report(msg.task, msg.records_in)
        routed = route(self.coord, msg)
        if routed is not None:
            if isinstance(msg, messages.Ack) and routed.outcome is AckOutcome.SUCCESS:
                self.tracker.acknowledged(msg, time.time())  # (a duplicate does not replace the first)
            if (meta := routed.completed) is not None:
                self._completed(meta)
            for to, m in routed.out:
                self.attempt.send(to, m)
            if meta is not None:
                self.chaos.on_checkpoint(meta.checkpoint_id, self.attempt)
                if routed.drained:
                    self.log(f"checkpoint {meta.checkpoint_id} proves loop(s) {routed.drained} drained: ending them")
        elif isinstance(msg, messages.Running):
            self.running.add(task)
            self.tracker.task_running(msg.task)
            if self.regions is not None and self.regions.down and (up := self.regions.running(task)):
                self.tracker.region_running(up)  # a restarted region runs again
                self.result.recoveries = list(self.tracker.recoveries)
        elif isinstance(msg, messages.Progress):
            self.sources.report(msg.task, msg.records_in)
        elif isinstance(msg, messages.Committed):
            pass  # the attempt counts it (attempt.committed)
        elif isinstance(msg, messages.Heartbeat):
            if msg.records_in is not None and msg.records_out is not None:  # (last_heard: every frame)
                self.tracker.task_metrics(msg.task, msg.records_in, msg.records_out, msg.send_s, time.monotonic())
                self.tracker.task_health(msg)
        elif isinstance(msg, messages.Latency):
            self.tracker.latency_reported(msg.ms)
        elif isinstance(msg, messages.Skipped):
            self.result.skipped_records += 1
            self.tracker.record_skipped(msg.task, msg.operator)
            if self.result.skipped_records <= 100:
                self.log(f"operator {msg.operator!r} skipped a record (on_error='skip'): {msg.error}; "
                         f"record: {msg.record}")
            elif self.result.skipped_records == 101:
                self.log("more records skipped; not shown (result.skipped_records counts them)")
        elif isinstance(msg, messages.Failed):
            if msg.collateral:
                self.attempt.root_cause(exclude=msg.task, suspect=msg.peer)
            raise WorkerFailure.of(msg)

    def _completed(self, meta: Metadata) -> None:
        """Checkpoint ``meta`` completed: in the statistics and the result; the savepoint
        written if it is the one asked for (before its notifications are sent)."""
        coord = self.coord
        self.consecutive_expired = 0
        self.tracker.completed(meta, coord.mode_of(meta.checkpoint_id))  # it, and those it subsumed
        if self.regions is not None:
            self.regions.completed(meta, coord.storage.root)
        if meta.checkpoint_id == coord.savepoint_id or (meta.final and coord.savepoint_requested):
            self._savepoint(meta)  # (the job's final checkpoint came first: it is the savepoint)

    def _savepoint(self, meta: Metadata) -> None:
        """Checkpoint ``meta`` is the savepoint asked for: copy it out of retention's reach.
        When stopping, its notifications then end every task after it commits (coordinator)."""
        cfg, coord = self.config, self.coord
        where = cfg.savepoint_dir or (os.path.join(fs.local_path(cfg.checkpoint_dir), "savepoints")
                                      if cfg.checkpoint_dir and not fs.is_remote(cfg.checkpoint_dir)
                                      else os.path.abspath("savepoints"))
        self.result.savepoint = write_savepoint(coord.storage, meta, where)
        self.log(f"savepoint of checkpoint {meta.checkpoint_id}: {self.result.savepoint}")
        self.requests.taken(self.result.savepoint)
        if coord.stopping:
            self.result.stopped_with_savepoint = True
        else:
            coord.savepoint_id = None  # the next request takes a new one

    def _track_triggers(self) -> None:
        """Tell the tracker of checkpoints the coordinator has just triggered."""
        coord = self.coord
        for cid in coord.pending:
            if cid not in self.tracker.pending and cid in coord.triggered_at:
                self.tracker.triggered(cid, coord.modes.get(cid, "aligned"), coord.triggered_at[cid], len(coord.tasks))

    def _on_expired(self) -> None:
        """Report expired checkpoints with the tasks they waited for; fail over after too
        many in a row (tolerable_failed_checkpoints)."""
        coord, tolerable = self.coord, self.config.tolerable_failed_checkpoints
        for cid, missing in coord.expired:
            self.consecutive_expired += 1
            shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
            why = (f"expired after checkpoint_timeout={self.config.checkpoint_timeout:g}s; "
                   f"not acknowledged by: {shown}")
            self.log(f"checkpoint {cid} {why}")
            self.tracker.ended(cid, CheckpointStatus.FAILED, why)
            if tolerable is not None and self.consecutive_expired > tolerable:
                coord.expired.clear()
                raise WorkerFailure(missing[0] if missing else "*", None,
                                    f"{self.consecutive_expired} checkpoints in a row expired (more than "
                                    f"tolerable_failed_checkpoints={tolerable}); the last, {cid}, was not "
                                    f"acknowledged by {shown}")
        coord.expired.clear()

    def _print_progress(self) -> None:
        elapsed = time.monotonic() - self.started
        done = self.result.checkpoints
        last = f", last #{done[-1].checkpoint_id} took {done[-1].duration_ms:.0f} ms" if done else ""
        self.log(f"{elapsed:6.1f}s  source records {self.sources.count():,}  "
                 f"checkpoints {self.result.checkpoints_completed}{last}  restarts {self.result.restarts}")
