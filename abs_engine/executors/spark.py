"""The Spark launcher: an attempt's workers run inside one Spark barrier stage.

Slot sharing, as in Flink: Spark task k of the stage hosts subtask k of every operator, so
a job whose widest operator has parallelism p needs p task slots, not one per engine task.
Inside its Spark task each engine task still gets an OS process of its own (the GIL): the
barrier task starts ``python -m abs_engine.runtime.worker DRIVER PORT TASK GEN BIND_HOST``
for each task it hosts, hands it the attempt's secret (and, with ``tls`` on, the attempt's
TLS material) on stdin (both reach the executor inside the pickled stage function, never
on a command line), binds it to the
executor's own address (``BarrierTaskContext.getTaskInfos()``), and waits for them. A worker
that fails fails its Spark task, and a barrier stage fails as a whole: the attempt fails
over, as on the local launcher. A job of several pipelines (executors/pipelined.py) has a
launcher, and so a barrier stage, per pipeline: a failure cancels only its pipeline's
stage; each launcher counts the slots the other pipelines' stages hold. ``stop()`` cancels the stage's job group; workers it cannot reach
exit on their own (their watchdog ends them when the driver connection or their parent
process is gone).

The engine's own packages (``abs_engine``, ``operators``) are shipped to the executors as a
zip (``SparkContext.addPyFile``), so executors need not see the driver's source tree. User
code travels inside the Deploy message as on the local launcher (cloudpickle, by value for
``__main__``; modules a user function lives in must be importable on the executors, e.g.
shipped with ``addPyFile`` too).

Too few slots is an error within seconds that names the slots needed and those the cluster
has, not Spark's ten-minute barrier scheduling retry.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import os
import sys
import tempfile
import threading
import time
import uuid
import zipfile
from typing import Any, Callable, Iterator, Mapping

from .. import ids
from ..errors import AbsEngineError
from ..tls import Material
from .launcher import WorkerProcess

POLL = 0.05  #: seconds between checks of a barrier task's children (it waits on processes)
SLOT_WAIT = 10.0  #: seconds to wait for executors to register before "too few slots"


class SparkLauncherError(AbsEngineError):
    """The Spark cluster cannot run the job's workers (too few slots, no executors)."""


def available_slots(sc: Any) -> int:
    """Task slots the cluster has now: executors' cores / cores per task."""
    try:
        jsc = sc._jsc.sc()
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))
    except Exception:  # noqa: BLE001 - older or newer Spark: fall back to the default parallelism
        return int(sc.defaultParallelism)


def _zip_packages() -> bytes:
    """A zip of the engine's packages (abs_engine, operators), importable from sys.path.
    Found where the import system would find them, without importing them (the executors
    do not depend on the user API or the operator library)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for pkg in ("abs_engine", "operators"):
            spec = importlib.util.find_spec(pkg)
            assert spec is not None and spec.origin is not None, f"package {pkg} is not importable"
            root = os.path.dirname(os.path.abspath(spec.origin))
            base = os.path.dirname(root)
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames[:] = [d for d in dirnames if d != "__pycache__"]
                for name in filenames:
                    if name.endswith((".py", ".typed")):
                        full = os.path.join(dirpath, name)
                        # A fixed timestamp: the same sources give the same bytes (Spark
                        # refuses a file name added twice with other contents).
                        info = zipfile.ZipInfo(os.path.relpath(full, base), date_time=(1980, 1, 1, 0, 0, 0))
                        info.compress_type = zipfile.ZIP_DEFLATED
                        with open(full, "rb") as f:
                            zf.writestr(info, f.read())
    return buf.getvalue()


def package_zip() -> str:
    """The packages' zip as a file Spark can serve: in this user's private cache, in a
    directory named by the zip's sha256, so every process of one engine version shares
    one file (none is left behind per run) and a file that is not byte for byte the zip is
    replaced, never shipped."""
    data = _zip_packages()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    d = os.path.join(base, "abs-engine", "packages", hashlib.sha256(data).hexdigest()[:24])
    os.makedirs(d, mode=0o700, exist_ok=True)
    path = os.path.join(d, "abs_engine_packages.zip")
    try:
        with open(path, "rb") as f:
            if f.read(len(data) + 1) == data:
                return path
    except OSError:
        pass
    fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)  # whole or not at all, for a process reading it meanwhile
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


_shipped: dict[str, str] = {}  #: Spark application id -> the zip it was given (once each)
_ship_lock = threading.Lock()


def ship_packages(sc: Any) -> None:
    """Add the engine's packages to ``sc`` once per application (kept for its life)."""
    with _ship_lock:
        app = sc.applicationId
        if app not in _shipped:
            _shipped[app] = package_zip()
            sc.addPyFile(_shipped[app])


def _stage_function(groups: list[list[str]], driver: tuple[str, int], generation: int,
                    secret_hex: str, driver_path: list[str], material: Material | None = None,
                    identity: dict[str, str] | None = None) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """What barrier task k runs: start the workers of ``groups[k]`` and wait for them."""

    def run(_: Iterator[Any]) -> Iterator[Any]:
        import subprocess

        from pyspark import BarrierTaskContext

        from abs_engine.executors.local import spawn_worker, worker_command

        ctx = BarrierTaskContext.get()
        k = ctx.partitionId()
        bind = ctx.getTaskInfos()[k].address.rsplit(":", 1)[0]
        env = dict(os.environ)
        env.update(identity or {})
        env.setdefault("PYTHONHASHSEED", "0")
        if env["PYTHONHASHSEED"] in ("", "random"):
            env["PYTHONHASHSEED"] = "0"
        # The shipped zip (on this Python worker's path) first; then the driver's path, for
        # user modules on a machine that shares the driver's disk.
        # (sys.path holds the shipped zip relative to the task's directory: made absolute.)
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([os.path.abspath(p) for p in sys.path if p]
                                                          + [p for p in driver_path if p]))
        secret = bytes.fromhex(secret_hex)
        procs: dict[str, subprocess.Popen[bytes]] = {}
        try:
            for t in groups[k]:
                procs[t] = spawn_worker(worker_command(driver, t, generation) + [bind], env, secret, material)
            while any(p.poll() is None for p in procs.values()):
                for t, p in procs.items():
                    code = p.poll()
                    if code not in (None, 0):
                        raise RuntimeError(f"abs-engine worker {t} (pid {p.pid}) exited with status {code}")
                time.sleep(POLL)  # waiting on child processes (no portable wait-any for Popen)
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
        yield [(t, p.returncode, p.pid) for t, p in procs.items()]

    return run


def stage_failure(error: BaseException) -> str:
    """Why a barrier stage failed, in one line: Py4J's first line only names the call
    ("An error occurred while calling ...collectAndServe"); the reason is further down
    (a lost executor, an engine worker's exit, Spark's "Job aborted" line)."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    for marker in ("ExecutorLostFailure", "RuntimeError: abs-engine worker", "Job aborted due to stage failure"):
        for ln in lines:
            if marker in ln:
                text = ln[ln.index(marker):]
                return text[:300]
    return lines[0][:300] if lines else type(error).__name__


class SparkWorker:
    """An engine worker inside a Spark task: reached through its connection; its exit
    status is known once its Spark task has returned."""

    def __init__(self, task: str, stage: "_Stage"):
        self.task = task
        self.stage = stage

    @property
    def pid(self) -> int | None:
        return None  # it may run on another machine; the master learns it from Hello

    def poll(self) -> int | None:
        code = self.stage.exit_codes.get(self.task)
        if code is None and self.stage.error is not None:
            return 1  # the stage failed (an executor lost, a task failed): this worker is gone
        return code

    def describe_exit(self, code: int) -> str:
        if self.stage.error is not None and self.task not in self.stage.exit_codes:
            return f"its Spark barrier stage failed ({stage_failure(self.stage.error)})"
        return f"exited with status {code}"

    def kill(self) -> None:
        self.stage.cancel()

    def dump_stacks(self) -> None:
        pass  # on another machine: its watchdog reports a stuck call itself


class _Stage:
    """One barrier stage (one attempt), collected on a thread of its own."""

    def __init__(self, sc: Any, rdd_fn: Callable[[Iterator[Any]], Iterator[Any]], width: int, group: str):
        self.sc = sc
        self.group = group
        self.exit_codes: dict[str, int] = {}
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(rdd_fn, width), name=f"spark-stage-{group}",
                                       daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[Iterator[Any]], Iterator[Any]], width: int) -> None:
        try:
            self.sc.setJobGroup(self.group, "abs-engine workers", interruptOnCancel=True)
            for results in self.sc.parallelize(range(width), width).barrier().mapPartitions(fn).collect():
                for task, code, _pid in results:
                    self.exit_codes[task] = code
        except BaseException as e:  # noqa: BLE001 - the master learns of failures on the connections
            self.error = e

    def cancel(self) -> None:
        if self.thread.is_alive():
            try:
                self.sc.cancelJobGroup(self.group)
            except Exception:  # noqa: BLE001 - a stopped context has no jobs left to cancel
                pass

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)


class SparkLauncher:
    """Workers in Spark barrier stages, one per attempt."""

    def __init__(self, spark: Any = None, reserve_slots: int = 0):
        from ..spark_session import embedded_session, listen_host

        self.reserve = reserve_slots  #: slots left free for the job's Spark sources' reads
        self.spark = spark if spark is not None else embedded_session()
        self.sc = self.spark.sparkContext
        self.host = listen_host(self.sc)
        ship_packages(self.sc)
        self.stages: list[_Stage] = []

    def start(self, tasks: list[str], driver: tuple[str, int], generation: int,
              secret: bytes, material: Material | None = None,
              env: Mapping[str, str] | None = None) -> dict[str, WorkerProcess]:
        groups = _slot_groups(tasks)
        width = len(groups)
        slots = self._await_slots(width + self.reserve)
        if slots < width + self.reserve:
            extra = f" + {self.reserve} for its Spark sources' reads" if self.reserve else ""
            raise SparkLauncherError(
                f"the job needs {width + self.reserve} Spark task slots ({width} for its workers: its widest "
                f"operator has parallelism {width} and task k hosts subtask k of every operator{extra}) but the "
                f"cluster has {slots}: add executors or cores, or lower the job's parallelism")
        group = f"abs-engine-{uuid.uuid4().hex[:8]}-{generation}"
        fn = _stage_function(groups, driver, generation, secret.hex(), list(sys.path), material, dict(env or {}))
        stage = _Stage(self.sc, fn, width, group)
        self.stages.append(stage)
        return {t: SparkWorker(t, stage) for t in tasks}

    def _await_slots(self, needed: int) -> int:
        """Executors register after the context starts (and a lost one is replaced): wait
        up to SLOT_WAIT seconds for ``needed`` slots; returns the slots there are."""
        deadline = time.monotonic() + SLOT_WAIT
        while (slots := available_slots(self.sc)) < needed and time.monotonic() < deadline:
            time.sleep(0.1)  # polling the cluster's registered executors, bounded
        return slots

    def stop(self, workers: Mapping[str, WorkerProcess], timeout: float) -> None:
        for stage in {w.stage for w in workers.values() if isinstance(w, SparkWorker)}:
            stage.cancel()
            stage.join(timeout)

    def wait_exit(self, workers: Mapping[str, WorkerProcess], timeout: float) -> None:
        for stage in {w.stage for w in workers.values() if isinstance(w, SparkWorker)}:
            stage.join(timeout)
            stage.cancel()

    def close(self) -> None:
        for stage in self.stages:
            stage.cancel()


def _slot_groups(tasks: list[str]) -> list[list[str]]:
    """Task ids ``<chain>#<k>`` grouped by subtask index k (slot sharing)."""
    groups: dict[int, list[str]] = {}
    for t in tasks:
        k = ids.index_of(t)
        groups.setdefault(k, []).append(t)
    return [groups[k] for k in sorted(groups)]
