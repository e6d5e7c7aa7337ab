"""The embedded default launcher: one OS process per task on this machine.

Each worker is ``python -m abs_engine.runtime.worker HOST PORT TASK GENERATION`` started
with this interpreter and this ``sys.path``; its attempt's secret goes in on stdin, one
hex line, followed by a line with the attempt's TLS material if the job has ``tls`` on.
``PYTHONHASHSEED`` is pinned for every worker (as PySpark does) so that hash partitioning
agrees across workers and restarts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Mapping

from ..tls import Material
from .launcher import WorkerProcess


def worker_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra or {})
    seed = env.get("PYTHONHASHSEED")
    if seed in (None, "", "random"):
        env["PYTHONHASHSEED"] = "0"  # hash partitioning must agree across workers and restarts
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def worker_command(driver: tuple[str, int], task: str, generation: int) -> list[str]:
    return [sys.executable, "-m", "abs_engine.runtime.worker", driver[0], str(driver[1]), task, str(generation)]


def spawn_worker(command: list[str], env: dict[str, str], secret: bytes,
                 material: Material | None = None) -> subprocess.Popen[bytes]:
    """Start a worker and hand it the attempt's secret (and TLS material) on stdin."""
    proc = subprocess.Popen(command, env=env, stdin=subprocess.PIPE)
    assert proc.stdin is not None
    lines = secret.hex().encode() + b"\n"
    if material is not None:
        lines += material.encode().encode("ascii") + b"\n"
    try:
        proc.stdin.write(lines)
        proc.stdin.close()
    except OSError:
        pass  # it died at once: its exit status tells the master
    return proc


class LocalProcess:
    """A worker started by this process (a child: its exit status is known)."""

    def __init__(self, proc: subprocess.Popen[bytes]):
        self.proc = proc

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()

    def dump_stacks(self) -> None:
        try:
            os.kill(self.proc.pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass

    def describe_exit(self, code: int) -> str:
        return f"killed by signal {-code}" if code < 0 else f"exited with status {code}"


def reap(procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
    """Wait for every process to exit, all against one deadline (not one timeout each);
    SIGKILL those still alive at the deadline."""
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


class LocalLauncher:
    """Workers as child processes of the driver, on this machine."""

    def __init__(self, host: str = "127.0.0.1"):
        self.host = host

    def start(self, tasks: list[str], driver: tuple[str, int], generation: int,
              secret: bytes, material: Material | None = None,
              env: Mapping[str, str] | None = None) -> dict[str, LocalProcess]:
        env = worker_env(env)
        return {t: LocalProcess(spawn_worker(worker_command(driver, t, generation), env, secret, material))
                for t in tasks}

    def stop(self, workers: Mapping[str, WorkerProcess], timeout: float) -> None:
        for w in workers.values():
            w.kill()
        reap([w.proc for w in workers.values() if isinstance(w, LocalProcess)], timeout)

    def wait_exit(self, workers: Mapping[str, WorkerProcess], timeout: float) -> None:
        reap([w.proc for w in workers.values() if isinstance(w, LocalProcess)], timeout)

    def close(self) -> None:
        pass
