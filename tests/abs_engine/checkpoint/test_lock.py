"""DirectoryLock: one job per checkpoint directory, across objects and processes."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from abs_engine.checkpoint.lock import INHERITED_ENV, LOCK_FILE, DirectoryLock, LockHolder
from abs_engine.errors import CheckpointError, CheckpointErrorReason

ROOT = str(Path(__file__).resolve().parents[3])

HOLD = """
import sys
from abs_engine.checkpoint.lock import DirectoryLock
lock = DirectoryLock(sys.argv[1], job="holder-job", job_id="id-1").acquire()
print("locked", flush=True)
sys.stdin.read()  # hold until the parent closes our stdin
"""


def _hold_in_child(d: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, d], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=ROOT)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_two_locks_in_one_process_exclude_each_other(tmp_path):
    d = str(tmp_path / "ck")
    first = DirectoryLock(d, job="first", job_id="a").acquire()
    assert first.held
    with pytest.raises(CheckpointError) as ei:
        DirectoryLock(d, job="second").acquire()
    assert ei.value.reason is CheckpointErrorReason.LOCKED
    msg = str(ei.value)
    assert f"pid {os.getpid()}" in msg and "'first'" in msg and d in msg
    assert "two jobs must not share a checkpoint directory" in msg
    first.release()
    assert not first.held
    first.release()  # idempotent
    with DirectoryLock(d, job="second") as second:
        assert second.held
        holder = second.holder()
        assert holder is not None and holder.job == "second" and holder.pid == os.getpid()
    assert not second.held


def test_lock_excludes_another_process_and_names_its_pid(tmp_path):
    d = str(tmp_path / "ck")
    proc = _hold_in_child(d)
    try:
        with pytest.raises(CheckpointError) as ei:
            DirectoryLock(d, job="me").acquire()
        assert ei.value.reason is CheckpointErrorReason.LOCKED
        assert f"pid {proc.pid} on host" in str(ei.value)
        assert "'holder-job'" in str(ei.value)
        holder = DirectoryLock(d).holder()
        assert holder is not None and (holder.pid, holder.job_id) == (proc.pid, "id-1")
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)
    with DirectoryLock(d, job="me"):  # the holder ended: free
        pass


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    d = str(tmp_path / "ck")
    proc = _hold_in_child(d)
    proc.kill()
    proc.wait(timeout=30)
    with DirectoryLock(d, job="me") as lock:
        assert lock.held


def test_lock_is_not_inherited_by_child_processes(tmp_path):
    """A worker started by the job must not keep the directory locked after the job dies."""
    d = str(tmp_path / "ck")
    script = """
import os, subprocess, sys
from abs_engine.checkpoint.lock import DirectoryLock
DirectoryLock(sys.argv[1], job="parent").acquire()
g = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], close_fds=False)
print(g.pid, flush=True)
os._exit(0)  # dies holding the lock; the grandchild lives on (it reads our parent's pipe)
"""
    proc = subprocess.Popen([sys.executable, "-c", script, d], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=ROOT)
    assert proc.stdout is not None and proc.stdin is not None
    grandchild = int(proc.stdout.readline())
    proc.wait(timeout=30)
    try:
        os.kill(grandchild, 0)  # still alive
        with DirectoryLock(d, job="next") as lock:
            assert lock.held
    finally:
        proc.stdin.close()  # the grandchild reads EOF and exits


def test_lock_fd_is_close_on_exec(tmp_path):
    with DirectoryLock(str(tmp_path)) as lock:
        fd = lock._fd
        assert fd is not None
        assert not os.get_inheritable(fd)
        assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC


def test_holder_info_is_json_and_cleared_on_release(tmp_path):
    d = tmp_path / "ck"
    lock = DirectoryLock(str(d), job="wc", job_id="run-7").acquire()
    holder = LockHolder.from_json((d / LOCK_FILE).read_bytes())
    assert holder is not None
    assert (holder.pid, holder.job, holder.job_id) == (os.getpid(), "wc", "run-7")
    assert holder.host and holder.since > 0 and holder.argv0 == sys.argv[0]
    lock.release()
    assert (d / LOCK_FILE).read_bytes() == b""
    assert (d / LOCK_FILE).exists()  # never unlinked: that would race with another job's open


def test_unreadable_holder_info_still_gives_a_locked_error(tmp_path):
    d = str(tmp_path)
    fd = os.open(os.path.join(d, LOCK_FILE), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a holder that has not written who it is
        with pytest.raises(CheckpointError) as ei:
            DirectoryLock(d).acquire()
        assert ei.value.reason is CheckpointErrorReason.LOCKED
        assert "has not said who" in str(ei.value)
    finally:
        os.close(fd)


@pytest.mark.parametrize("planted", ["symlink", "fifo", "dir"])
def test_planted_lock_file_is_refused(tmp_path, planted):
    d = tmp_path / "ck"
    d.mkdir()
    target = tmp_path / "target"
    target.write_bytes(b"original")
    if planted == "symlink":
        os.symlink(str(target), str(d / LOCK_FILE))
    elif planted == "fifo":
        os.mkfifo(str(d / LOCK_FILE))
    else:
        (d / LOCK_FILE).mkdir()
    with pytest.raises(CheckpointError) as ei:
        DirectoryLock(str(d)).acquire()
    assert ei.value.reason is CheckpointErrorReason.UNSAFE_PATH
    assert target.read_bytes() == b"original"


def test_acquire_twice_on_one_object_is_a_bug(tmp_path):
    with DirectoryLock(str(tmp_path)) as lock:
        with pytest.raises(RuntimeError):
            lock.acquire()


def test_a_driver_adopts_the_lock_its_supervisor_holds_and_leaves_it_held(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A supervised driver does not take the lock anew: it adopts the descriptor its
    supervisor hands down (only one on this very file), and releasing it keeps the
    supervisor's hold, so no other job gets in between two drivers."""
    supervisor = DirectoryLock(str(tmp_path), "job").acquire()
    # what a child inherits: another descriptor of the same open file description
    monkeypatch.setenv(INHERITED_ENV, str(os.dup(supervisor.fileno())))
    driver = DirectoryLock(str(tmp_path), "job").acquire()  # would be LOCKED if it took its own
    assert INHERITED_ENV not in os.environ  # adopted once
    with pytest.raises(CheckpointError) as e:
        DirectoryLock(str(tmp_path), "other").acquire()
    assert e.value.reason is CheckpointErrorReason.LOCKED
    driver.release()
    with pytest.raises(CheckpointError):  # the supervisor still holds it
        DirectoryLock(str(tmp_path), "other").acquire()
    supervisor.release()
    DirectoryLock(str(tmp_path), "other").acquire().release()


def test_a_handed_down_descriptor_of_another_file_is_not_adopted(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    elsewhere = DirectoryLock(str(tmp_path / "a"), "job").acquire()
    monkeypatch.setenv(INHERITED_ENV, str(os.dup(elsewhere.fileno())))
    mine = DirectoryLock(str(tmp_path / "b"), "job").acquire()  # its own lock, not a's
    assert INHERITED_ENV in os.environ  # not consumed
    monkeypatch.delenv(INHERITED_ENV)
    mine.release()
    with pytest.raises(CheckpointError):
        DirectoryLock(str(tmp_path / "a"), "other").acquire()  # a is still held
    elsewhere.release()
