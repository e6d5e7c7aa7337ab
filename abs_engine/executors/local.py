"""The embedded default launcher: one OS process per task on this machine.

Each attempt starts one fork server (runtime/fork_server.py) with this interpreter, this
``sys.path`` and the attempt's environment, and it forks one worker per task: a worker so
started skips the interpreter's start and the engine's imports (a quarter of a second of
CPU each). The attempt's secret goes to the server on stdin, one hex line, followed by a
line with the attempt's TLS material if the job has ``tls`` on; then a ``fork TASK`` line
per worker. The server reports each worker's pid and, once the launcher has acknowledged
it and it has been reaped, its exit status (the protocol: runtime/fork_server.py).
``worker_command``/``spawn_worker`` start one worker on its own (the Spark executor's way).
``PYTHONHASHSEED`` is pinned for every worker (as PySpark does) so that hash partitioning
agrees across workers and restarts.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
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
        return describe_exit(code)


def describe_exit(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exited with status {code}"


class ForkServer:
    """One attempt's fork server, seen from the launcher: pids and exit statuses as it
    reports them (a reader thread), stdin to ask for workers and, closed, to end it.

    Each worker is held by a pidfd, opened when its pid is reported and then acknowledged
    to the server, which reaps no worker before that (runtime/fork_server.py): so the pidfd
    names that worker and no later process with its pid. Signals go through it, and if the
    server dies its orphaned workers can still be stopped and seen to exit."""

    #: the exit status of a worker whose server died before reporting it (or forking it)
    LOST = 255

    def __init__(self, driver: tuple[str, int], generation: int, secret: bytes, material: Material | None,
                 env: dict[str, str]):
        events_r, events_w = os.pipe()
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "abs_engine.runtime.worker", "--fork-server",
                                          str(events_w), driver[0], str(driver[1]), str(generation)],
                                         env=env, stdin=subprocess.PIPE, pass_fds=(events_w,))
        except BaseException:
            os.close(events_r)
            raise
        finally:
            os.close(events_w)
        self.events = os.fdopen(events_r, "rb")
        self.pids: dict[str, int] = {}
        self.pidfds: dict[int, int] = {}
        self.exits: dict[int, int] = {}
        self.gone = False  # its events pipe is closed: no more news
        self.cond = threading.Condition()
        self.stdin_lock = threading.Lock()  # the launcher's and the reader's requests, whole lines
        self.reader = threading.Thread(target=self._read, name="fork-server-events", daemon=True)
        try:
            self.reader.start()
        except BaseException:
            self.events.close()
            self.proc.kill()
            self.proc.wait()
            raise
        self._send(secret.hex() + "\n" + (material.encode() if material is not None else "") + "\n")

    def _send(self, text: str) -> None:
        assert self.proc.stdin is not None
        with self.stdin_lock:
            try:
                self.proc.stdin.write(text.encode())
                self.proc.stdin.flush()
            except (OSError, ValueError):
                pass  # it died: _read sees its events pipe close, and its workers count as exited

    def _read(self) -> None:
        for line in self.events:
            kind, _, rest = line.rstrip(b"\n").decode("utf-8", "replace").partition(" ")
            pid_text, _, arg = rest.partition(" ")
            if not pid_text.isdigit():
                continue
            pid = int(pid_text)
            with self.cond:
                if kind == "started" and arg:
                    self.pids[arg] = pid
                    try:
                        self.pidfds[pid] = os.pidfd_open(pid)  # unreaped until acknowledged: it is ours
                    except OSError:
                        pass  # (no pidfds on this kernel: its exit line still comes)
                elif kind == "exit":
                    self.exits[pid] = int(arg)
                self.cond.notify_all()
            if kind == "started":
                self._send(f"ack {pid}\n")
        with self.cond:
            self.gone = True
            self.cond.notify_all()
        self.events.close()

    def fork(self, tasks: list[str], timeout: float = 60.0) -> dict[str, "ForkedProcess"]:
        self._send("".join(f"fork {t}\n" for t in tasks))
        deadline = time.monotonic() + timeout
        with self.cond:
            self.cond.wait_for(lambda: self.gone or all(t in self.pids for t in tasks),
                               max(0.0, deadline - time.monotonic()))
        return {t: ForkedProcess(self, t) for t in tasks}

    def status(self, task: str) -> int | None:
        with self.cond:
            pid = self.pids.get(task)
            if pid is not None and pid in self.exits:
                return self.exits[pid]
            if not self.gone:
                return None
            fd = self.pidfds.get(pid) if pid is not None else None
            if fd is not None and not _exited(fd):
                return None  # an orphan, still running
            return self.LOST  # never forked, or its status went with the server

    def server_exit(self) -> str:
        """How the server ended, for the error the user sees."""
        try:
            code = self.proc.wait(timeout=5.0)  # its events pipe closed: it is exiting
        except subprocess.TimeoutExpired:
            return "stopped reporting"
        return ("was " if code < 0 else "") + describe_exit(code)

    def signal(self, task: str, sig: int) -> None:
        with self.cond:
            pid = self.pids.get(task)
            fd = self.pidfds.get(pid) if pid is not None else None
            if fd is None or pid in self.exits:
                return  # not forked, reaped, or not held: nothing of ours to signal
            try:
                signal.pidfd_send_signal(fd, sig)
            except ProcessLookupError:
                pass

    def wait(self, tasks: list[str], deadline: float) -> bool:
        while True:
            with self.cond:
                if all(self.status(t) is not None for t in tasks):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                # news arrive from the reader; an orphan's exit (server gone) only by polling
                self.cond.wait(min(left, 0.05) if self.gone else left)

    def close(self, timeout: float) -> None:
        """End of the attempt: stdin closed, the server exits (its workers were stopped)."""
        with self.stdin_lock:
            if self.proc.stdin is not None and not self.proc.stdin.closed:
                try:
                    self.proc.stdin.close()
                except OSError:
                    pass
        reap([self.proc], timeout)
        self.reader.join(timeout=5.0)  # the server has exited: its events pipe ends at once
        with self.cond:
            for fd in self.pidfds.values():
                os.close(fd)
            self.pidfds.clear()


def _exited(pidfd: int) -> bool:
    """A pidfd turns readable when its process has exited."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


class ForkedProcess:
    """A worker forked by an attempt's fork server (its grandchild: the server reports its
    exit status)."""

    def __init__(self, server: ForkServer, task: str):
        self.server, self.task = server, task

    @property
    def pid(self) -> int | None:
        return self.server.pids.get(self.task)

    def poll(self) -> int | None:
        return self.server.status(self.task)

    def kill(self) -> None:
        self.server.signal(self.task, signal.SIGKILL)

    def dump_stacks(self) -> None:
        self.server.signal(self.task, signal.SIGUSR1)

    def describe_exit(self, code: int) -> str:
        pid = self.pid
        if code == ForkServer.LOST and self.server.gone and (pid is None or pid not in self.server.exits):
            if pid is None:
                return f"was never started: its fork server {self.server.server_exit()}"
            return f"exited; its exit status was lost with its fork server, which {self.server.server_exit()}"
        return describe_exit(code)


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


def _by_server(workers: Mapping[str, WorkerProcess]) -> list[tuple[ForkServer, list[str]]]:
    """The fork servers of ``workers`` and the tasks each forked."""
    tasks: dict[int, tuple[ForkServer, list[str]]] = {}
    for t, w in workers.items():
        if isinstance(w, ForkedProcess):
            tasks.setdefault(id(w.server), (w.server, []))[1].append(t)
    return list(tasks.values())


class LocalLauncher:
    """Workers on this machine, forked by one fork server per attempt."""

    def __init__(self, host: str = "127.0.0.1"):
        self.host = host
        self.servers: list[ForkServer] = []

    def start(self, tasks: list[str], driver: tuple[str, int], generation: int,
              secret: bytes, material: Material | None = None,
              env: Mapping[str, str] | None = None) -> dict[str, WorkerProcess]:
        server = ForkServer(driver, generation, secret, material, worker_env(env))
        self.servers.append(server)
        return dict(server.fork(tasks))

    def stop(self, workers: Mapping[str, WorkerProcess], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for w in workers.values():
            w.kill()
        reap([w.proc for w in workers.values() if isinstance(w, LocalProcess)], timeout)
        self._end(workers, deadline)

    def wait_exit(self, workers: Mapping[str, WorkerProcess], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        reap([w.proc for w in workers.values() if isinstance(w, LocalProcess)], timeout)
        for server, mine in _by_server(workers):
            if not server.wait(mine, deadline):
                for t in mine:
                    workers[t].kill()
        self._end(workers, deadline)

    def _end(self, workers: Mapping[str, WorkerProcess], deadline: float) -> None:
        for server, mine in _by_server(workers):
            server.wait(mine, max(deadline, time.monotonic() + 5.0))  # SIGKILLed: reaped at once
            if any(server.status(t) is None for t in list(server.pids)):
                continue  # others it forked run on (a region restarted alone: regions.py)
            server.close(max(0.0, deadline - time.monotonic()) + 5.0)
            if server in self.servers:
                self.servers.remove(server)

    def close(self) -> None:
        for server in self.servers:
            for task in list(server.pids):
                ForkedProcess(server, task).kill()
            server.close(5.0)
        self.servers.clear()
