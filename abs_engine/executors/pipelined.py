"""A job of several pipelines, each failing over alone (``failover="pipeline"``, the default).

A pipeline (pipelines.py) is a set of operators connected upstream and downstream, loops
included; two pipelines exchange no record. So each runs as a job of its own on a driver
thread of its own: a ``JobMaster`` (master.py) over the plan restricted to it, with its
own checkpoint coordinator and ids, its own checkpoints in ``DIR/pipeline-<name>/`` (its
lock, output fence, control endpoint and statistics there too), its own restart counter,
failure manager and launcher (on Spark: its own barrier stage). A failure restarts its
pipeline's tasks from its pipeline's latest checkpoint; the other pipelines' tasks are
not touched, and their output runs on (SeaTunnel's pipeline failover).

What the job shares is held here: the driver hooks and the shipped code (once); the lock
on ``DIR`` (two jobs never share it; a supervisor's lock is adopted here); the control
endpoint of ``DIR`` (a savepoint asked of the job is asked of every pipeline); the signals
(SIGTERM stops every pipeline with a savepoint); and the result (``JobResult.pipelines``,
one per pipeline, and the job's totals).

Invariants: the job ends when every pipeline has ended. It fails when one pipeline fails
(restarts exhausted, a fatal error), with that pipeline's error, which names it; the
others are then stopped (workers killed; a resume restores each from its own latest
checkpoint). A savepoint of the job is a directory (``savepoint-<job>-pipelines-<time>``)
holding, per pipeline, a ``pipeline-<name>`` directory of that pipeline's savepoints
(a pipeline that had finished gets its final checkpoint, so that restoring it commits and
writes nothing again); ``restore_from`` that directory restores each pipeline from its
newest one (savepoint_sets.py).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import shutil
import sys
import threading
import time
from typing import Callable

from .. import fs
from ..checkpoint.lock import DirectoryLock
from ..checkpoint.remote import control_dir, open_storage
from ..errors import CheckpointError, CheckpointErrorReason, JobInterrupted
from ..graph import LogicalGraph
from ..lifecycle import Lifecycle, Phase
from ..pipelines import Pipeline, find_pipelines, restrict
from ..plan import Plan
from .config import JobConfig
from .job_control import ControlServer
from .job_storage import open_job_storage, pipeline_dirs
from .launcher import Launcher
from .master import JobMaster, shipped
from .pipeline_results import combine
from .result import JobResult
from .serve_dashboard import serve_dashboard
from .savepoint_sets import adopt_final, complete_set, finished_in, pipeline_savepoint, set_location
from .signals import Signals


class PipelinedMaster:
    def __init__(self, graph: LogicalGraph, plan: Plan, config: JobConfig,
                 launcher: Callable[[int], Launcher | None]):
        self.graph = graph
        self.plan = plan
        self.config = config
        #: One launcher per pipeline (Spark: a barrier stage each), given the task slots the
        #: other pipelines' workers hold (Spark: slot sharing, a pipeline's widest operator).
        self.new_launcher = launcher
        self.pipelines = find_pipelines(plan)
        self.result = JobResult(job=plan.job)
        self.signals = Signals(self._log)  #: installed here (the main thread), passed on to each pipeline
        #: Set when every pipeline must stop at once: one failed, or a second signal.
        self.stopping = threading.Event()
        self.masters: list[JobMaster] = []
        self.lifecycle = Lifecycle()
        self._lock = threading.Lock()  #: guards ``self.result`` while pipelines' threads read it
        self._set_lock = threading.Lock()  #: one completion of the savepoint set at a time

    # ---- the job ----------------------------------------------------------------------------

    def run(self) -> JobResult:
        with shipped(self.graph) as code, self.signals.handled(self.config.stop_with_savepoint_on_signal):
            return self._run(code)

    def _run(self, code: bytes) -> JobResult:
        cfg = self.config
        storage, location, temp = open_job_storage(cfg)
        self.result.checkpoint_dir = storage.shown
        lock = DirectoryLock(control_dir(location), self.plan.job)
        lock.acquire()
        began = time.monotonic()
        try:
            if storage.ids_on_disk():
                raise CheckpointError(
                    CheckpointErrorReason.PLAN_MISMATCH,
                    f"checkpoint directory {storage.shown} holds checkpoints of this job run as one pipeline "
                    f"(failover='job', or a version of the dataflow with one pipeline); this dataflow has "
                    f"{len(self.pipelines)} pipelines, each checkpointed apart: run it with failover='job' to "
                    "resume from them, or use another directory")
            self._check_resume(location)
            self.savepoints = set_location(cfg, location, self.plan.job)
            self.masters = [self._master(p, code, location) for p in self.pipelines]
            for p, m in zip(self.pipelines, self.masters):
                if (done := finished_in(m.config.restore_from, m.shape)) is not None:
                    self._log(f"pipeline {p.name!r} had finished at checkpoint {done} of the savepoint: not run again")
                    assert m.config.restore_from is not None and m.config.checkpoint_dir is not None
                    adopt_final(m.config.restore_from, m.config.checkpoint_dir)  # (a resume finds it finished)
                    m.result.restored_from.append(done)
                    m.lifecycle.to(Phase.FINISHED)
                    m.result.phases = [ph.value for ph in m.lifecycle.history]
            self.lifecycle.to(Phase.SCHEDULING)
            views = {p.name: m.tracker for p, m in zip(self.pipelines, self.masters)}
            with ControlServer(control_dir(location), self._submit), serve_dashboard(
                    views, cfg, _JobRequests(self), self.plan.job) as url:
                self.result.dashboard_url = url
                outcomes = self._run_all()
            self.result.duration_s = time.monotonic() - began
            self._combine()
            failed = [(p, e) for p, e in zip(self.pipelines, outcomes) if e is not None]
            if failed:
                self.lifecycle.to(Phase.FAILED)
                _, err = failed[0]
                raise err
            self.lifecycle.to(Phase.CANCELED if self.result.cancelled else Phase.FINISHED)
            if self.result.savepoint:
                with self._set_lock:
                    complete_set(self.result.savepoint, self.pipelines, self.masters, self._log)
            return self.result
        finally:
            self.result.phases = [p.value for p in self.lifecycle.history]
            lock.release()
            if temp:
                shutil.rmtree(location, ignore_errors=True)

    def _check_resume(self, location: str) -> None:
        """What ``DIR/pipeline-*`` holds agrees with ``resume``, before any pipeline starts:
        without it, no pipeline's checkpoints of an earlier run; with it, none of a pipeline
        this dataflow no longer has (renamed, or an operator added before its first one:
        resuming would drop its state silently) unless ``allow_non_restored_state``; with
        ``resume=True``, some pipeline has a checkpoint (each pipeline is then resumed if it
        has one: a pipeline new to the dataflow starts empty)."""
        cfg = self.config
        shown = self.result.checkpoint_dir
        held = {n for n in pipeline_dirs(location) if open_storage(fs.join(location, n)).completed_ids()}
        mine = {p.directory for p in self.pipelines}
        if held and not cfg.resume:
            raise CheckpointError(
                CheckpointErrorReason.DIRECTORY_NOT_EMPTY,
                f"checkpoint directory {shown} already holds checkpoints of an earlier run ({', '.join(sorted(held))}): "
                "pass resume=True (--resume) to continue from them, or use an empty directory")
        if cfg.resume and (gone := sorted(held - mine)) and not cfg.allow_non_restored_state:
            raise CheckpointError(
                CheckpointErrorReason.PLAN_MISMATCH,
                f"checkpoint directory {shown} holds checkpoints of pipelines this dataflow does not have "
                f"({', '.join(gone)}; its pipelines: {', '.join(sorted(mine))}; a pipeline is named after its "
                "first operator): resuming would drop their state. Give the operators their old names, or pass "
                "allow_non_restored_state=True to drop it")
        if cfg.resume is True and cfg.restore_from is None and not held & mine:
            raise CheckpointError(
                CheckpointErrorReason.NOT_FOUND,
                f"resume=True, but checkpoint directory {shown} holds no checkpoint of any "
                f"of this job's pipelines ({', '.join(p.directory for p in self.pipelines)}): check the path, "
                "or pass resume='if-present' to start afresh when there is none")

    def _master(self, p: Pipeline, code: bytes, location: str) -> JobMaster:
        """Pipeline ``p``'s master: the job's options, its own directories, its own view in
        the job's dashboard."""
        cfg = self.config
        sub = dataclasses.replace(
            cfg, checkpoint_dir=fs.join(location, p.directory),
            resume="if-present" if cfg.resume else False,
            restore_from=pipeline_savepoint(cfg.restore_from, p, cfg.allow_non_restored_state),
            savepoint_dir=fs.join(self.savepoints, p.directory),
            dashboard=None, supervise=False, stop_when=self._stop_when)  # (the job's dashboard shows it)
        plan = restrict(self.plan, p)
        others = sum(max(c.parallelism for c in self.plan.chains if c.name in q.chains)
                     for q in self.pipelines if q.id != p.id)
        master = JobMaster(self.graph, plan, sub, self.new_launcher(others))
        master.code = code
        master.what = f"pipeline {p.name!r} (pipeline {p.id}) of job {self.plan.job!r}"
        master.log_prefix = f"{self.plan.job}/{p.name}"
        master.result.pipeline = p.name
        master.tracker.pipeline_id = p.id
        return master

    def _run_all(self) -> list[BaseException | None]:
        """Each pipeline on a thread of its own until all have ended; what each raised."""
        outcomes: list[BaseException | None] = [None] * len(self.masters)

        def run(i: int) -> None:
            try:
                if not self.masters[i].lifecycle.ended:
                    self.masters[i].run_shipped()
            except BaseException as e:  # noqa: BLE001 - handed to the job's thread, which raises it
                outcomes[i] = e
                self.stopping.set()  # a pipeline failed: the job fails, the others stop
            finally:
                # (a pipeline not run, or that failed before its master's own close: its
                # savepoint requests must not wait for ever; close is idempotent)
                self.masters[i].requests.close(
                    f"pipeline {self.pipelines[i].name!r} had ended before the savepoint was taken")
                launcher = self.masters[i].launcher
                if launcher is not None:
                    launcher.close()

        threads = [threading.Thread(target=run, args=(i,), name=f"pipeline-{p.name}", daemon=True)
                   for i, p in enumerate(self.pipelines)]
        for t in threads:
            t.start()
        self.lifecycle.to(Phase.RUNNING)
        try:
            for t in threads:
                while t.is_alive():
                    self._pass_signals()
                    t.join(0.1)  # (short: the signal handlers run on this thread between joins)
        except KeyboardInterrupt as e:  # a second signal: stop every pipeline at once
            self.stopping.set()
            for t in threads:
                t.join()
            self.lifecycle.to(Phase.CANCELED)
            self._combine()
            kept = None if self.config.checkpoint_dir is None else self.result.checkpoint_dir
            raise JobInterrupted(
                f"job {self.plan.job!r} stopped at once ({e or 'interrupted'}), without a savepoint; every "
                "pipeline's workers were stopped; " + (
                    f"its checkpoints are in {kept}: resume with run(resume=True, checkpoint_dir={kept!r})"
                    if kept else "its checkpoints were in a temporary directory, now removed"), kept) from None
        return outcomes

    def _pass_signals(self) -> None:
        """What the signals asked of the job, asked of every pipeline (each takes its own
        savepoint; each pipeline's driver clears its own ``savepoint_requested``)."""
        ask_savepoint, self.signals.savepoint_requested = self.signals.savepoint_requested, False
        for m in self.masters:
            if self.signals.stop_requested:
                m.signals.stop_requested = True
            if ask_savepoint:
                m.signals.savepoint_requested = True

    def _stop_when(self, _result: JobResult) -> bool:
        """Each pipeline's ``stop_when``: stop when the job must (another pipeline failed,
        an interrupt), or when the user's ``stop_when`` says so of the job's result."""
        if self.stopping.is_set():
            return True
        if self.config.stop_when is None:
            return False
        with self._lock:  # (one pipeline's thread at a time: the user's function sees a result no one changes)
            self._combine()
            if self.config.stop_when(self.result):
                self.stopping.set()
        return self.stopping.is_set()

    def _combine(self) -> None:
        combine(self.result, [m.result for m in self.masters], self.savepoints)

    def _submit(self, stop: bool) -> "concurrent.futures.Future[str]":
        """``abs-engine savepoint DIR``: a savepoint of every pipeline; answered with the
        job's savepoint directory once each pipeline has answered and a pipeline that had
        finished has its final checkpoint in it; refused, naming them, if a pipeline ended
        otherwise (the set would not restore the job)."""
        out: concurrent.futures.Future[str] = concurrent.futures.Future()
        if stop:
            self.signals.stop_requested = True  # (as a job run as one: a signal after this stops at once)
        futures = [m.requests.submit(stop) for m in self.masters]

        def answer() -> None:
            concurrent.futures.wait(futures)
            try:
                missing = [f"pipeline {p.name!r}: {f.exception()}" for p, m, f in zip(self.pipelines, self.masters, futures)
                           if f.exception() is not None and m.lifecycle.phase is not Phase.FINISHED]
                if missing:
                    raise RuntimeError(f"no savepoint of every pipeline ({'; '.join(missing)})")
                with self._set_lock:  # a finished pipeline's final checkpoint, in before the set is handed out
                    complete_set(self.savepoints, self.pipelines, self.masters, self._log)
                out.set_result(self.savepoints)
            except Exception as e:  # noqa: BLE001 - why there is no savepoint, for the client
                out.set_exception(e)

        # (waits on this thread, not in a pipeline driver's callback: copying a final checkpoint takes time)
        threading.Thread(target=answer, name="savepoint-set", daemon=True).start()
        return out

    def _log(self, msg: str) -> None:
        if self.config.progress:
            print(f"[{self.plan.job}] {msg}", file=sys.stderr, flush=True)


class _JobRequests:
    """The dashboard's controls asked of the whole job: a savepoint of every pipeline (one
    set, as ``abs-engine savepoint`` asks it), or every pipeline cancelled."""

    def __init__(self, job: PipelinedMaster):
        self.job = job

    def submit(self, stop: bool) -> "concurrent.futures.Future[str]":
        return self.job._submit(stop)

    def cancel(self, why: str) -> bool:
        return any([m.requests.cancel(why) for m in self.job.masters])  # (a list: every one is asked)


__all__ = ["PipelinedMaster"]
