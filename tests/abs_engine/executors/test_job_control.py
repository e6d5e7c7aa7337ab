"""The running job's control endpoint (executors/job_control.py): ``abs-engine savepoint``
reaches its driver over an authenticated local socket and never signals a process, whatever
is planted in the checkpoint directory."""

from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import threading
from typing import Any

import pytest

from abs_engine import auth
from abs_engine.checkpoint.lock import DirectoryLock
from abs_engine.errors import CheckpointError, CheckpointErrorReason
from abs_engine.executors.job_control import CONTROL_FILE, ControlServer, request
from abs_engine.executors.requests import SavepointRequests

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def answered(path: str, asked: list[bool]) -> Any:
    def handler(stop: bool) -> "concurrent.futures.Future[str]":
        asked.append(stop)
        f: concurrent.futures.Future[str] = concurrent.futures.Future()
        f.set_result(path)
        return f
    return handler


def test_a_request_reaches_the_driver_holding_the_lock(tmp_path) -> None:  # type: ignore[no-untyped-def]
    asked: list[bool] = []
    with DirectoryLock(str(tmp_path), "job"), ControlServer(str(tmp_path), answered("/sp/one", asked)):
        st = os.stat(tmp_path / CONTROL_FILE)
        assert st.st_mode & 0o777 == 0o600
        assert request(str(tmp_path), "savepoint", 10) == "/sp/one"
        assert request(str(tmp_path), "stop", 10) == "/sp/one"
    assert asked == [False, True]
    assert not (tmp_path / CONTROL_FILE).exists()  # removed with the server


def test_no_job_running_is_a_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CheckpointError) as e:
        request(str(tmp_path), "savepoint", 1)
    assert e.value.reason is CheckpointErrorReason.NOT_FOUND and "no job is running" in str(e.value)


def spawn_sleeper(group: int | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "60"], process_group=group)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "abs_engine.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, PYTHONPATH=ROOT))


HOLD_LOCK = """
import fcntl, json, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, json.dumps({"pid": int(sys.argv[2]), "host": os.uname().nodename, "job": "x", "job_id": "",
                         "since": 0, "argv0": "x"}).encode())
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("stop", [False, True])
def test_a_planted_lock_file_makes_the_cli_signal_nobody(tmp_path, stop: bool) -> None:  # type: ignore[no-untyped-def]
    """The finding: a process holding ``_lock`` with another program's pid written in it (or
    a negative pid: a process group) made ``abs-engine savepoint [--stop]`` signal that.
    Whoever can write the directory can do this; each target must stay alive, and the
    command must say no job is running. (-1, every process the caller may signal, is not
    tried: a regression would take the test machine down with it.)"""
    lone = spawn_sleeper()
    leader = spawn_sleeper(group=0)  # a process group of its own...
    member = spawn_sleeper(group=leader.pid)  # ...of two
    try:
        for pid in (lone.pid, -leader.pid):
            d = tmp_path / f"ck{pid}"
            d.mkdir(mode=0o700)
            holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(d / "_lock"), str(pid)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            try:
                assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
                out = cli("savepoint", str(d), *(["--stop"] if stop else []))
                assert holder.poll() is None
            finally:
                holder.kill()
                holder.wait()
            assert out.returncode == 2 and "no job is running" in out.stderr, out.stderr
        for p in (lone, leader, member):
            assert p.poll() is None, f"sleep {p.pid} was signalled: {p.returncode}"
    finally:
        for p in (lone, leader, member):
            p.kill()
            p.wait()


def test_a_planted_control_file_cannot_make_the_cli_trust_an_impostor(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Whoever can write the directory can plant ``_control`` naming their own server: the
    client checks the server's pid holds the job's lock (SO_PEERCRED, /proc/locks) and
    says nothing to it otherwise."""
    name = "abs-engine-impostor-" + os.urandom(4).hex()
    impostor = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    impostor.bind("\0" + name)
    impostor.listen(1)
    got: list[bytes] = []

    def serve() -> None:
        conn, _ = impostor.accept()
        with conn:
            conn.settimeout(10)
            got.append(conn.recv(1024))  # b"": the client hung up without a word

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    fd = os.open(tmp_path / CONTROL_FILE, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, json.dumps({"version": 1, "socket": name, "secret": "00" * 32, "pid": os.getpid()}).encode())
    os.close(fd)
    with DirectoryLock(str(tmp_path / "elsewhere"), "other"):  # this process holds *a* lock, not this one
        with pytest.raises(CheckpointError) as e:
            request(str(tmp_path), "stop", 5)
    t.join(10)
    impostor.close()
    assert e.value.reason is CheckpointErrorReason.LOCKED and "not the driver holding its lock" in str(e.value)
    assert got == [b""]


def test_a_control_file_others_can_read_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / CONTROL_FILE).write_text(json.dumps({"socket": "abs-engine-x", "secret": "00" * 32}))
    os.chmod(tmp_path / CONTROL_FILE, 0o644)
    with pytest.raises(CheckpointError) as e:
        request(str(tmp_path), "savepoint", 5)
    assert e.value.reason is CheckpointErrorReason.UNSAFE_PATH


def test_a_client_without_the_secret_learns_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    asked: list[bool] = []
    with DirectoryLock(str(tmp_path), "job"), ControlServer(str(tmp_path), answered("/sp", asked)) as server:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect("\0" + server.name)
        with pytest.raises(Exception):  # noqa: B017 - ProtocolError (refused proof) or a closed connection
            auth.client_handshake(s, b"\x01" * 32)
        s.close()
    assert asked == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user (uid 65534)")
def test_another_user_is_dropped_before_the_handshake(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Even knowing the socket's name (abstract sockets have no file mode), another uid gets
    no challenge: the server checks SO_PEERCRED first."""
    asked: list[bool] = []
    with DirectoryLock(str(tmp_path), "job"), ControlServer(str(tmp_path), answered("/sp", asked)) as server:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: become nobody, connect, report what the server sent
            try:
                os.close(r)
                os.setgid(65534)
                os.setuid(65534)
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(10)
                s.connect("\0" + server.name)
                os.write(w, b"got:" + s.recv(64))
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                os.write(w, f"error:{e}".encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            said = f.read()
        os.waitpid(pid, 0)
    assert said == b"got:", said  # connected, then closed without a challenge
    assert asked == []


def test_requests_survive_a_failover_and_end_with_the_job() -> None:
    reqs = SavepointRequests()
    first = reqs.submit(stop=False)
    assert reqs.take(0) == [False] and reqs.take(0) == []  # handed once per attempt
    assert reqs.take(1) == [False]  # the attempt failed before its savepoint: asked again
    reqs.taken("/sp/3")
    assert first.result(0) == "/sp/3"
    late = reqs.submit(stop=True)
    reqs.close("the job ended (finished) before the savepoint was taken")
    with pytest.raises(RuntimeError, match="ended"):
        late.result(0)
    with pytest.raises(RuntimeError, match="ended"):
        reqs.submit(stop=False).result(0)
