"""Safe local I/O below a checkpoint root that is not trusted: plain names only, every file
and directory opened relative to its parent with O_NOFOLLOW (a symlink is refused, never
followed), files opened O_NONBLOCK and required to be regular, reads bounded by a recorded
size, writes that create exclusively (never over what is planted) and fsync. Reading and
writing task state files with these checks. See checkpoint/stores.py (the local store)
for the invariants.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat

from ..errors import CheckpointError, CheckpointErrorReason
from .incremental import ChainRef, load_chain
from .snapshot_file import TaskSnapshotData

METADATA = "_metadata"
METADATA_TMP = METADATA + ".tmp"
MAGIC = "abs-engine-checkpoint"
FORMAT_VERSION = 2  #: written when a checkpoint has incremental chains (1 otherwise: older engines read it)
READ_VERSIONS = (1, 2)
MAX_METADATA = 16 << 20  #: bytes; a metadata file larger than this is refused unread
MAX_STATE_FILE = 4 << 30  #: bytes; the largest state file a checkpoint may reference
DIR_RE = re.compile(r"^chk-(\d{6,})$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
CHUNK = 1 << 20

_R = CheckpointErrorReason


def chk_name(checkpoint_id: int) -> str:
    """The directory name of a checkpoint: ``chk-000042``."""
    return f"chk-{checkpoint_id:06d}"


# ---- names ------------------------------------------------------------------------------


def is_plain_name(name: object) -> bool:
    """A file name that stays inside its directory: no separator, not ``.``/``..``, no NUL,
    not absolute, no leading dot (hidden files are never ours)."""
    return (
        isinstance(name, str)
        and name != ""
        and not name.startswith(".")
        and "/" not in name
        and "\\" not in name
        and "\x00" not in name
        and not os.path.isabs(name)
    )


def check_name(name: object, where: str, checkpoint_id: int | None = None) -> str:
    """``name`` if it is a plain file name, else CheckpointError(UNSAFE_PATH)."""
    if not is_plain_name(name):
        raise CheckpointError(
            _R.UNSAFE_PATH,
            f"{where}: file name {name!r} is not a plain file name (it contains a path separator, "
            "is '.'/'..', absolute, hidden or empty) and would reach outside the checkpoint directory; "
            "the checkpoint was tampered with or written by something else: delete it",
            checkpoint_id,
        )
    assert isinstance(name, str)
    return name


# ---- descriptors ------------------------------------------------------------------------


def unsafe_kind(path: str, dir_fd: int | None = None) -> str | None:
    """Why ``path`` (lstat, relative to dir_fd) is not a real directory, or None if it is."""
    try:
        st = os.lstat(path, dir_fd=dir_fd)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    return None


def open_dir(path: str, shown: str, checkpoint_id: int | None = None, dir_fd: int | None = None) -> int:
    """A descriptor of a real directory (not a symlink). FileNotFoundError passes through."""
    try:
        return os.open(path, DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as e:
        kind = unsafe_kind(path, dir_fd)
        if kind is not None or e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise CheckpointError(
                _R.UNSAFE_PATH,
                f"{shown} is {kind or 'not a real directory'}: checkpoint directories must be real "
                "directories, never links; remove it (it was not made by abs-engine)",
                checkpoint_id,
            ) from None
        raise CheckpointError(_R.MISSING_FILE, f"cannot open directory {shown}: {e}", checkpoint_id) from e


def open_root(root: str) -> int:
    try:
        return open_dir(root, f"checkpoint directory {root}")
    except FileNotFoundError:
        raise CheckpointError(_R.NOT_FOUND, f"checkpoint directory {root} does not exist") from None


def open_chk(root: str, checkpoint_id: int, create: bool = False) -> int:
    """A descriptor of ``root/chk-N``: opened below a descriptor of the root, refusing
    symlinks at both levels. With ``create`` it is made first if missing (and the root
    fsynced, so the entry survives a power loss)."""
    root_fd = open_root(root)
    name = chk_name(checkpoint_id)
    shown = os.path.join(root, name)
    try:
        if create:
            try:
                os.mkdir(name, 0o700, dir_fd=root_fd)
                os.fsync(root_fd)
            except FileExistsError:
                pass  # another task made it; checked below like anything found on disk
        try:
            return open_dir(name, f"checkpoint {checkpoint_id} directory {shown}", checkpoint_id, root_fd)
        except FileNotFoundError:
            raise CheckpointError(_R.MISSING_METADATA,
                                  f"checkpoint {checkpoint_id} has no metadata: {shown} does not exist",
                                  checkpoint_id) from None
    finally:
        os.close(root_fd)


def read_at(dir_fd: int, name: str, size: int | None, max_size: int, shown: str,
             checkpoint_id: int | None) -> bytes:
    """The bytes of regular file ``name`` below ``dir_fd``: never follows a symlink, never
    blocks on a FIFO, reads at most ``size + 1`` (or ``max_size + 1``) bytes."""
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise CheckpointError(_R.MISSING_FILE, f"{shown} is missing", checkpoint_id) from None
    except OSError as e:
        try:
            link = stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
        except OSError:
            link = False
        if link or e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise CheckpointError(
                _R.UNSAFE_PATH,
                f"{shown} is {'a symbolic link' if link else 'not a regular file'}: abs-engine writes regular "
                "files only, so it was planted; remove it (the checkpoint is unusable)",
                checkpoint_id,
            ) from None
        raise CheckpointError(_R.MISSING_FILE, f"cannot open {shown}: {e}", checkpoint_id) from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(
                _R.UNSAFE_PATH,
                f"{shown} is not a regular file (a FIFO, device, socket or directory): abs-engine writes "
                "regular files only, so it was planted; remove it (the checkpoint is unusable)",
                checkpoint_id,
            )
        if size is not None and size > max_size:
            raise CheckpointError(
                _R.TOO_LARGE,
                f"{shown} is recorded as {size:,} bytes, more than the maximum of {max_size:,}: "
                "the metadata is not trustworthy; delete the checkpoint",
                checkpoint_id,
            )
        limit = max_size if size is None else size
        if st.st_size > limit:
            raise too_large(shown, st.st_size, limit, size is None, checkpoint_id)
        cap = limit if size is not None else st.st_size  # what we expect to read
        buf = bytearray(cap + 1)
        got = 0
        with memoryview(buf) as view:
            while got <= cap:
                n = os.readv(fd, [view[got : min(got + CHUNK, cap + 1)]])
                if n == 0:
                    break
                got += n
        if got > cap:  # it grew after the fstat: being rewritten, or not a plain file after all
            raise too_large(shown, got, cap, size is None, checkpoint_id)
        del buf[got:]
        return bytes(buf)
    finally:
        os.close(fd)


def too_large(shown: str, actual: int, limit: int, is_max: bool, checkpoint_id: int | None) -> CheckpointError:
    if is_max:
        why = f"holds {actual:,}+ bytes, more than the maximum of {limit:,} (or it grew while being read)"
    else:
        why = f"fails its checksum: it holds {actual:,}+ bytes, more than the {limit:,} recorded in the metadata"
    return CheckpointError(
        _R.TOO_LARGE,
        f"{shown} {why}; it was changed after the checkpoint was taken: the checkpoint is unusable "
        "(an older one is used if there is one)",
        checkpoint_id,
    )


def read_checked(directory: str, name: str, size: int | None, max_size: int,
                 checkpoint_id: int | None = None) -> bytes:
    """The bytes of the plain file ``name`` in ``directory``, read safely.

    Refuses (CheckpointError): a name that is not plain (UNSAFE_PATH); a directory or file
    that is a symlink, a file that is not regular (UNSAFE_PATH); a missing file
    (MISSING_FILE); a file larger than ``size`` (or ``max_size`` when ``size`` is None:
    TOO_LARGE); a file shorter than ``size`` (CHECKSUM_MISMATCH). Never blocks on a FIFO
    and never reads more than ``size + 1`` bytes."""
    shown = os.path.join(directory, str(name))
    check_name(name, shown, checkpoint_id)
    try:
        dir_fd = open_dir(directory, f"directory {directory}", checkpoint_id)
    except FileNotFoundError:
        raise CheckpointError(_R.MISSING_FILE, f"{shown} is missing (no directory {directory})",
                              checkpoint_id) from None
    try:
        data = read_at(dir_fd, name, size, max_size, shown, checkpoint_id)
    finally:
        os.close(dir_fd)
    check_length(data, size, shown, checkpoint_id)
    return data


def check_length(data: bytes, size: int | None, shown: str, checkpoint_id: int | None) -> None:
    if size is not None and len(data) != size:
        raise CheckpointError(
            _R.CHECKSUM_MISMATCH,
            f"{shown} fails its checksum: {len(data):,} bytes, expected {size:,} (truncated); "
            "the checkpoint is unusable (an older one is used if there is one)",
            checkpoint_id,
        )


def verified_blob(chk_fd: int, shown_dir: str, task: str, name: str, size: int, sha256: str,
                   checkpoint_id: int) -> bytes:
    shown = os.path.join(shown_dir, name)
    what = f"checkpoint {checkpoint_id}: state file of task {task} ({shown})"
    check_name(name, what, checkpoint_id)
    data = read_at(chk_fd, name, size, MAX_STATE_FILE, what, checkpoint_id)
    check_blob(data, size, sha256, what, checkpoint_id)
    return data


def check_blob(data: bytes, size: int, sha256: str, what: str, checkpoint_id: int) -> None:
    """CHECKSUM_MISMATCH unless ``data`` has the recorded length and sha256."""
    check_length(data, size, what, checkpoint_id)
    if hashlib.sha256(data).hexdigest() != sha256:
        raise CheckpointError(
            _R.CHECKSUM_MISMATCH,
            f"{what} fails its checksum (sha256 differs, {len(data):,} bytes): it was damaged after "
            "the checkpoint was taken; the checkpoint is unusable (an older one is used if there is one)",
            checkpoint_id,
        )


# ---- state files ----------------------------------------------------------------------------


def task_of(file: str) -> str:
    """How a state file names its task in messages when the caller does not: its name
    without ``.state``."""
    return file[: -len(".state")] if file.endswith(".state") else file


def read_local(root: str, checkpoint_id: int, file: str, size: int, sha256: str,
               task: str | None = None) -> tuple[bytes, str]:
    """The verified bytes of state file ``file`` of checkpoint ``checkpoint_id`` (of
    ``task``, as messages say), and its path."""
    shown_dir = os.path.join(root, chk_name(checkpoint_id))
    chk_fd = open_chk(root, checkpoint_id)
    try:
        return (verified_blob(chk_fd, shown_dir, task or task_of(file), file, size, sha256, checkpoint_id),
                os.path.join(shown_dir, file))
    finally:
        os.close(chk_fd)


def load_task_snapshot(checkpoint_dir_root: str, checkpoint_id: int, entry_file: str, size: int,
                       sha256: str, chain: list[ChainRef] | None = None) -> TaskSnapshotData:
    """One task's snapshot, for a worker restoring it: the state file ``entry_file`` of
    checkpoint ``checkpoint_id`` under the checkpoint root (and the files of its incremental
    ``chain``), each read with every check (plain name, no symlinked root/chk dir/file,
    regular file, bounded by its size), compared with its sha256, decoded and resolved.
    Raises CheckpointError, never OSError or a msgpack error."""
    return load_chain(lambda cid, f, n, sha: read_local(checkpoint_dir_root, cid, f, n, sha), checkpoint_id,
                      (entry_file, size, sha256), chain or [])


# ---- writing helpers ----------------------------------------------------------------------


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def create_exclusive(dir_fd: int, name: str, data: bytes, shown: str, checkpoint_id: int) -> None:
    """Create ``name`` below ``dir_fd`` (never following or overwriting anything already
    there), write ``data`` and fsync it. A partial file is removed on failure."""
    try:
        fd = os.open(name, CREATE_FLAGS, 0o600, dir_fd=dir_fd)
    except FileExistsError:
        raise CheckpointError(
            _R.UNSAFE_PATH,
            f"{shown} already exists (a file or link that abs-engine did not write in this attempt): "
            "it is never overwritten or followed; another job may be writing this checkpoint directory, "
            "use a directory of your own",
            checkpoint_id,
        ) from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise CheckpointError(_R.UNSAFE_PATH, f"{shown} is a symbolic link: remove it", checkpoint_id) from None
        raise
    try:
        write_all(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(name, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    os.close(fd)


def write_state_file(root: str, checkpoint_id: int, name: str, blob: bytes) -> str:
    """Write a task's state file ``root/chk-N/name`` and return its path.

    ``chk-N`` is created if missing and refused if it is a symlink or not a directory; the
    file is created exclusively (a planted file or symlink is an UNSAFE_PATH error, never
    followed or overwritten), fsynced, and then the directory is fsynced."""
    shown_dir = os.path.join(root, chk_name(checkpoint_id))
    shown = os.path.join(shown_dir, str(name))
    check_name(name, f"checkpoint {checkpoint_id}: state file {shown}", checkpoint_id)
    chk_fd = open_chk(root, checkpoint_id, create=True)
    try:
        create_exclusive(chk_fd, name, blob, shown, checkpoint_id)
        os.fsync(chk_fd)  # the new directory entry
    finally:
        os.close(chk_fd)
    return shown


