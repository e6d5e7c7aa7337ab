"""Fencing: a process of an older attempt can never change the job's output.

``ROOT/_fence`` (in the checkpoint directory) holds the token of the current attempt. The
driver *advances* it before it starts an attempt's workers; a sink holds the fence
(``Fence.hold()``: an exclusive flock on the file, and a check that the token in it is its
own) around every publish, truncate or delete of output. So:

- a worker of a dead attempt (or of a dead driver) that wakes up later finds a newer token
  under the lock and raises ``FencedOut`` instead of writing: it cannot truncate or append;
- a worker stopped *while* holding the fence (SIGSTOP mid-publish) would block the next
  advance forever: the driver waits a bounded time, then finds the holder in /proc/locks
  and SIGKILLs it if it is a stale worker *of this job* (it belongs to an attempt that no
  longer exists; on this machine it is the only way to take the lock back), else it fails
  with an error naming the process. A stale worker is known by more than its command line:
  it runs as this user, and its environment (set by the launcher when it was started,
  ``/proc/PID/environ``) names this fence directory and a token other than the new one. What the killed worker half-wrote is rolled back by the new
  attempt's restore, which truncates to the committed length under the fence.

Tokens are opaque strings (job id, driver run, attempt); only equality matters.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import time
from typing import Iterator

from ..errors import CheckpointError, CheckpointErrorReason, FencedOut

FENCE_FILE = "_fence"
MAX_TOKEN = 256
WORKER_MODULE = b"abs_engine.runtime.worker"
#: Set in every worker's environment by its launcher: the fence directory and the token of
#: the attempt it was started for (``worker_identity``); how ``advance`` tells a stale
#: worker of this job from any other process.
DIR_ENV = "ABS_ENGINE_FENCE_DIR"
TOKEN_ENV = "ABS_ENGINE_FENCE_TOKEN"
MAX_ENVIRON = 1 << 20  #: bytes of /proc/PID/environ read at most


def worker_identity(root: str, token: str) -> dict[str, str]:
    """The environment entries that identify a worker of attempt ``token`` of the job whose
    fence is in ``root``."""
    return {DIR_ENV: os.path.realpath(root), TOKEN_ENV: token}


def _open(root: str) -> int:
    path = os.path.join(root, FENCE_FILE)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileNotFoundError as e:
        raise CheckpointError(CheckpointErrorReason.NOT_FOUND,
                              f"cannot open the output fence {path}: {e}. This worker runs on a machine "
                              "that does not see the driver's fence directory (the checkpoint directory, or, "
                              "for remote checkpoints, a directory on the driver): sinks that publish files "
                              "from other machines need the checkpoint directory on a shared mount") from e
    except OSError as e:
        raise CheckpointError(CheckpointErrorReason.UNSAFE_PATH,
                              f"cannot open the fence file {path}: {e} (it must be a regular file; "
                              "remove whatever is in its place)") from e
    return fd


def _read_token(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, MAX_TOKEN + 1).decode("utf-8", "replace")


class Fence:
    """A worker's view of the fence: its own token and the directory."""

    def __init__(self, root: str, token: str):
        self.root = root
        self.token = token

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Shared with this attempt's other publishers (they write their own files), exclusive
    of ``advance``, and only if this token is still current."""
        fd = _open(self.root)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # publishers of one attempt run in parallel
            current = _read_token(fd)
            if current != self.token:
                raise FencedOut(f"attempt {self.token!r} was replaced by {current!r}: this process "
                                "must not change the output any more")
            yield
        finally:
            os.close(fd)  # releases the flock


def lock_holders(path: str) -> list[int]:
    """PIDs holding a flock on ``path`` (Linux /proc/locks; empty elsewhere)."""
    try:
        st = os.stat(path)
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read(1 << 20).splitlines()
    except OSError:
        return []
    pids = []
    for line in lines:
        parts = line.split()
        if len(parts) < 6 or parts[1] == "->" or parts[1] != "FLOCK":
            continue
        try:
            pid = int(parts[4])
            inode = int(parts[5].split(":")[-1])
        except ValueError:
            continue
        dev = parts[5].split(":")[:2]
        try:
            same_dev = len(dev) == 2 and os.makedev(int(dev[0], 16), int(dev[1], 16)) == st.st_dev
        except ValueError:
            same_dev = False
        if inode == st.st_ino and same_dev:
            pids.append(pid)
    return pids


def _is_stale_worker(pid: int, root: str, token: str) -> bool:
    """``pid`` is a worker of this job (its fence directory is ``root``) started for an
    attempt other than ``token``'s, running as this user."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            uids = next((ln.split()[1:] for ln in f.read(8192).splitlines() if ln.startswith(b"Uid:")), [])
        if not uids or int(uids[0]) != os.geteuid():
            return False
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if WORKER_MODULE not in f.read(4096):
                return False
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(e.split(b"=", 1) for e in f.read(MAX_ENVIRON).split(b"\0") if b"=" in e)
    except (OSError, ValueError):
        return False
    mine = worker_identity(root, token)
    return (env.get(DIR_ENV.encode()) == mine[DIR_ENV].encode()
            and env.get(TOKEN_ENV.encode()) not in (None, mine[TOKEN_ENV].encode()))


def _take_within(fd: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)  # back-off while the kernel reaps the killed holders


def advance(root: str, token: str, timeout: float = 5.0) -> list[int]:
    """Make ``token`` current (driver side, before an attempt's workers start). Returns the
    PIDs of stale workers it had to kill to take the fence back."""
    path = os.path.join(root, FENCE_FILE)
    fd = _open(root)
    killed: list[int] = []
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                pass
            if time.monotonic() > deadline:
                holders = [p for p in lock_holders(path) if p != os.getpid()]
                stale = [p for p in holders if _is_stale_worker(p, root, token)]
                if not stale or len(stale) < len(holders):
                    raise CheckpointError(
                        CheckpointErrorReason.LOCKED,
                        f"the fence {path} is held by process(es) {holders or 'unknown'} for more than "
                        f"{timeout:g}s, not all of them stale workers of this job: stop them, then run again")
                for pid in stale:
                    try:
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
                    except ProcessLookupError:
                        pass
                if not _take_within(fd, 10.0):  # released by the kernel as the holders die
                    raise CheckpointError(
                        CheckpointErrorReason.LOCKED,
                        f"the fence {path} is still held after killing stale worker(s) {killed}: stop the "
                        "processes holding it, then run again")
                break
            time.sleep(0.01)  # back-off between tries of a lock held by a live publisher
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, token.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    return killed
