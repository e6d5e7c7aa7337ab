"""The fence's killer (checkpoint/fence.py ``advance``): it SIGKILLs a process holding the
fence only if that process is a stale worker of this job, known by its uid and the identity
its launcher put in its environment, never by its command line alone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from abs_engine.checkpoint import fence
from abs_engine.errors import CheckpointError, CheckpointErrorReason

#: Holds the fence's flock until killed; its command line names the worker module, as a
#: stranger's process can too.
HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_SH)
print("held", flush=True)
sys.stdin.read()
"""


def hold(root: str, env: dict[str, str]) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-c", HOLDER, os.path.join(root, fence.FENCE_FILE),
                          "abs_engine.runtime.worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env=dict(os.environ, **env))
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


def test_a_stale_worker_of_this_job_is_killed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    root = str(tmp_path)
    fence.advance(root, "job/run/0")
    stale = hold(root, fence.worker_identity(root, "job/run/0"))
    try:
        assert fence.advance(root, "job/run/1", timeout=0.2) == [stale.pid]
        assert stale.wait(10) == -9
    finally:
        stale.kill()


@pytest.mark.parametrize("who", ["no identity", "another job", "this attempt"])
def test_any_other_holder_is_named_not_killed(tmp_path, who: str) -> None:  # type: ignore[no-untyped-def]
    root = str(tmp_path)
    fence.advance(root, "job/run/0")
    env = {"no identity": {}, "another job": fence.worker_identity(str(tmp_path / "elsewhere"), "job/run/0"),
           "this attempt": fence.worker_identity(root, "job/run/1")}[who]
    other = hold(root, env)
    try:
        with pytest.raises(CheckpointError) as e:
            fence.advance(root, "job/run/1", timeout=0.2)
        assert e.value.reason is CheckpointErrorReason.LOCKED and str(other.pid) in str(e.value)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
