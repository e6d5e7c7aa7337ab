"""Which local directories a job may use for its checkpoints, and making them private.

Checked at start, before the lock is taken or anything is written (``prepare``), each a
``CheckpointError(BAD_DIRECTORY)`` that names the problem and the fix:

- not ``/``, a home directory, or a system directory (``/etc``, ``/tmp``, ...), even empty:
  retention deletes what it thinks are old checkpoints there, and the directory is made
  private;
- a directory, not a file or a link to one elsewhere the user did not name (the path
  given is resolved once, as the user chose it);
- owned by the user running the job, not writable by group or others (another local user
  who can write it can plant, delete or replace checkpoints);
- empty, or holding only what abs-engine writes there (``chk-N`` checkpoints, a job of
  several pipelines' ``pipeline-<name>`` directories, ``_lock``,
  ``_fence``, ``_control``, ``_job_stats.json``, ``savepoints``, ``report.html`` and their
  temporary files): a directory of other files is somebody else's;
- on a writable file system (a read-only mount is refused at once, not at the first
  checkpoint).

Then it is made private: created ``0700`` (an existing one is narrowed to ``0700``), and
everything the engine writes below it is ``0600`` files in ``0700`` directories
(stores.py and safe_io.py, lock.py, fence.py, fs.LocalDir(private=True)), so another local user can read
no record of the job, and cannot take its lock.
"""

from __future__ import annotations

import os
import pwd
import re
import stat

from ..errors import CheckpointError, CheckpointErrorReason

#: Names abs-engine writes at the top of a checkpoint directory (and their temporaries).
ENGINE_NAMES = re.compile(r"^(chk-\d{6,}|pipeline-[A-Za-z0-9_.-]{1,100}|_lock|_fence|_control|_job_stats\.json|savepoints|report\.html"
                          r"|\.tmp-[0-9a-f]{12}-.+|\.report-.+\.html)$")
#: Never a checkpoint directory, however empty.
SYSTEM_DIRS = frozenset({"/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64", "/media", "/mnt", "/opt",
                         "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var", "/var/tmp",
                         "/Users", "/private", "/private/tmp"})
PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600

_R = CheckpointErrorReason


def _homes() -> set[str]:
    homes = {os.path.realpath(os.path.expanduser("~"))}
    try:
        homes.update(os.path.realpath(p.pw_dir) for p in pwd.getpwall() if p.pw_dir not in ("", "/"))
    except OSError:
        pass
    return homes


def _refuse(path: str, why: str, fix: str) -> CheckpointError:
    return CheckpointError(_R.BAD_DIRECTORY, f"checkpoint directory {path} {why}: {fix}")


def prepare(location: str, must_exist: bool = False) -> str:
    """Check ``location`` (a local path) as the module docstring says, create it (0700) or
    narrow it to 0700, and return its real path. ``must_exist``: a missing directory is
    CheckpointError(NOT_FOUND) (``resume=True``: a mistyped path must not start afresh)."""
    path = os.path.realpath(location)
    if path in SYSTEM_DIRS or path in _homes():
        raise _refuse(path, "is a system or home directory",
                      "give the job a directory of its own, e.g. a new subdirectory (checkpoint_dir='ckpt')")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if must_exist:
            raise CheckpointError(_R.NOT_FOUND, f"checkpoint directory {path} does not exist, so there is nothing "
                                                "to resume: check the path, or pass resume='if-present' to start "
                                                "afresh when there are no checkpoints") from None
        return _create(path)
    except OSError as e:
        raise _refuse(path, f"cannot be examined ({e.strerror})", "check the path and its permissions") from None
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, "is not a directory (a file is there)",
                      "pass a directory (it is created if missing), not a file")
    if st.st_uid != os.geteuid():
        raise _refuse(path, f"belongs to another user (uid {st.st_uid})",
                      "use a directory of your own: whoever owns it can plant or delete checkpoints")
    if st.st_mode & 0o022:
        raise _refuse(path, f"can be written by other users (mode {stat.S_IMODE(st.st_mode):04o})",
                      f"make it private (chmod 700 {path}) or use a new directory: another user could plant, "
                      "replace or delete checkpoints")
    foreign = sorted(n for n in os.listdir(path) if not ENGINE_NAMES.match(n))
    if foreign:
        shown = ", ".join(repr(n) for n in foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise _refuse(path, f"holds files that abs-engine did not write ({shown})",
                      "give the job an empty directory of its own (retention deletes checkpoints there, and "
                      "abs-engine makes it private)")
    _check_writable(path)
    if stat.S_IMODE(st.st_mode) != PRIVATE_DIR:
        os.chmod(path, PRIVATE_DIR)  # ours, holding only our files: nobody else reads them
    return path


def _create(path: str) -> str:
    parent = os.path.dirname(path)
    try:
        os.makedirs(parent, exist_ok=True)
        os.mkdir(path, PRIVATE_DIR)
    except FileExistsError:
        return prepare(path)  # made meanwhile: check it as found
    except OSError as e:
        _check_writable(parent if os.path.isdir(parent) else path)
        raise _refuse(path, f"cannot be created ({e.strerror})",
                      "choose a location you can write, or create the directory first") from None
    os.chmod(path, PRIVATE_DIR)  # mkdir's mode is masked by the umask: exactly 0700
    return path


def _check_writable(path: str) -> None:
    try:
        flags = os.statvfs(path).f_flag
    except OSError:
        return
    if flags & os.ST_RDONLY:
        raise _refuse(path, "is on a read-only file system", "choose a location on a writable file system")
    if not os.access(path, os.W_OK | os.X_OK):
        raise _refuse(path, "is not writable by you", "choose a directory you can write")
