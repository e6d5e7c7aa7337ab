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
import selectors
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

from .. import auth, codec, codeship, fs, messages
from ..tls import Material
from ..wire import Wire
from ..checkpoint import fence
from ..checkpoint.coordinator import CheckpointCoordinator
from ..checkpoint.directory import prepare as prepare_directory
from ..checkpoint.pending import AckOutcome
from ..checkpoint.lock import DirectoryLock
from ..checkpoint.remote import RemoteStorage, control_dir, open_storage
from ..checkpoint.rescale import restore_specs
from ..checkpoint.savepoint import load_savepoint, write_savepoint
from ..checkpoint.storage import CheckpointStorage, Metadata
from ..errors import (AbsEngineError, CheckpointError, CheckpointErrorReason, ConfigError, JobFailed, JobInterrupted,
                      ProtocolError, ProtocolErrorReason)
from ..graph import LogicalGraph
from ..plan import Plan
from ..monitor.model import CheckpointStatus
from ..monitor.store import StatsWriter
from ..monitor.tracker import JobState, JobTracker
from .config import JobConfig, JobResult
from .job_control import ControlServer
from .launcher import Launcher, WorkerProcess
from .requests import SavepointRequests

if TYPE_CHECKING:
    from ..api import Dataflow


class JobCancelled(Exception):
    """``stop_when`` asked to stop: the workers are killed; run() returns the result."""


def _error_line(traceback: str | None) -> str:
    """The exception line of a traceback ("ValueError: bad input"), shortened."""
    lines = [ln for ln in (traceback or "").strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    last = lines[-1].strip()
    return last if len(last) <= 300 else last[:300] + "..."


def _error_type(traceback: str | None) -> str:
    """The exception's type from its line ("ValueError" of "ValueError: bad input"), or ""."""
    head = _error_line(traceback).split(":", 1)[0].strip()
    return head if head.replace(".", "").replace("_", "").isalnum() else ""


class WorkerFailure(Exception):
    """Why an attempt failed: the task, the operator, what happened and (when an operator
    failed on a record) the record and its digest.

    ``str()`` is the whole story, for the driver's log and the JobFailed the user gets;
    ``public`` leaves out what may hold the job's data (the record, the exception's
    message): it is what the dashboard, the metrics and the stored statistics show, which
    people other than the job's owner may see."""

    def __init__(self, task: str, operator: str | None, detail: str, traceback: str | None = None,
                 fatal: bool = False, record: str = "", digest: str = "", error_type: str = ""):
        text = f"task {task}" + (f", operator {operator!r}" if operator else "") + f": {detail}"
        self.public = text
        error = _error_line(traceback)
        if error and detail == "raised an exception":
            text += f": {error}"
            kind = error_type or _error_type(traceback)
            self.public += f": {kind}" if kind else ""
        if record:
            text += f"; record: {record}"
        if self.public != text:
            self.public += " (the message and the record are in the driver's log)"
        super().__init__(text)
        self.task = task
        self.operator = operator
        self.traceback = traceback
        self.fatal = fatal
        self.time = time.time()  #: when it was seen (recovery statistics: before the teardown)
        self.record = record
        self.digest = digest


@dataclass
class Worker:
    task: str
    proc: WorkerProcess
    sock: socket.socket | None = None
    wire: Wire | None = None
    reader: codec.FrameReader = field(default_factory=lambda: codec.FrameReader(codec.MAX_CONTROL_FRAME))
    running: bool = False
    committed: bool = False
    last_heard: float = field(default_factory=time.monotonic)
    hello_pid: int | None = None  #: the pid the worker announced (it may run elsewhere)


class JobMaster:
    def __init__(self, graph: LogicalGraph, plan: Plan, config: JobConfig, launcher: Launcher):
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
        #: (operator, record digest) of failures seen: the same again after a restart is a poison record.
        self.failed_records: set[tuple[str | None, str]] = set()
        self.consecutive_expired = 0
        #: Checkpoints a worker failed to read back (changed after the driver verified them):
        #: the next attempt falls back to an older one instead of retrying the same.
        self.unusable: dict[int, str] = {}

    # ---- the job --------------------------------------------------------------------------

    def run(self) -> JobResult:
        templates = [n.template for n in self.graph.nodes.values()]
        for t in templates:
            check = getattr(t, "check", None)
            if check is not None:
                check()
        started = []
        try:
            for t in templates:
                start = getattr(t, "driver_start", None)
                if start is not None:
                    start()
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
        listener = socket.create_server((cfg.host, 0), backlog=512)
        attempt = 0
        try:
            while True:
                meta, skipped = storage.latest_valid(self.fingerprint, job_id=self.job_id or None, shape=self.shape,
                                                     unusable=self.unusable, any_shape=cfg.allow_non_restored_state,
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
                    if f.operator == "<restore>" and meta is not None:
                        self.unusable[meta.checkpoint_id] = _error_line(f.traceback) or str(f)
                    repeat = bool(f.digest) and (f.operator, f.digest) in self.failed_records
                    if f.digest:
                        self.failed_records.add((f.operator, f.digest))
                    if f.fatal or repeat or attempt >= cfg.restart_attempts:
                        if repeat and f.digest.startswith("stuck:"):
                            why = ("got stuck again in the same operator after a restart, so retrying cannot help "
                                   "(raise task_timeout if the call is only slow)")
                        elif repeat:
                            why = ("failed again on the same record after a restart (a poison record: retrying "
                                   "cannot help; fix the function, or pass on_error='skip' to that operator)")
                        elif f.fatal:
                            why = "cannot be retried"
                        else:
                            why = f"failed {attempt + 1} time(s), restart attempts exhausted"
                        raise JobFailed(f"job {self.plan.job!r} {why}: {f}", f.operator, f.traceback) from None
                    attempt += 1
                    self.result.restarts += 1
                    self.tracker.failed_over(f.task, f.public, attempt, at=f.time)
                    if self.stats_writer is not None:
                        self.stats_writer.write(self.tracker, force=True)
                    self._log(f"restarting (attempt {attempt} of {cfg.restart_attempts}) after: {f}")
                    if cfg.restart_delay:
                        time.sleep(cfg.restart_delay)  # the restart strategy's delay, not synchronisation
        finally:
            listener.close()

    def _log(self, msg: str) -> None:
        if self.config.progress:
            print(f"[{self.plan.job}] {msg}", file=sys.stderr, flush=True)

    # ---- one attempt ------------------------------------------------------------------------

    def _attempt(self, gen: int, listener: socket.socket, storage: CheckpointStorage,
                 meta: Metadata | None, next_id: int, restore_root: str) -> None:
        cfg = self.config
        self.generation = gen
        # A new attempt's sources count from zero again: what earlier attempts read is kept,
        # so the run's count only grows (records re-read after a restore count again: work).
        self.count_source_records()  # the previous attempt's last count
        self.records_before += sum(self.source_progress.values())
        self.source_progress = {}
        self.result.attempt_source_records.append(0)
        host, port = listener.getsockname()[:2]
        workers: dict[str, Worker] = {}
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
        try:
            try:
                procs = self.launcher.start([t.id for t in self.plan.tasks], (host, port), gen, secret, material,
                                            env=fence.worker_identity(self.control_dir, token))
            except AbsEngineError as err:
                if gen == 0:
                    raise  # the cluster cannot run this job at all (too few slots): say so at once
                raise WorkerFailure("*", None, f"could not start the workers again: {err}") from None
            workers.update({t: Worker(t, p) for t, p in procs.items()})
            peers = self._accept_hellos(listener, workers, gen, secret, material)
            for t in self.plan.tasks:
                restore = restores.get(t.id)
                self._send(workers[t.id], messages.Deploy(
                    self.plan.to_dict(), self.code, peers, restore,
                    bool(meta is not None and meta.final), storage.root, token,
                    cfg.heartbeat_interval, cfg.task_timeout, cfg.startup_timeout,
                    fence_dir=self.control_dir, snapshot_encoding=cfg.snapshot_encoding,
                    incremental=cfg.incremental_checkpoints and cfg.mode != "none",
                    aligned_timeout=cfg.aligned_timeout if cfg.aligned_timeout is not None else -1.0,
                    unaligned=cfg.mode == "unaligned",
                    channel_state_memory=-1 if cfg.channel_state_memory is None else cfg.channel_state_memory,
                    channel_buffer=cfg.channel_buffer or 0,
                    loop_memory=-1 if cfg.loop_memory is None else cfg.loop_memory,
                    loop_disk=-1 if cfg.loop_disk is None else cfg.loop_disk,
                    loop_spill_dir=cfg.loop_spill_dir or ""))
            self._drive(workers, storage, meta, next_id)
        finally:
            self.launcher.stop({t: w.proc for t, w in workers.items()}, timeout=10.0)
            for w in workers.values():
                if w.sock is not None:
                    w.sock.close()

    def _accept_hellos(self, listener: socket.socket, workers: dict[str, Worker], gen: int,
                       secret: bytes, material: Material | None) -> dict[str, tuple[str, int]]:
        """Every worker's Hello, over connections that proved this attempt's secret first.
        Strangers, stragglers of older attempts (another secret) and stalled handshakes are
        dropped without failing anything."""
        deadline = time.monotonic() + self.config.startup_timeout
        peers: dict[str, tuple[str, int]] = {}
        pending: dict[socket.socket, auth.Incoming] = {}
        sel = selectors.DefaultSelector()
        sel.register(listener, selectors.EVENT_READ, None)

        def drop(sock: socket.socket) -> None:
            sel.unregister(sock)
            pending.pop(sock, None)
            sock.close()

        try:
            while len(peers) < len(workers):
                self._check_alive(workers)
                self._chaos(workers)
                now = time.monotonic()
                if now > deadline:
                    missing = sorted(set(workers) - set(peers))
                    raise WorkerFailure("*", None, f"workers {missing} did not connect within "
                                                   f"{self.config.startup_timeout}s")
                for sock in [s for s, h in pending.items() if h.hs.expired(now)]:
                    drop(sock)
                for key, _ in sel.select(timeout=0.05):
                    if key.data is None:
                        if (new := auth.admit(listener, secret, codec.MAX_CONTROL_FRAME, pending, drop, material)) is not None:
                            pending[new.sock] = new
                            sel.register(new.sock, selectors.EVENT_READ, new.sock)
                        continue
                    sock = key.data
                    conn = pending[sock]
                    try:
                        frame = conn.on_readable()
                        if frame is None:
                            continue
                        msg = messages.decode(frame[1])
                    except (OSError, ProtocolError) as e:
                        if conn.hs.done:
                            self._log(f"dropped a connection that broke the protocol after authenticating: {e}")
                        drop(sock)
                        continue
                    sel.unregister(sock)
                    del pending[sock]
                    if isinstance(msg, messages.Failed) and msg.task in workers:
                        raise WorkerFailure(msg.task, msg.operator, "failed at start-up", msg.traceback, msg.fatal)
                    if not isinstance(msg, messages.Hello) or msg.generation != gen or msg.task not in workers \
                            or msg.task in peers:
                        sock.close()
                        continue
                    w = workers[msg.task]
                    w.sock, w.wire, w.reader = sock, conn.wire, conn.reader
                    w.hello_pid = msg.pid
                    w.last_heard = time.monotonic()
                    peers[msg.task] = (msg.host, msg.port)
        finally:
            sel.close()
            for s in pending:
                s.close()
        self.tracker.workers_connected({t: w.hello_pid or w.proc.pid for t, w in workers.items()})
        return peers

    def _send(self, w: Worker, msg: messages.Message) -> None:
        assert w.wire is not None
        try:
            w.wire.sendall(messages.encode(msg))
        except OSError:
            self._check_alive({w.task: w})
            raise WorkerFailure(w.task, None, "control connection lost") from None

    def _check_alive(self, workers: dict[str, Worker]) -> None:
        for w in workers.values():
            code = w.proc.poll()
            # Status 0 is judged on the control connection: EOF before Committed is a failure.
            # A worker that already committed the final checkpoint has done all its work.
            if code is not None and code != 0 and not w.committed:
                raise self._failure_of(w, code)

    def _failure_of(self, w: Worker, code: int) -> WorkerFailure:
        """Why a dead worker died: its own Failed message (operator, user traceback, fatal)
        if it sent one before exiting, else its exit status."""
        if w.wire is not None:
            try:
                while (data := w.wire.recv(1 << 20, socket.MSG_DONTWAIT)) != b"":
                    if data is not None:
                        w.reader.feed(data)
            except OSError:
                pass
            try:
                while (frame := w.reader.next_frame()) is not None:
                    m = messages.decode(frame[1])
                    if isinstance(m, messages.Failed) and m.task == w.task \
                            and not m.operator.startswith(("<upstream", "<downstream")):
                        return WorkerFailure(m.task, m.operator, "raised an exception", m.traceback, m.fatal,
                                             m.record, m.digest, m.error_type)
            except ProtocolError:
                pass  # its last words are garbled: fall back to the exit status
        return WorkerFailure(w.task, None, f"worker process {w.proc.pid or '?'} {w.proc.describe_exit(code)}")

    def _chaos(self, workers: dict[str, Worker]) -> None:
        chaos = self.config.chaos
        if chaos is None:
            return
        victim = chaos.poll(time.monotonic() - self.started, _live_pids(workers))
        if victim is not None:
            self.result.kills += 1
            self._log(f"chaos: SIGKILL {victim}")

    def _chaos_on_checkpoint(self, checkpoint_id: int, workers: dict[str, Worker]) -> None:
        """Chaos that kills on checkpoint events (``chaos.on_checkpoint(id, pids)``): a kill
        after a completed checkpoint is sure to be followed by a restore from one."""
        hook = getattr(self.config.chaos, "on_checkpoint", None)
        if hook is None:
            return
        victim = hook(checkpoint_id, _live_pids(workers))
        if victim is not None:
            self.result.kills += 1
            self._log(f"chaos: SIGKILL {victim} after checkpoint {checkpoint_id}")

    def _drive(self, workers: dict[str, Worker], storage: CheckpointStorage, meta: Metadata | None, next_id: int) -> None:
        cfg = self.config
        final_restore = meta is not None and meta.final
        coord = CheckpointCoordinator(
            self.plan.job, self.fingerprint, list(workers), self.source_tasks, storage,
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
        sel = selectors.DefaultSelector()
        for w in workers.values():
            assert w.sock is not None
            sel.register(w.sock, selectors.EVENT_READ, w)
            w.last_heard = time.monotonic()
        next_progress = time.monotonic() + 1.0
        running_deadline = time.monotonic() + cfg.startup_timeout  # restore included
        started = False
        try:
            while not all(w.committed for w in workers.values()):
                self._chaos(workers)
                now = time.monotonic()
                deadline = coord.deadline() if started else None
                timeout = 0.1 if deadline is None else max(0.0, min(0.1, deadline - now))
                for key, _ in sel.select(timeout=timeout):
                    w = key.data
                    assert w.wire is not None
                    try:
                        data = w.wire.recv(1 << 20)
                    except OSError:
                        data = b""
                    if data is None:
                        continue  # part of a TLS record
                    if not data:
                        sel.unregister(w.sock)
                        if w.committed:
                            continue
                        _await_exit(w.proc, 5.0)
                        self._check_alive({w.task: w})
                        raise WorkerFailure(w.task, None, "worker closed its control connection")
                    w.last_heard = time.monotonic()
                    try:
                        w.reader.feed(data)
                        while (frame := w.reader.next_frame()) is not None:
                            msg = messages.decode(frame[1])
                            if getattr(msg, "task", w.task) != w.task:
                                raise ProtocolError(ProtocolErrorReason.MALFORMED,
                                                    f"a message claims to come from task {msg.task!r}")  # type: ignore[attr-defined]
                            self._on_message(w, msg, coord, workers)
                    except ProtocolError as e:
                        raise WorkerFailure(w.task, None, f"broke the control protocol ({e})") from None
                    except (TypeError, ValueError, KeyError, AttributeError) as e:
                        # well typed (decode checks that) but naming what does not exist: that worker's fault
                        raise WorkerFailure(w.task, None, f"sent a malformed message ({type(e).__name__}: {e})") \
                            from None
                now = time.monotonic()
                if not started:
                    if all(w.running for w in workers.values()):
                        started = True
                        self.result.running_after_s = time.monotonic() - self.started
                        self.tracker.all_running()
                        self.result.recoveries = list(self.tracker.recoveries)
                        coord.start()
                    elif now > running_deadline:
                        late = sorted(t for t, w in workers.items() if not w.running)
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
                        coord.request_savepoint(stop=True)
                    if self.savepoint_requested:
                        self.savepoint_requested = False
                        coord.request_savepoint(stop=False)
                    for task, m in coord.poll():
                        self._send(workers[task], m)
                    self._track_triggers(coord)
                    self._on_expired(coord)
                self._check_alive(workers)
                self._check_heartbeats(workers, now)
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
            sel.close()
            # Every id this attempt triggered, sent or not: the next attempt starts above them.
            self.highest_id = max(self.highest_id, coord.next_id - 1)
        if cfg.progress:
            self._print_progress(coord)
        if self.result.stopped_with_savepoint:  # every task committed it and waits: now they may go
            for w in workers.values():
                with contextlib.suppress(WorkerFailure):  # one that is gone already has committed
                    self._send(w, messages.Shutdown())
        self.launcher.wait_exit({t: w.proc for t, w in workers.items()}, timeout=30.0)  # exit after Committed

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

    def _check_heartbeats(self, workers: dict[str, Worker], now: float) -> None:
        """A worker silent for task_timeout (no heartbeat: stopped, or stuck holding the
        GIL) fails its task; its Python stacks go to stderr (faulthandler, SIGUSR1)."""
        limit = self.config.task_timeout
        if not limit:
            return
        for w in workers.values():
            if w.committed or now - w.last_heard <= limit:
                continue
            w.proc.dump_stacks()
            raise WorkerFailure(w.task, None, f"worker {w.proc.pid or '?'} sent nothing for {now - w.last_heard:.1f}s "
                                              f"(task_timeout={limit:g}s): it is stopped, or stuck without "
                                              "releasing the GIL; its Python stacks were dumped to stderr")

    def _on_message(self, w: Worker, msg: messages.Message, coord: CheckpointCoordinator,
                    workers: dict[str, Worker]) -> None:
        if isinstance(msg, messages.Running):
            w.running = True
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
                    self._send(workers[task], m)
                self._chaos_on_checkpoint(meta.checkpoint_id, workers)
                if coord.just_drained:
                    self._log(f"checkpoint {meta.checkpoint_id} proves loop(s) {coord.just_drained} drained: "
                              "ending them")
                    for task, m in coord.end_loop_messages(coord.just_drained):
                        self._send(workers[task], m)
        elif isinstance(msg, messages.Finished):
            self.tracker.task_finished(msg.task, msg.records_in, msg.records_out)
            if msg.task in self.source_tasks:
                self.source_progress[msg.task] = msg.records_in
            for task, m in coord.on_finished(msg.task):
                self._send(workers[task], m)
        elif isinstance(msg, messages.Counts):
            for task, m in coord.on_counts(msg):
                self._send(workers[task], m)
        elif isinstance(msg, messages.InputsEnded):
            for task, m in coord.on_inputs_ended(msg.task):
                self._send(workers[task], m)
        elif isinstance(msg, messages.Committed):
            w.committed = True
        elif isinstance(msg, messages.Heartbeat):
            if msg.records_in >= 0:  # (last_heard is updated for every frame)
                self.tracker.task_metrics(msg.task, msg.records_in, msg.records_out, msg.send_s, time.monotonic())
        elif isinstance(msg, messages.Skipped):
            self.result.skipped_records += 1
            if self.result.skipped_records <= 100:
                self._log(f"operator {msg.operator!r} skipped a record (on_error='skip'): {msg.error}; "
                          f"record: {msg.record}")
            elif self.result.skipped_records == 101:
                self._log("more records skipped; not shown (result.skipped_records counts them)")
        elif isinstance(msg, messages.Failed):
            if msg.operator.startswith("<upstream") or msg.operator == "<downstream>":
                suspect = msg.operator[len("<upstream:"):-1] if msg.operator.startswith("<upstream:") else None
                suspect = None if suspect in (None, "None") else suspect
                self._root_cause(workers, exclude=msg.task, suspect=suspect)
            detail = "raised an exception" if not msg.digest.startswith("stuck:") else "was stuck"
            raise WorkerFailure(msg.task, msg.operator, detail, msg.traceback, msg.fatal, msg.record, msg.digest,
                                msg.error_type)

    def _root_cause(self, workers: dict[str, Worker], exclude: str, suspect: str | None) -> None:
        """A task lost a peer: raise the failure of the worker that really died, if any.

        Its own Failed message (a user exception) wins over a bare exit status."""
        candidates = [w for w in workers.values() if w.task != exclude and not w.committed
                      and (suspect is None or w.task == suspect)]
        deadline = time.monotonic() + 2.0
        dead: list[tuple[Worker, int]] = []
        while not dead and time.monotonic() < deadline:
            dead = [(w, c) for w in candidates if (c := w.proc.poll()) is not None and c != 0]
            if not dead:
                time.sleep(0.005)  # reaping a process that is dying; bounded by the deadline
        for w, code in dead:
            raise self._failure_of(w, code)

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


def _live_pids(workers: dict[str, Worker]) -> dict[str, int]:
    """task -> pid of the workers still running that have a pid here (for chaos)."""
    return {t: pid for t, w in workers.items()
            if w.proc.poll() is None and (pid := w.proc.pid or w.hello_pid) is not None}


def _await_exit(proc: WorkerProcess, timeout: float) -> None:
    """Give a worker whose connection closed a moment to exit, so its status explains why
    (polling the launcher; bounded by ``timeout``)."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)


def run_job(flow: "Dataflow", config: JobConfig) -> JobResult:
    """Compile ``flow`` and run it on the executor ``config.executor`` names."""
    plan = flow.compile()
    # Spark sources read through Spark jobs of their own while the job runs.
    reserve = sum(int(getattr(n.template, "spark_slots", 0)) for n in flow.graph.nodes.values())
    launcher = make_launcher(config, reserve)
    try:
        master = JobMaster(flow.graph, plan, config, launcher)
        res = master.run()
    finally:
        launcher.close()
    master.count_source_records()
    return res


def make_launcher(config: JobConfig, reserve_slots: int = 0) -> Launcher:
    if config.executor == "local":
        from .local import LocalLauncher

        return LocalLauncher(config.host)
    if config.executor == "spark":
        from .spark import SparkLauncher

        return SparkLauncher(config.spark, reserve_slots)
    raise ValueError(f"unknown executor {config.executor!r}")


__all__ = ["JobMaster", "run_job", "JobConfig", "JobResult", "WorkerFailure"]
