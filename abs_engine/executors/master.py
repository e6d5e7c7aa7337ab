"""The job master: drives a job whatever starts its workers (a launcher: local processes,
the default, or Spark barrier tasks), runs the checkpoint coordinator, and recovers from
failures.

Recovery (global failover): when any worker fails (an exception, or SIGKILL at any
moment) every worker of the attempt is killed; the newest checkpoint that passes
verification is chosen (a corrupt one is reported and skipped); new workers restore from
it, sources rewind to their offsets, and the job goes on, under a fixed-delay restart
strategy. When attempts run out the job fails with the user's traceback.

Trust and fencing: the driver holds an exclusive lock on the checkpoint directory for the
life of the job; each attempt gets a fresh secret (sent to its workers on stdin) that every
connection must prove before it is read, and a fresh fence token that every sink checks
before it changes the output. With ``tls`` on, each attempt also gets fresh TLS material
(tls.py), sent the same way, and every connection is mutual TLS before that proof. So a stranger cannot talk to the job, and no process of an
older attempt (or of a dead driver) can change the output or the checkpoints.

Failures are classified: a failure that repeats on the same record (or the same stuck
operator) after a restart fails the job at once (a poison record: retrying cannot help);
errors that no retry can fix are fatal at once; others are retried by the restart strategy.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Iterator

from .. import auth, codeship, fs, messages
from ..tls import Material
from ..checkpoint import fence
from ..checkpoint.coordinator import CheckpointCoordinator
from ..checkpoint.directory import prepare as prepare_directory
from ..checkpoint.pending import AckOutcome
from ..checkpoint.lock import DirectoryLock
from ..checkpoint.remote import RemoteStorage, control_dir, open_storage
from ..checkpoint.rescale import restore_specs
from ..checkpoint.savepoint import load_savepoint, write_savepoint
from ..checkpoint.metadata import Metadata
from ..checkpoint.storage import CheckpointStorage
from ..errors import (AbsEngineError, CheckpointError, CheckpointErrorReason, ConfigError, JobFailed, JobInterrupted)
from ..graph import LogicalGraph
from ..plan import Plan
from ..monitor.model import CheckpointStatus
from ..monitor.store import StatsWriter
from ..monitor.tracker import JobState, JobTracker
from .config import JobConfig, JobResult
from .job_control import ControlServer
from .attempt import Attempt, ProcessAttempt
from .failover import Decision, FailureManager
from .lifecycle import Lifecycle, Phase
from .failures import WorkerFailure
from .launcher import Launcher
from .requests import SavepointRequests

if TYPE_CHECKING:
    from ..api import Dataflow


class JobCancelled(Exception):
    """``stop_when`` asked to stop: the workers are killed; run() returns the result."""


class JobMaster:
    def __init__(self, graph: LogicalGraph, plan: Plan, config: JobConfig, launcher: Launcher | None):
        self.graph = graph
        self.launcher = launcher
        self.plan = plan
        self.config = config
        self.code = b""  # shipped after the driver hooks ran (they may set addresses)
        self.fingerprint = plan.fingerprint()
        self.shape = plan.shape()  #: a checkpoint of this shape restores at any parallelism
        self.layout = plan.layout()
        self.max_parallelism = int(self.layout.get("max_parallelism", 128))
        self.result = JobResult(job=plan.job)
        self.source_tasks = [t.id for t in plan.tasks if plan.chain(t.chain).is_source]
        #: Records each source task read in the current attempt (from its restored offset on).
        self.source_progress: dict[str, int] = {}
        self.records_before = 0  #: records the sources read in earlier attempts of this run
        self.job_id = ""  #: a fresh run's own id, or adopted from the checkpoints it resumes
        self.run_nonce = secrets.token_hex(8)  #: this driver process's run, in fence tokens
        self.control_dir = ""  #: where the lock and the output fence live (see remote.control_dir)
        self.stop_requested = False  #: a signal asked for stop-with-savepoint
        self.savepoint_requested = False  #: a signal asked for a savepoint (and to go on)
        #: Savepoints asked for by ``abs-engine savepoint`` (job_control.py), answered when taken.
        self.requests = SavepointRequests()
        self.generation = 0  #: the attempt running now
        self.storage: CheckpointStorage | None = None  #: the job's checkpoint storage, while it runs
        #: What the dashboard, the metrics and the stored statistics show (monitor/).
        self.tracker = JobTracker(plan, config.mode, config.checkpoint_interval if config.mode != "none" else None)
        self.stats_writer: StatsWriter | None = None
        self.highest_id = 0  #: the highest checkpoint id triggered in this run
        #: Restart or fail, after each failed attempt (executors/failover.py).
        self.failover = FailureManager(config.restart_attempts)
        #: Where the job is in its life (executors/lifecycle.py).
        self.lifecycle = Lifecycle()
        self.consecutive_expired = 0

    # ---- the job --------------------------------------------------------------------------

    def run(self) -> JobResult:
        templates = [n.template for n in self.graph.nodes.values()]
        for t in templates:
            t.check()
        started = []
        try:
            for t in templates:
                t.driver_start()
                started.append(t)
            self.code = codeship.ship(self.graph)
            with self._stop_on_signals(), self._dashboard():
                return self._run()
        finally:
            for t in started:
                t.driver_stop()

    @contextlib.contextmanager
    def _dashboard(self) -> Iterator[None]:
        """Serve the live dashboard and metrics while the job runs (``dashboard=PORT``)."""
        if self.config.dashboard is None:
            yield
            return
        from ..monitor.dashboard import Dashboard

        with Dashboard(self.tracker, self.config.dashboard_host, self.config.dashboard,
                       token=self.config.dashboard_token) as board:
            self.result.dashboard_url = board.url
            print(f"[{self.plan.job}] dashboard: {board.url}", file=sys.stderr, flush=True)
            yield

    @contextlib.contextmanager
    def _stop_on_signals(self) -> Iterator[None]:
        """While the job runs, SIGTERM or Ctrl-C asks for a savepoint and a clean stop (its
        sinks committed); a second one stops at once (KeyboardInterrupt). SIGUSR2 asks for
        a savepoint and goes on (``abs-engine savepoint``)."""
        if not self.config.stop_with_savepoint_on_signal or threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(signum: int, frame: Any) -> None:
            if self.stop_requested:
                raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: stopping without a savepoint")
            self.stop_requested = True
            self._log(f"{signal.Signals(signum).name}: taking a savepoint, then stopping "
                      "(send it again to stop at once)")

        def on_savepoint(signum: int, frame: Any) -> None:
            self.savepoint_requested = True

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        previous[signal.SIGUSR2] = signal.signal(signal.SIGUSR2, on_savepoint)
        try:
            yield
        finally:
            for s, h in previous.items():
                signal.signal(s, h)

    def _run(self) -> JobResult:
        cfg = self.config
        temp = cfg.checkpoint_dir is None
        location = (tempfile.mkdtemp(prefix="abs-engine-ckpt-") if cfg.checkpoint_dir is None
                    else cfg.checkpoint_dir if fs.is_remote(cfg.checkpoint_dir) else fs.local_path(cfg.checkpoint_dir))
        if not fs.is_remote(location):
            # A directory of its own, private (0700), on a writable file system: checked before
            # anything is written (checkpoint/directory.py); with resume=True it must exist.
            location = prepare_directory(location, must_exist=cfg.resume is True and not temp)
        spill = cfg.loop_spill_dir
        if spill is not None and cfg.executor == "local" and self.plan.loops() and not (
                os.path.isdir(spill) and os.access(spill, os.W_OK | os.X_OK)):
            raise ConfigError("loop_spill_dir", f"loop_spill_dir {spill!r} is not a directory you can write: "
                                                "create it, or pass None for the system's temporary directory")
        storage = open_storage(location, cfg.retained_checkpoints)
        self.storage = storage
        if isinstance(storage, RemoteStorage):
            storage.make_root()  # an unreachable store or a missing bucket fails here, at once
        self.control_dir = control_dir(location)
        self.result.checkpoint_dir = storage.shown
        # Held for the life of the job: a second job, or a second --resume, is refused.
        lock = DirectoryLock(self.control_dir, self.plan.job)
        lock.acquire()
        try:
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
            self.started = time.monotonic()
            if not temp:
                self.stats_writer = StatsWriter(location)
            state = JobState.FAILED
            try:
                with ControlServer(self.control_dir, self.requests.submit):
                    self._attempts(storage)
                state = JobState.CANCELED if self.result.cancelled else JobState.FINISHED
            except KeyboardInterrupt as e:  # the workers were stopped on the way out (_attempt)
                state = JobState.CANCELED
                raise self._interrupted(e, None if temp else storage.shown) from None
            finally:
                self.lifecycle.to(Phase(state.value))  # FINISHED, FAILED or CANCELED: the job has ended
                self.result.phases = [p.value for p in self.lifecycle.history]
                self.requests.close(f"the job ended ({state.value.lower()}) before the savepoint was taken")
                self._ended(state)
            self.result.duration_s = time.monotonic() - self.started
            return self.result
        finally:
            lock.release()
            if temp:
                shutil.rmtree(location, ignore_errors=True)

    def _ended(self, state: JobState) -> None:
        """The job is over: pending checkpoints aborted, the statistics stored a last time."""
        for stat in self.tracker.abort_pending(f"the job ended ({state.value.lower()})"):
            self.result.add_checkpoint(stat)
        self.tracker.set_source_records(self.count_source_records())
        self.tracker.finished(state)
        if self.stats_writer is not None:
            self.stats_writer.write(self.tracker, force=True)
            self.stats_writer.close()

    def _interrupted(self, e: KeyboardInterrupt, kept: str | None) -> JobInterrupted:
        why = str(e) or "interrupted"
        if kept is None:
            how = ("its checkpoints were in a temporary directory, now removed: run it with checkpoint_dir=DIR "
                   "(--checkpoint-dir DIR) to be able to resume after an interruption")
        else:
            how = (f"its checkpoints are in {kept}: resume with run(resume=True, checkpoint_dir={kept!r}) "
                   f"(--resume --checkpoint-dir {kept})")
        return JobInterrupted(f"job {self.plan.job!r} stopped at once ({why}), without a savepoint; every worker "
                              f"was stopped; {how}", kept)

    def _attempts(self, storage: CheckpointStorage) -> None:
        """Run attempts under the restart strategy until one succeeds or it gives up."""
        cfg = self.config
        # Workers of every attempt connect here (the in-process executor has none).
        listener = socket.create_server((cfg.host, 0), backlog=512) if cfg.executor != "inprocess" else None
        attempt = 0
        try:
            while True:
                meta, skipped = storage.latest_valid(self.fingerprint, job_id=self.job_id or None, shape=self.shape,
                                                     unusable=self.failover.unusable, any_shape=cfg.allow_non_restored_state,
                                                     operators={o.name for o in self.plan.operators})
                if not self.job_id:
                    self.job_id = (meta.job_id if meta is not None and meta.job_id else uuid.uuid4().hex[:16])
                    self.result.job_id = self.tracker.job_id = self.job_id
                for err in skipped:
                    msg = f"skipping checkpoint {err.checkpoint_id}: {err}"
                    self.result.skipped_checkpoints.append(msg)
                    self._log(msg)
                storage.remove_orphans_after(meta.checkpoint_id if meta else 0)
                restore_root = storage.root
                if meta is None and cfg.restore_from:
                    # Nothing of this job's own yet: start from the savepoint (verified, every file).
                    sp_storage, meta = load_savepoint(cfg.restore_from, self.fingerprint, self.shape,
                                                      cfg.allow_non_restored_state)
                    restore_root = sp_storage.root
                    if not self.job_id:
                        self.job_id = meta.job_id or uuid.uuid4().hex[:16]
                        self.result.job_id = self.tracker.job_id = self.job_id
                if meta is not None:
                    self.result.restored_from.append(meta.checkpoint_id)
                self.lifecycle.to(Phase.SCHEDULING)
                self.tracker.attempt_started(attempt, meta.checkpoint_id if meta is not None else None,
                                             savepoint=restore_root != storage.root)
                self.result.recoveries = list(self.tracker.recoveries)
                # Above the restored id too: sinks hold epochs by checkpoint id (a savepoint's may be higher).
                # ... and above every id this run triggered: an id names one checkpoint in the
                # statistics (one aborted by the failover is not reused after it).
                next_id = max([*storage.ids_on_disk(), meta.checkpoint_id if meta else 0, self.highest_id]) + 1
                try:
                    self._attempt(attempt, listener, storage, meta, next_id, restore_root)
                    return
                except JobCancelled:
                    self.result.cancelled = True
                    self._log("cancelled by stop_when")
                    return
                except WorkerFailure as f:
                    self.result.failures.append(str(f))
                    for stat in self.tracker.abort_pending(f"job failover: {f.public}", at=f.time):
                        self.result.add_checkpoint(stat)
                    if f.operator is None:
                        self.result.workers_lost += 1  # died (a signal, a crash) or went silent
                    verdict = self.failover.on_failure(f, attempt, meta.checkpoint_id if meta is not None else None)
                    if verdict.decision is Decision.RESTART:
                        self.lifecycle.to(Phase.RECOVERING)
                    if verdict.decision is Decision.FAIL:
                        raise JobFailed(f"job {self.plan.job!r} {verdict.why}: {f}", f.operator, f.traceback) from None
                    attempt += 1
                    self.result.restarts += 1
                    self.tracker.failed_over(f.task, f.public, attempt, at=f.time)
                    if self.stats_writer is not None:
                        self.stats_writer.write(self.tracker, force=True)
                    self._log(f"restarting (attempt {attempt} of {cfg.restart_attempts}) after: {f}")
                    if cfg.restart_delay:
                        time.sleep(cfg.restart_delay)  # the restart strategy's delay, not synchronisation
        finally:
            if listener is not None:
                listener.close()

    def _log(self, msg: str) -> None:
        if self.config.progress:
            print(f"[{self.plan.job}] {msg}", file=sys.stderr, flush=True)

    # ---- one attempt ------------------------------------------------------------------------

    def _attempt(self, gen: int, listener: socket.socket | None, storage: CheckpointStorage,
                 meta: Metadata | None, next_id: int, restore_root: str) -> None:
        cfg = self.config
        self.generation = gen
        # A new attempt's sources count from zero again: what earlier attempts read is kept,
        # so the run's count only grows (records re-read after a restore count again: work).
        self.count_source_records()  # the previous attempt's last count
        self.records_before += sum(self.source_progress.values())
        self.source_progress = {}
        self.result.attempt_source_records.append(0)
        secret = auth.new_secret()  # this attempt's: workers of older attempts do not know it
        material = Material.generate() if cfg.tls else None  # this attempt's too
        self.consecutive_expired = 0
        token = f"{self.job_id}/{self.run_nonce}/{gen}"
        # What each task restores (same plan: its own file; another parallelism: rescaled).
        restores = {} if meta is None else restore_specs(self.plan, meta, restore_root, self.max_parallelism,
                                                         cfg.allow_non_restored_state)
        if meta is not None and meta.layout.get("shape") != self.shape:
            old, new = set(meta.layout.get("operators", {})), {o.name for o in self.plan.operators}
            self._log(f"restoring checkpoint {meta.checkpoint_id} into a changed dataflow (allow_non_restored_state): "
                      f"state dropped for {sorted(old - new) or 'none'}, starting empty: {sorted(new - old) or 'none'}")
        elif meta is not None and meta.fingerprint != self.fingerprint:
            self._log(f"restoring checkpoint {meta.checkpoint_id} at the job's new parallelism (rescaling)")
        killed = fence.advance(self.control_dir, token)
        if killed:
            self._log(f"killed stale worker(s) {killed} that held the output fence (from a dead attempt)")

        def deploy(task: str, peers: dict[str, tuple[str, int]]) -> messages.Deploy:
            return messages.Deploy(
                self.plan.to_dict(), self.code, peers, restores.get(task),
                bool(meta is not None and meta.final), storage.root, token,
                cfg.heartbeat_interval, cfg.task_timeout, cfg.startup_timeout,
                fence_dir=self.control_dir, snapshot_encoding=cfg.snapshot_encoding,
                incremental=cfg.incremental_checkpoints and cfg.mode != "none",
                aligned_timeout=cfg.aligned_timeout, unaligned=cfg.mode == "unaligned",
                channel_state_memory=cfg.channel_state_memory, channel_buffer=cfg.channel_buffer or 0,
                loop_memory=cfg.loop_memory, loop_disk=cfg.loop_disk,
                loop_spill_dir=cfg.loop_spill_dir or "")

        attempt = self._new_attempt(gen, listener, secret, material, fence.worker_identity(self.control_dir, token))
        try:
            try:
                pids = attempt.start(deploy)
            except AbsEngineError as err:
                if gen == 0:
                    raise  # the cluster cannot run this job at all (too few slots): say so at once
                raise WorkerFailure("*", None, f"could not start the workers again: {err}") from None
            self.tracker.workers_connected(pids)
            if meta is not None:
                self.lifecycle.to(Phase.RESTORING)
            self._drive(attempt, storage, meta, next_id)
        finally:
            attempt.close()

    def _new_attempt(self, gen: int, listener: socket.socket | None, secret: bytes, material: Material | None,
                     env: dict[str, str]) -> Attempt:
        tasks = [t.id for t in self.plan.tasks]
        if self.config.executor == "inprocess":
            from .inprocess import InProcessAttempt

            return InProcessAttempt(tasks, gen)
        assert self.launcher is not None and listener is not None
        attempt = ProcessAttempt(tasks, self.launcher, listener, gen, secret, material, env,
                                 self.config.startup_timeout, lambda: None, self._log)
        attempt.on_wait = lambda: self._chaos(attempt)
        return attempt

    def _chaos(self, attempt: Attempt) -> None:
        chaos = self.config.chaos
        if chaos is None:
            return
        victim = chaos.poll(time.monotonic() - self.started, attempt.live_pids())
        if victim is not None:
            self.result.kills += 1
            self._log(f"chaos: SIGKILL {victim}")

    def _chaos_on_checkpoint(self, checkpoint_id: int, attempt: Attempt) -> None:
        """Chaos that kills on checkpoint events (``chaos.on_checkpoint(id, pids)``): a kill
        after a completed checkpoint is sure to be followed by a restore from one."""
        hook = getattr(self.config.chaos, "on_checkpoint", None)
        if hook is None:
            return
        victim = hook(checkpoint_id, attempt.live_pids())
        if victim is not None:
            self.result.kills += 1
            self._log(f"chaos: SIGKILL {victim} after checkpoint {checkpoint_id}")

    def _drive(self, attempt: Attempt, storage: CheckpointStorage, meta: Metadata | None, next_id: int) -> None:
        cfg = self.config
        attempt_tasks = [t.id for t in self.plan.tasks]
        final_restore = meta is not None and meta.final
        coord = CheckpointCoordinator(
            self.plan.job, self.fingerprint, list(attempt_tasks), self.source_tasks, storage,
            cfg.checkpoint_interval if cfg.mode != "none" else None,
            cfg.checkpoint_timeout, cfg.max_concurrent_checkpoints, next_id,
            loops=self.plan.loops(),
            stop_the_world=cfg.mode == "stop-the-world",
            unaligned=cfg.mode == "unaligned",
            aligned_timeout=cfg.aligned_timeout,
            channels=frozenset(c.id for t in self.plan.tasks for c in t.inputs),
            job_id=self.job_id,
            layout=self.layout,
        )
        self.running: set[str] = set()
        next_progress = time.monotonic() + 1.0
        running_deadline = time.monotonic() + cfg.startup_timeout  # restore included
        started = False
        try:
            while attempt.committed != set(attempt_tasks):
                self._chaos(attempt)
                now = time.monotonic()
                deadline = coord.deadline() if started else None
                timeout = 0.1 if deadline is None else max(0.0, min(0.1, deadline - now))
                for task, msg in attempt.receive(timeout):
                    try:
                        self._on_message(task, msg, coord, attempt)
                    except (TypeError, ValueError, KeyError, AttributeError) as e:
                        # well typed (decode checks that) but naming what does not exist: that worker's fault
                        raise WorkerFailure(task, None, f"sent a malformed message ({type(e).__name__}: {e})") \
                            from None
                now = time.monotonic()
                if not started:
                    if self.running == set(attempt_tasks):
                        started = True
                        self.result.running_after_s = time.monotonic() - self.started
                        self.tracker.all_running()
                        self.lifecycle.to(Phase.RUNNING)
                        self.result.recoveries = list(self.tracker.recoveries)
                        coord.start()
                    elif now > running_deadline:
                        late = sorted(set(attempt_tasks) - self.running)
                        raise WorkerFailure(late[0], None, f"tasks {late} did not restore and start within "
                                                           f"startup_timeout={cfg.startup_timeout}s")
                if started and not final_restore:
                    for stop in self.requests.take(self.generation):
                        if stop and not self.stop_requested:
                            self.stop_requested = True
                            self._log("abs-engine savepoint --stop: taking a savepoint, then stopping")
                        elif not stop:
                            self.savepoint_requested = True
                    if self.stop_requested and not coord.stopping:
                        self.lifecycle.to(Phase.STOPPING)
                        coord.request_savepoint(stop=True)
                    if self.savepoint_requested:
                        self.savepoint_requested = False
                        coord.request_savepoint(stop=False)
                    for task, m in coord.poll():
                        attempt.send(task, m)
                    self._track_triggers(coord)
                    self._on_expired(coord)
                attempt.check(now, cfg.task_timeout)
                if cfg.stop_when is not None and cfg.stop_when(self.result):
                    raise JobCancelled()
                if time.monotonic() >= next_progress:
                    next_progress = time.monotonic() + 1.0
                    self.tracker.set_source_records(self.count_source_records())
                    if cfg.progress:
                        self._print_progress(coord)
                self.tracker.tick(time.monotonic())
                if self.stats_writer is not None:
                    self.stats_writer.write(self.tracker)
        finally:
            # Every id this attempt triggered, sent or not: the next attempt starts above them.
            self.highest_id = max(self.highest_id, coord.next_id - 1)
        if cfg.progress:
            self._print_progress(coord)
        if self.result.stopped_with_savepoint:  # every task committed it and waits: now they may go
            for task in attempt_tasks:
                with contextlib.suppress(WorkerFailure):  # one that is gone already has committed
                    attempt.send(task, messages.Shutdown())
        attempt.finish()

    def _savepoint(self, coord: CheckpointCoordinator, meta: Metadata) -> None:
        """Checkpoint ``meta`` is the savepoint asked for: copy it out of retention's reach.
        When stopping, its notifications then end every task after it commits (coordinator)."""
        cfg = self.config
        where = cfg.savepoint_dir or (os.path.join(fs.local_path(cfg.checkpoint_dir), "savepoints")
                                      if cfg.checkpoint_dir and not fs.is_remote(cfg.checkpoint_dir)
                                      else os.path.abspath("savepoints"))
        assert self.storage is not None
        self.result.savepoint = write_savepoint(self.storage, meta, where)
        self._log(f"savepoint of checkpoint {meta.checkpoint_id}: {self.result.savepoint}")
        self.requests.taken(self.result.savepoint)
        if coord.stopping:
            self.result.stopped_with_savepoint = True
        else:
            coord.savepoint_id = None  # the next request takes a new one

    def _track_triggers(self, coord: CheckpointCoordinator) -> None:
        """Tell the tracker of checkpoints the coordinator has just triggered."""
        for cid in coord.pending:
            if cid not in self.tracker.pending and cid in coord.triggered_at:
                self.tracker.triggered(cid, coord.modes.get(cid, "aligned"), coord.triggered_at[cid], len(coord.tasks))

    def _on_expired(self, coord: CheckpointCoordinator) -> None:
        """Report expired checkpoints with the tasks they waited for; fail over after too
        many in a row (tolerable_failed_checkpoints)."""
        tolerable = self.config.tolerable_failed_checkpoints
        for cid, missing in coord.expired:
            self.result.checkpoints_expired += 1
            self.consecutive_expired += 1
            shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
            why = (f"expired after checkpoint_timeout={self.config.checkpoint_timeout:g}s; "
                   f"not acknowledged by: {shown}")
            self._log(f"checkpoint {cid} {why}")
            if (stat := self.tracker.ended(cid, CheckpointStatus.FAILED, why)) is not None:
                self.result.add_checkpoint(stat)
            if tolerable is not None and self.consecutive_expired > tolerable:
                coord.expired.clear()
                raise WorkerFailure(missing[0] if missing else "*", None,
                                    f"{self.consecutive_expired} checkpoints in a row expired (more than "
                                    f"tolerable_failed_checkpoints={tolerable}); the last, {cid}, was not "
                                    f"acknowledged by {shown}")
        coord.expired.clear()

    def _on_message(self, task: str, msg: messages.Message, coord: CheckpointCoordinator, attempt: Attempt) -> None:
        if isinstance(msg, messages.Running):
            self.running.add(task)
            self.tracker.task_running(msg.task)
        elif isinstance(msg, messages.Progress):
            self.source_progress[msg.task] = msg.records_in
        elif isinstance(msg, messages.Ack):
            outcome, meta = coord.on_ack(msg)
            if outcome is AckOutcome.SUCCESS:  # (a duplicate does not replace the first)
                self.tracker.acknowledged(msg, time.time())
            if meta is not None:
                self.consecutive_expired = 0
                ended = self.tracker.completed(meta, coord.mode_of(meta.checkpoint_id))
                for stat in ended:
                    self.result.add_checkpoint(stat)  # it, and those it subsumed
                if meta.checkpoint_id == coord.savepoint_id or (meta.final and coord.savepoint_requested):
                    self._savepoint(coord, meta)  # (the job's final checkpoint came first: it is the savepoint)
                for task, m in coord.notifications(meta):
                    attempt.send(task, m)
                self._chaos_on_checkpoint(meta.checkpoint_id, attempt)
                if coord.just_drained:
                    self._log(f"checkpoint {meta.checkpoint_id} proves loop(s) {coord.just_drained} drained: "
                              "ending them")
                    for task, m in coord.end_loop_messages(coord.just_drained):
                        attempt.send(task, m)
        elif isinstance(msg, messages.Finished):
            self.tracker.task_finished(msg.task, msg.records_in, msg.records_out)
            if msg.task in self.source_tasks:
                self.source_progress[msg.task] = msg.records_in
            for task, m in coord.on_finished(msg.task):
                attempt.send(task, m)
        elif isinstance(msg, messages.Counts):
            for task, m in coord.on_counts(msg):
                attempt.send(task, m)
        elif isinstance(msg, messages.InputsEnded):
            for task, m in coord.on_inputs_ended(msg.task):
                attempt.send(task, m)
        elif isinstance(msg, messages.Committed):
            pass  # the attempt counts it (attempt.committed)
        elif isinstance(msg, messages.Heartbeat):
            if msg.records_in is not None and msg.records_out is not None:  # (last_heard: every frame)
                self.tracker.task_metrics(msg.task, msg.records_in, msg.records_out, msg.send_s, time.monotonic())
        elif isinstance(msg, messages.Skipped):
            self.result.skipped_records += 1
            if self.result.skipped_records <= 100:
                self._log(f"operator {msg.operator!r} skipped a record (on_error='skip'): {msg.error}; "
                          f"record: {msg.record}")
            elif self.result.skipped_records == 101:
                self._log("more records skipped; not shown (result.skipped_records counts them)")
        elif isinstance(msg, messages.Failed):
            if msg.collateral:
                attempt.root_cause(exclude=msg.task, suspect=msg.peer)
            raise WorkerFailure.of(msg)

    def _print_progress(self, coord: CheckpointCoordinator) -> None:
        elapsed = time.monotonic() - self.started
        recs = self.count_source_records()
        done = coord.stats.completed
        last = f", last #{done[-1].checkpoint_id} took {done[-1].duration_ms:.0f} ms" if done else ""
        print(
            f"[{self.plan.job}] {elapsed:6.1f}s  source records {recs:,}  "
            f"checkpoints {self.result.checkpoints_completed}{last}  restarts {self.result.restarts}",
            file=sys.stderr, flush=True,
        )

    def count_source_records(self) -> int:
        """Records the sources read in this run so far, every attempt's (JobResult.source_records)."""
        this = sum(self.source_progress.values())
        if self.result.attempt_source_records:
            self.result.attempt_source_records[-1] = this
        self.result.source_records = self.records_before + this
        return self.result.source_records


def run_job(flow: "Dataflow", config: JobConfig) -> JobResult:
    """Compile ``flow`` and run it on the executor ``config.executor`` names."""
    plan = flow.compile()
    # Spark sources read through Spark jobs of their own while the job runs.
    reserve = sum(n.template.spark_slots for n in flow.graph.nodes.values())
    launcher = make_launcher(config, reserve)
    try:
        master = JobMaster(flow.graph, plan, config, launcher)
        res = master.run()
    finally:
        if launcher is not None:
            launcher.close()
    master.count_source_records()
    return res


def make_launcher(config: JobConfig, reserve_slots: int = 0) -> Launcher | None:
    """Who starts the workers (None: the in-process executor has none)."""
    if config.executor == "inprocess":
        return None
    if config.executor == "local":
        from .local import LocalLauncher

        return LocalLauncher(config.host)
    if config.executor == "spark":
        from .spark import SparkLauncher

        return SparkLauncher(config.spark, reserve_slots)
    raise ValueError(f"unknown executor {config.executor!r}")


__all__ = ["JobMaster", "run_job", "JobConfig", "JobResult", "WorkerFailure"]
