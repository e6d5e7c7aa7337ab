"""The checkpoint directory lock: one job at a time per checkpoint directory.

A job holds ``ROOT/_lock`` for its whole life (``DirectoryLock``). Invariants:
- The lock is ``flock(LOCK_EX | LOCK_NB)`` on an open file description: it is held until
  released or until the process dies (the kernel drops it; no stale lock survives a
  SIGKILL). Two ``DirectoryLock`` objects exclude each other even in one process.
- The lock file is 0600 (another local user can neither read who holds it nor take an
  flock on it to keep the job out), and opened with ``O_NOFOLLOW`` (a planted symlink is refused, never
  followed) and ``O_CLOEXEC``, so worker processes the job starts do not inherit it.
- The holder writes JSON about itself (pid, host, job name, job id, start time, argv[0])
  into the file and fsyncs it; a job that finds the directory locked reads that (bounded)
  and names the holder in its error (CheckpointError(LOCKED)).
- The file is never deleted: unlinking a lock file races with another job's open.
- A supervised driver (executors/supervisor.py) does not take the lock: it adopts the one
  its supervisor holds, an open file description it inherits (its number in
  ``INHERITED_ENV``), so that between a crashed driver and its successor no other job can
  take the directory. Releasing an adopted lock only closes the driver's descriptor: the
  supervisor still holds it.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import stat
import sys
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from ..errors import CheckpointError, CheckpointErrorReason

LOCK_FILE = "_lock"
MAX_HOLDER_INFO = 64 << 10  #: bytes of holder JSON read at most
#: Set by a supervisor in its driver's environment: the inherited descriptor of the lock.
INHERITED_ENV = "ABS_ENGINE_LOCK_FD"

_R = CheckpointErrorReason


@dataclass(frozen=True)
class LockHolder:
    """Who holds (or held) a checkpoint directory."""

    pid: int
    host: str
    job: str
    job_id: str
    since: float  #: time.time() when the lock was taken
    argv0: str

    def to_json(self) -> bytes:
        return json.dumps({"pid": self.pid, "host": self.host, "job": self.job, "job_id": self.job_id,
                           "since": self.since, "argv0": self.argv0}).encode()

    @staticmethod
    def from_json(data: bytes) -> "LockHolder | None":
        """The holder from the lock file's bytes, or None if they do not parse (the holder
        is still writing them, or the file was damaged)."""
        try:
            d: Any = json.loads(data.decode("utf-8"))
            if not isinstance(d, dict):
                return None
            pid, since = d.get("pid"), d.get("since")
            if not isinstance(pid, int) or not isinstance(since, (int, float)):
                return None
            return LockHolder(pid, str(d.get("host", "?")), str(d.get("job", "?")), str(d.get("job_id", "")),
                              float(since), str(d.get("argv0", "?")))
        except (UnicodeDecodeError, ValueError):
            return None

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"job {self.job!r} (pid {self.pid} on host {self.host} since {when})"


class DirectoryLock:
    """Exclusive use of a checkpoint directory for the life of a job.

    ``acquire()`` (or ``with DirectoryLock(...)``) raises CheckpointError(LOCKED), naming the
    holder, if another job (or another DirectoryLock) holds it; UNSAFE_PATH if ``_lock`` is
    a symlink or not a regular file."""

    def __init__(self, root: str, job: str = "", job_id: str = ""):
        self.root = os.path.realpath(root)
        self.path = os.path.join(self.root, LOCK_FILE)
        self.job = job
        self.job_id = job_id
        self._fd: int | None = None
        self._adopted = False

    def restamp(self) -> None:
        """Say again that this process holds the lock (a supervisor, once its driver, which
        wrote its own pid there, has ended)."""
        _stamp(self.fileno(), self.job, self.job_id)

    def fileno(self) -> int:
        """The descriptor the lock is held on (a supervisor hands it to its driver)."""
        if self._fd is None:
            raise RuntimeError(f"lock {self.path} is not held")
        return self._fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> "DirectoryLock":
        if self._fd is not None:
            raise RuntimeError(f"lock {self.path} is already held by this object")
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        inherited = self._inherited()
        fd = inherited if inherited is not None else self._open()
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = LockHolder.from_json(_read_bounded(fd))
                who = holder.describe() if holder else "another job (it has not said who yet)"
                raise CheckpointError(
                    _R.LOCKED,
                    f"checkpoint directory {self.root} is in use by {who}: wait for it to end, or stop it; "
                    "two jobs must not share a checkpoint directory",
                ) from None
            _stamp(fd, self.job, self.job_id)
        except BaseException:
            os.close(fd)  # also drops the flock if we took it (not an adopted one: the supervisor holds it)
            raise
        self._fd = fd
        self._adopted = inherited is not None
        return self

    def _inherited(self) -> int | None:
        """The descriptor of this directory's lock that a supervisor handed down, if any
        (and only if it is this very file: same device and inode)."""
        value = os.environ.get(INHERITED_ENV, "")
        if not value.isdigit():
            return None
        fd = int(value)
        try:
            mine, here = os.fstat(fd), os.lstat(self.path)
        except OSError:
            return None
        if not stat.S_ISREG(mine.st_mode) or (mine.st_dev, mine.st_ino) != (here.st_dev, here.st_ino):
            return None
        del os.environ[INHERITED_ENV]  # adopted once, by this lock
        os.set_inheritable(fd, False)  # the driver's workers must not hold it
        return fd

    def _open(self) -> int:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags, 0o600)
        except OSError as e:
            if os.path.islink(self.path) or os.path.isdir(self.path):
                raise CheckpointError(
                    _R.UNSAFE_PATH,
                    f"lock file {self.path} is {'a symbolic link' if os.path.islink(self.path) else 'a directory'}: "
                    "abs-engine never follows links in a checkpoint directory; remove it",
                ) from None
            raise CheckpointError(_R.LOCKED, f"cannot open lock file {self.path}: {e}; "
                                  "check the checkpoint directory's permissions") from e
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise CheckpointError(_R.UNSAFE_PATH, f"lock file {self.path} is not a regular file (planted?): remove it")
        return fd

    def holder(self) -> LockHolder | None:
        """Who holds the lock now, as written in the lock file (None if unreadable)."""
        if self._fd is not None:
            return LockHolder.from_json(_read_bounded(self._fd))
        try:
            fd = self._open()
        except (CheckpointError, OSError):
            return None
        try:
            return LockHolder.from_json(_read_bounded(fd))
        finally:
            os.close(fd)

    def release(self) -> None:
        """Give the directory up (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if self._adopted:
            os.close(fd)  # the supervisor's description keeps the lock (and its holder info)
            return
        try:
            os.ftruncate(fd, 0)  # no stale holder info for the next reader
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> "DirectoryLock":
        return self.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def _stamp(fd: int, job: str, job_id: str) -> None:
    me = LockHolder(os.getpid(), socket.gethostname(), job, job_id, time.time(), sys.argv[0] if sys.argv else "")
    os.ftruncate(fd, 0)
    os.pwrite(fd, me.to_json(), 0)
    os.fsync(fd)


def _read_bounded(fd: int) -> bytes:
    return os.pread(fd, MAX_HOLDER_INFO, 0)
