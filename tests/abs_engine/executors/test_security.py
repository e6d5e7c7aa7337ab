"""Attacks on a running job, each with an exact oracle or a clear error, never a hang:
impersonation and garbage on the driver's port, two jobs or two resumes on one checkpoint
directory, and a sink worker of a dead driver that wakes up later (it must not change the
output). Tests of the checkpoint directory itself are in tests/abs_engine/checkpoint."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import pytest

from abs_engine import CheckpointError, Dataflow, messages
from abs_engine import auth, codec
from abs_engine.errors import CheckpointErrorReason
from abs_engine.testing import CapturingSink, TestingSource

from .leftover_job import N, build
from .procs import address, gone, proc_stat, run_in_thread, wait_for, workers_of

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class Gate:
    """A map function that, at record ``at`` in the first attempt, waits for the test's
    ``go`` file (the test attacks meanwhile), then lets records through or kills its worker."""

    def __init__(self, go: str, at: int, kill: bool):
        self.go, self.at, self.kill = go, at, kill

    def __call__(self, x: int) -> int:
        if x == self.at and os.environ.get("ABS_ENGINE_ATTEMPT") == "0":
            deadline = time.monotonic() + 60
            while not os.path.exists(self.go) and time.monotonic() < deadline:
                time.sleep(0.01)
            if self.kill:
                os.kill(os.getpid(), signal.SIGKILL)
        return x


def read_all(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    got = b""
    try:
        while data := sock.recv(1 << 16):
            got += data
    except (ConnectionResetError, socket.timeout):
        pass
    return got


@pytest.mark.parametrize("executor", ["local", "local-tls", pytest.param("spark", marks=pytest.mark.spark)])
def test_impostors_on_the_drivers_port_get_nothing_and_the_job_stays_exact(tmp_path, executor, request):
    go = str(tmp_path / "go")
    sink = CapturingSink(tmp_path / "out")
    flow = Dataflow("guarded", parallelism=1)
    flow.source(TestingSource(range(3000), batch_size=10)).map(Gate(go, 1500, kill=True), name="gate").sink(sink)
    extra: dict[str, Any] = {"executor": "spark", "spark": request.getfixturevalue("spark")} \
        if executor == "spark" else {}
    if executor == "local-tls":
        extra["tls"] = True
    t, box = run_in_thread(lambda: flow.run(checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / "ck"),
                                            restart_delay=0, **extra))
    # on Spark the workers are children of Spark's Python workers, not of this process
    parent = os.getpid() if executor != "spark" else None
    argv = next(iter(wait_for(lambda: workers_of(parent), 60, "the job's workers").values()))
    host, port = address(argv)
    task = flow.compile().tasks[0].id
    # What an attacker can read on the workers' command lines is enough to forge a Hello
    # for the next attempt; queue it (and garbage) on the driver's port before the restart.
    attacks = {
        "forged hello": messages.encode(messages.Hello(task, 1, "127.0.0.1", 9, 1)),
        "forged ack": messages.encode(messages.Ack(1, task, "../../etc/passwd", 1, "0" * 64, 0.0, 0, True)),
        "garbage": b"\xff" * 200,
        "1.5 GiB frame": codec.HEADER.pack(1536 << 20, codec.FrameKind.CONTROL) + b"x" * 1000,
        "trickle": b"A",
    }
    socks = {}
    for name, data in attacks.items():
        s = socket.create_connection((host, port))
        s.sendall(data)
        socks[name] = s
    open(go, "w").close()  # now the worker kills itself: the next attempt meets the impostors
    t.join(90)
    assert not t.is_alive()
    assert "error" not in box, box.get("error")
    res = box["result"]
    assert res.restarts == 1, res
    assert sorted(sink.records()) == list(range(3000))
    for name, s in socks.items():
        got = read_all(s, 10)
        if executor == "local-tls":
            # no TLS from them: at most a TLS alert, not even the challenge
            assert auth.MAGIC not in got and len(got) < 64, (name, got)
        else:
            # the challenge and nothing else: no plan, no code, no peers. Under load a refused
            # connection is sometimes reset (or left unaccepted until the listener closes)
            # before its challenge is read: nothing at all is as good.
            assert got == b"" or (got[:4] == auth.MAGIC and len(got) == auth.CHALLENGE_SIZE), (name, len(got))
        s.close()


def test_a_second_job_and_a_second_resume_on_one_directory_are_refused_naming_the_holder(tmp_path):
    go = str(tmp_path / "go")
    ck = str(tmp_path / "ck")
    sink = CapturingSink(tmp_path / "a")
    first = Dataflow("first")
    first.source(TestingSource(range(500), batch_size=10)).map(Gate(go, 250, kill=False), name="gate").sink(sink)
    t, box = run_in_thread(lambda: first.run(checkpoint_interval=0.05, checkpoint_dir=ck))
    wait_for(lambda: workers_of(os.getpid()), 30, "the first job's workers")
    for resume in (False, True):
        other = Dataflow("second")
        other.source(TestingSource(range(10))).sink(CapturingSink(tmp_path / f"b{resume}"))
        with pytest.raises(CheckpointError) as info:
            other.run(checkpoint_dir=ck, resume=resume)
        assert info.value.reason is CheckpointErrorReason.LOCKED
        assert f"pid {os.getpid()}" in str(info.value) and "'first'" in str(info.value)
    open(go, "w").close()
    t.join(60)
    assert "error" not in box, box.get("error")
    assert sorted(sink.records()) == list(range(500))
    # once the first job has ended, the directory is free again (for a resume)
    again = Dataflow("first")
    again.source(TestingSource(range(500), batch_size=10)).map(Gate(go, 250, kill=False), name="gate").sink(sink)
    assert again.run(checkpoint_dir=ck, resume=True).restored_from


@pytest.mark.parametrize("mode", ["before", "during"])
def test_a_sink_worker_of_a_dead_driver_never_changes_the_output(tmp_path, mode):
    """SIGSTOP the sink as it is about to publish (mode before) or while it holds the fence
    (during), SIGKILL its driver, resume with a new driver, SIGCONT the old sink: the output
    is exactly the records, once each."""
    out, marker, ck = str(tmp_path / "out.txt"), str(tmp_path / "stalled"), str(tmp_path / "ck")
    # "before": a long heartbeat, so that once woken the stale sink reaches its publish
    # (and the fence) before its watchdog notices the driver is gone.
    hb = "60" if mode == "before" else "0.5"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    driver = subprocess.Popen([sys.executable, "-m", "tests.abs_engine.executors.leftover_job",
                               out, marker, mode, ck, hb], cwd=ROOT, env=env)
    try:
        stale = int(wait_for(lambda: os.path.exists(marker) and open(marker).read(), 60, "the sink to stop"))
        wait_for(lambda: (proc_stat(stale) or ("?",))[0] == "T", 10, "SIGSTOP to take effect")
        others = [p for p in workers_of(driver.pid) if p != stale]
    finally:
        driver.kill()
        driver.wait()
    if mode == "during":
        # the other workers notice their driver is gone (watchdog) and exit on their own
        wait_for(lambda: all(gone(p) for p in others), 15, "the dead driver's workers to exit")
    res = build(out, marker, mode).run(checkpoint_interval=0.05, checkpoint_dir=ck, resume=True, restart_delay=0)
    assert res.restored_from
    try:
        os.kill(stale, signal.SIGCONT)
    except ProcessLookupError:
        pass  # "during": the new driver had to kill it to take the fence back
    wait_for(lambda: gone(stale), 20, "the stale sink to exit")
    with open(out) as f:
        lines = f.read().splitlines()
    assert sorted(lines) == sorted(f"r{x}" for x in range(N)), (len(lines), N)
    if mode == "before":
        assert os.path.exists(marker + ".fenced"), "the stale sink never reached the fence"
