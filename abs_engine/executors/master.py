"""The job master: runs a job whatever starts its workers (a launcher: local processes,
the default, or Spark barrier tasks; none in process), through its attempts, and recovers
from failures. Here is the job's life across attempts: its checkpoint directory and lock,
the checkpoint each attempt restores, the attempt's secret, fence and workers, the restart
strategy, the lifecycle, the end of the job. Each running attempt is driven against a
fresh checkpoint coordinator by an ``AttemptDriver`` (attempt_driver.py).

Recovery: a failed parallel lane of a pipeline without a shuffle restarts alone, inside
the attempt (regions.py). Otherwise (a failover of the job, or of one pipeline: a job of
several runs each under a master of its own, pipelined.py) when any worker fails (an
exception, or SIGKILL at any moment) every worker of the attempt is killed; the newest checkpoint that passes
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
import secrets
import shutil
import socket
import sys
import time
import uuid
from typing import Iterator

from .. import auth, codeship
from ..wire import server_socket
from ..tls import Material
from ..checkpoint import fence
from ..checkpoint.coordinator import CheckpointCoordinator
from ..checkpoint.lock import DirectoryLock
from ..checkpoint.remote import control_dir
from ..checkpoint.savepoint import load_savepoint
from ..checkpoint.metadata import Metadata
from ..checkpoint.storage import CheckpointStorage
from ..errors import AbsEngineError, JobFailed, JobInterrupted
from ..graph import LogicalGraph
from ..plan import Plan
from ..runtime.fork_server import PRELOAD_ENV
from ..monitor.store import StatsWriter
from ..monitor.tracker import JobTracker
from .config import JobConfig, JobResult
from .job_control import ControlServer
from .serve_dashboard import serve_dashboard
from .attempt import Attempt, ProcessAttempt
from .attempt_driver import AttemptDriver, JobCancelled
from .chaos import Chaos
from .deploy import deployer
from .failover import Decision, FailureManager
from .regions import RegionRestarts, failover_regions
from .job_storage import check_resume, check_spill_dir, open_job_storage
from ..lifecycle import ENDED, Lifecycle, Phase
from .failures import WorkerFailure
from .launcher import Launcher
from .requests import SavepointRequests
from .signals import Signals
from .source_records import SourceRecords



@contextlib.contextmanager
def shipped(graph: LogicalGraph) -> Iterator[bytes]:
    """The job's code, shipped (codeship.py) once its operators are checked and their driver
    hooks started (a Spark source's server, ...); the hooks stop when the job ends, those
    started whatever happens."""
    templates = [n.template for n in graph.nodes.values()]
    for t in templates:
        t.check()
    started = []
    try:
        for t in templates:
            t.driver_start()
            started.append(t)
        yield codeship.ship(graph)
    finally:
        for t in started:
            t.driver_stop()


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
        #: What messages call it: the job, or one pipeline of it (executors/pipelined.py).
        self.what = f"job {plan.job!r}"
        self.log_prefix = plan.job  #: the progress lines' prefix
        self.source_tasks = [t.id for t in plan.tasks if plan.chain(t.chain).is_source]
        #: Records the sources read in this run, over every attempt (source_records.py).
        self.sources = SourceRecords(self.result)
        #: A fresh run's own id (one started from a savepoint too), or adopted from the checkpoints it resumes.
        self.job_id = ""
        self.run_nonce = secrets.token_hex(8)  #: this driver process's run, in fence tokens
        self.control_dir = ""  #: where the lock and the output fence live (see remote.control_dir)
        #: What signals asked for: a savepoint and a stop, or a savepoint (signals.py).
        self.signals = Signals(self._log)
        #: Savepoints asked for by ``abs-engine savepoint`` (job_control.py), answered when taken.
        self.requests = SavepointRequests()
        #: What the dashboard, the metrics and the stored statistics show (monitor/); its
        #: checkpoint history is the result's (kept once).
        self.tracker = JobTracker(plan, config.mode, config.checkpoint_interval if config.mode != "none" else None,
                                  history=self.result.history)
        self.stats_writer: StatsWriter | None = None
        self.highest_id = 0  #: the highest checkpoint id triggered in this run
        #: Restart or fail, after each failed attempt (executors/failover.py).
        self.failover = FailureManager(config.restart_attempts)
        #: Where the job is in its life (abs_engine/lifecycle.py).
        self.lifecycle = Lifecycle(self.tracker.phase_changed)  # the dashboard's job state is the lifecycle's

    # ---- the job --------------------------------------------------------------------------

    def run(self) -> JobResult:
        with shipped(self.graph) as self.code, self.signals.handled(self.config.stop_with_savepoint_on_signal):
            return self.run_shipped()

    def run_shipped(self) -> JobResult:
        """Run the job once its code is shipped and its driver hooks ran (``run``; a
        pipeline's master is called here by the job's, executors/pipelined.py)."""
        with self._dashboard():
            return self._run()

    @contextlib.contextmanager
    def _dashboard(self) -> Iterator[None]:
        """Serve the live dashboard and metrics while the job runs (``dashboard=PORT``)."""
        with serve_dashboard(self.tracker, self.config, self.requests, self.log_prefix) as url:
            self.result.dashboard_url = url
            yield

    def _run(self) -> JobResult:
        cfg = self.config
        check_spill_dir(cfg, bool(self.plan.loops()))
        storage, location, temp = open_job_storage(cfg)  # (job_storage.py)
        self.control_dir = control_dir(location)
        self.result.checkpoint_dir = storage.shown
        # Held for the life of the job: a second job, or a second --resume, is refused.
        lock = DirectoryLock(self.control_dir, self.plan.job)
        lock.acquire()
        try:
            check_resume(storage, cfg)
            self.started = time.monotonic()
            self.chaos = Chaos(cfg.chaos, self.started, self.result, self._log)  # (chaos.py) its times count from here
            if not temp:
                self.stats_writer = StatsWriter(location)
            state = Phase.FAILED
            try:
                with ControlServer(self.control_dir, self.requests.submit):
                    self._attempts(storage)
                state = Phase.CANCELED if self.result.cancelled else Phase.FINISHED
            except KeyboardInterrupt as e:  # the workers were stopped on the way out (_attempt)
                state = Phase.CANCELED
                raise self._interrupted(e, None if temp else storage.shown) from None
            finally:
                assert state in ENDED
                self.lifecycle.to(state)  # FINISHED, FAILED or CANCELED: the job has ended
                self.result.phases = [p.value for p in self.lifecycle.history]
                self.requests.close(f"the job ended ({state.value.lower()}) before the savepoint was taken")
                self._ended(state)
            self.result.duration_s = time.monotonic() - self.started
            return self.result
        finally:
            lock.release()
            if temp:
                shutil.rmtree(location, ignore_errors=True)

    def _ended(self, state: Phase) -> None:
        """The job is over: pending checkpoints aborted, the statistics stored a last time."""
        self.tracker.abort_pending(f"the job ended ({state.value.lower()})")
        self.tracker.set_source_records(self.sources.count())
        self.result.latency = self.tracker.latency_summary()
        self.result.tasks = self.tracker.task_stats()
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
        return JobInterrupted(f"{self.what} stopped at once ({why}), without a savepoint; every worker "
                              f"was stopped; {how}", kept)

    def _attempts(self, storage: CheckpointStorage) -> None:
        """Run attempts under the restart strategy until one succeeds or it gives up."""
        cfg = self.config
        # Workers of every attempt connect here (the in-process executor has none).
        # (On the launcher's host: a Spark cluster's executors reach the driver there.)
        host = self.launcher.host if self.launcher is not None else cfg.host
        listener = server_socket(host, backlog=512) if cfg.executor != "inprocess" else None
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
                    restore_root = sp_storage.root  # (a run from a savepoint is a new job: its own id, as Flink's)
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
                except JobCancelled as c:
                    self.result.cancelled = True
                    self._log(f"cancelled by {c.args[0] if c.args else 'stop_when'}")
                    return
                except WorkerFailure as f:
                    self.result.failures.append(str(f))
                    self.tracker.abort_pending(f"job failover: {f.public}", at=f.time)
                    if f.operator is None:
                        self.result.workers_lost += 1  # died (a signal, a crash) or went silent
                    verdict = self.failover.on_failure(f, self.result.restarts,
                                                       meta.checkpoint_id if meta is not None else None)
                    if verdict.decision is Decision.RESTART:
                        self.lifecycle.to(Phase.RECOVERING)
                    if verdict.decision is Decision.FAIL:
                        raise JobFailed(f"{self.what} {verdict.why}: {f}", f.operator, f.traceback) from None
                    # (an attempt's number counts every failover before it: regions' too, regions.py)
                    attempt = self.result.restarts + 1
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
            print(f"[{self.log_prefix}] {msg}", file=sys.stderr, flush=True)

    # ---- one attempt ------------------------------------------------------------------------

    def _attempt(self, gen: int, listener: socket.socket | None, storage: CheckpointStorage,
                 meta: Metadata | None, next_id: int, restore_root: str) -> None:
        cfg = self.config
        self.sources.new_attempt()
        secret = auth.new_secret()  # this attempt's: workers of older attempts do not know it
        material = Material.generate() if cfg.tls else None  # this attempt's too
        token = f"{self.job_id}/{self.run_nonce}/{gen}"
        # What each task restores (same plan: its own file; another parallelism: rescaled).
        deploy = deployer(self.plan, self.code, cfg, meta=meta, restore_root=restore_root,
                          max_parallelism=self.max_parallelism, storage_root=storage.root, token=token,
                          fence_dir=self.control_dir)
        if meta is not None and meta.layout.get("shape") != self.shape:
            old, new = set(meta.layout.get("operators", {})), {o.name for o in self.plan.operators}
            self._log(f"restoring checkpoint {meta.checkpoint_id} into a changed dataflow (allow_non_restored_state): "
                      f"state dropped for {sorted(old - new) or 'none'}, starting empty: {sorted(new - old) or 'none'}")
        elif meta is not None and meta.fingerprint != self.fingerprint:
            self._log(f"restoring checkpoint {meta.checkpoint_id} at the job's new parallelism (rescaling)")
        killed = fence.advance(self.control_dir, token)
        if killed:
            self._log(f"killed stale worker(s) {killed} that held the output fence (from a dead attempt)")
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
            coord = self._coordinator(storage, next_id)
            regions = failover_regions(self.plan, cfg) if isinstance(attempt, ProcessAttempt) else None
            restarts = None if regions is None else RegionRestarts(
                regions, meta, restore_root,
                lambda m, root: deployer(self.plan, self.code, cfg, meta=m, restore_root=root,
                                         max_parallelism=self.max_parallelism, storage_root=storage.root,
                                         token=token, fence_dir=self.control_dir),
                lambda f, restored: self._region_failed(f, gen, restored), self._log)
            try:
                AttemptDriver(attempt, coord, config=cfg, generation=gen, final_restore=meta is not None and meta.final,
                              started=self.started, tracker=self.tracker, result=self.result,
                              lifecycle=self.lifecycle, requests=self.requests, signals=self.signals,
                              sources=self.sources, chaos=self.chaos, stats_writer=self.stats_writer,
                              log=self._log, regions=restarts).run()
            finally:
                # Every id this attempt triggered, sent or not: the next attempt starts above them.
                self.highest_id = max(self.highest_id, coord.next_id - 1)
        finally:
            attempt.close()

    def _region_failed(self, f: WorkerFailure, gen: int, restored: int | None) -> int:
        """A region of attempt ``gen`` failed (regions.py): counted as any failover, and
        JobFailed when the failure manager says retrying cannot help; else it restarts alone."""
        self.result.failures.append(str(f))
        if f.operator is None:
            self.result.workers_lost += 1
        verdict = self.failover.on_failure(f, self.result.restarts, restored)
        if verdict.decision is Decision.FAIL:
            raise JobFailed(f"{self.what} {verdict.why}: {f}", f.operator, f.traceback) from None
        self.result.restarts += 1
        if restored is not None:
            self.result.restored_from.append(restored)
        self.tracker.failed_over(f.task, f.public, gen, at=f.time)  # (the same attempt runs on)
        return self.result.restarts

    def _coordinator(self, storage: CheckpointStorage, next_id: int) -> CheckpointCoordinator:
        """A fresh coordinator for an attempt, its first checkpoint ``next_id``."""
        cfg, plan = self.config, self.plan
        return CheckpointCoordinator(
            plan.job, self.fingerprint, [t.id for t in plan.tasks], self.source_tasks, storage,
            cfg.checkpoint_interval if cfg.mode != "none" else None,
            cfg.checkpoint_timeout, cfg.max_concurrent_checkpoints, next_id,
            loops=plan.loops(),
            stop_the_world=cfg.mode == "stop-the-world",
            unaligned=cfg.mode == "unaligned",
            aligned_timeout=cfg.aligned_timeout,
            channels=frozenset(c.id for t in plan.tasks for c in t.inputs),
            job_id=self.job_id,
            layout=self.layout,
        )

    def _new_attempt(self, gen: int, listener: socket.socket | None, secret: bytes, material: Material | None,
                     env: dict[str, str]) -> Attempt:
        tasks = [t.id for t in self.plan.tasks]
        if self.config.executor == "inprocess":
            from .inprocess import InProcessAttempt

            return InProcessAttempt(tasks, gen)
        assert self.launcher is not None and listener is not None
        preload = sorted({m for n in self.graph.nodes.values() for m in getattr(n.template, "preload", ())})
        if preload:  # imported once by the fork server, not by every worker
            env = {**env, PRELOAD_ENV: ",".join(preload)}
        attempt = ProcessAttempt(tasks, self.launcher, listener, gen, secret, material, env,
                                 self.config.startup_timeout, lambda: None, self._log)
        attempt.on_wait = lambda: self.chaos.poll(attempt)
        return attempt


__all__ = ["JobMaster", "JobConfig", "JobResult", "WorkerFailure"]
