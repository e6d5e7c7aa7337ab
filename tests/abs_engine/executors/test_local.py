"""The embedded launcher (executors/local.py) and its fork server (runtime/fork_server.py):
forked workers carry the attempt's identity where the output fence looks for it, their
pids and exit statuses are reported, and a fork server that dies strands nothing."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from abs_engine import auth
from abs_engine.checkpoint import fence
from abs_engine.executors.local import ForkServer, LocalLauncher

from .procs import gone, proc_stat, servers_of, workers_of


@pytest.fixture
def driver():
    """A driver's port that accepts connections and says nothing: a worker waits there for
    its challenge, alive, until the test is done with it."""
    listener = socket.create_server(("127.0.0.1", 0))
    conns: list[socket.socket] = []
    yield listener, conns
    for c in conns:
        c.close()
    listener.close()


def accept(listener: socket.socket, conns: list[socket.socket], n: int) -> None:
    listener.settimeout(30)
    for _ in range(n):
        conns.append(listener.accept()[0])


def environ(pid: int) -> dict[bytes, bytes]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        return dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)


def test_forked_workers_carry_the_attempts_identity_and_report_how_they_ended(tmp_path, driver):
    listener, conns = driver
    launcher = LocalLauncher()
    identity = fence.worker_identity(str(tmp_path), "job/run/3")
    workers = launcher.start(["a#0", "b#0"], listener.getsockname()[:2], 3, auth.new_secret(), env=identity)
    accept(listener, conns, 2)  # both forked and connected
    server = servers_of(os.getpid())
    assert len(server) == 1
    assert set(workers_of(os.getpid())) == {w.pid for w in workers.values()}
    for task, w in workers.items():
        assert w.pid is not None and w.poll() is None
        assert proc_stat(w.pid)[1] == server[0]  # type: ignore[index]
        # what the fence reads to tell a stale worker of this job (checkpoint/fence.py)
        with open(f"/proc/{w.pid}/cmdline", "rb") as f:
            assert fence.WORKER_MODULE in f.read()
        env = environ(w.pid)
        assert env[fence.TOKEN_ENV.encode()] == b"job/run/3"
        with open(f"/proc/{w.pid}/comm") as f:  # top and ps -o comm name its task
            assert f.read().strip() == f"abs {task}"
        assert env[b"PYTHONHASHSEED"] == b"0"
    workers["a#0"].kill()
    conns[0].close()
    conns[1].close()  # the other one's handshake fails: it says so and exits with status 1
    deadline = time.monotonic() + 30
    while any(w.poll() is None for w in workers.values()) and time.monotonic() < deadline:
        time.sleep(0.01)
    codes = sorted(w.poll() for w in workers.values())  # type: ignore[type-var]
    assert codes == [-signal.SIGKILL, 1]
    assert workers["a#0"].describe_exit(-9) == "killed by signal 9"
    launcher.stop(workers, timeout=10)
    assert servers_of(os.getpid()) == [] and launcher.servers == []


def test_stop_kills_the_workers_and_ends_the_server(driver):
    listener, conns = driver
    launcher = LocalLauncher()
    workers = launcher.start([f"t#{i}" for i in range(3)], listener.getsockname()[:2], 0, auth.new_secret())
    accept(listener, conns, 3)
    pids = [w.pid for w in workers.values()]
    launcher.stop(workers, timeout=10)
    assert [w.poll() for w in workers.values()] == [-signal.SIGKILL] * 3
    assert all(gone(p) for p in pids if p is not None)  # type: ignore[arg-type]
    assert servers_of(os.getpid()) == []


def test_a_fork_server_that_dies_leaves_its_workers_stoppable(driver):
    listener, conns = driver
    launcher = LocalLauncher()
    workers = launcher.start(["a#0"], listener.getsockname()[:2], 0, auth.new_secret())
    accept(listener, conns, 1)
    w = workers["a#0"]
    server = launcher.servers[0]
    server.proc.kill()
    server.proc.wait()
    deadline = time.monotonic() + 10
    while not server.gone and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.gone
    assert w.poll() is None  # an orphan now, still running: not reported dead
    pid = w.pid
    launcher.stop(workers, timeout=10)  # through its pidfd
    assert w.poll() == ForkServer.LOST
    assert w.describe_exit(ForkServer.LOST) == ("exited; its exit status was lost with its fork server, "
                                                "which was killed by signal 9")
    assert pid is not None
    deadline = time.monotonic() + 10
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gone(pid)


def test_a_fork_server_without_a_secret_refuses_to_fork(driver):
    listener, _ = driver
    server = ForkServer(listener.getsockname()[:2], 0, b"", None, dict(os.environ, PYTHONHASHSEED="0"))
    workers = server.fork(["a#0"], timeout=30)
    assert workers["a#0"].poll() == ForkServer.LOST and server.pids == {}
    # no secret on stdin: the server said so on stderr and exited
    assert workers["a#0"].describe_exit(ForkServer.LOST) == "was never started: its fork server exited with status 1"
    server.close(5)
