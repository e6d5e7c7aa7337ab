"""Where checkpoint bytes live: the primitives ``CheckpointStorage`` (storage.py) needs of a
store, as one interface (``CheckpointStore``), and the local one (``LocalStore``).

Every implementation holds ``ROOT/chk-000042/`` entries, each a set of named files (the
tasks' state and spill files, written by the workers) and, once committed, ``_metadata``.
The retention, verification and choice of checkpoint are storage.py's alone; a store
only moves bytes, and keeps these promises (each method says its own):
- ``put_metadata`` is the commit point: a reader sees the whole document or none of it,
  and once it returns the checkpoint survives a crash of this machine.
- Nothing read is trusted: names from metadata are checked plain before use
  (UNSAFE_PATH), a read is bounded by the recorded size (or MAX_METADATA) before a byte
  is buffered and checked against it and its sha256 before it is returned
  (TOO_LARGE / CHECKSUM_MISMATCH / MISSING_FILE / MISSING_METADATA, the same reasons in
  every store); nothing is followed out of the root.
- A store that cannot be reached raises CheckpointError(UNREACHABLE) from reads and
  listings (never a "missing" that would make a caller fall back); removing is best
  effort (the next prune tries again).

The local store (the bodies safe_io.py's checks serve), with the directory distrusted:
- Anyone who can write the directory can plant files in it: every file and directory is
  opened relative to its parent's descriptor with ``O_NOFOLLOW`` (a symlink is refused,
  never followed), files with ``O_NONBLOCK`` (a FIFO cannot block the open) and must be
  regular files (``fstat``).
- ``_metadata`` is written to an exclusive temp file, fsynced, renamed into place, and
  the checkpoint's directory and the root fsynced.
- Private: checkpoint directories are made 0700 and files 0600 (checkpoint/directory.py
  makes the root 0700), so no other local user reads a record of the job.
- Writes never follow or overwrite what is planted: directories are made with ``mkdir``
  and refused if they are symlinks or not directories; files are created with
  ``O_CREAT | O_EXCL | O_NOFOLLOW``. Removing unlinks a symlinked ``chk-N``, never follows it.
- The root is resolved once (``realpath``, by storage.py): the user chose it; below it,
  no symlink is followed. The low-level functions refuse a symlinked root.
"""

from __future__ import annotations

import os
import shutil
import stat
from typing import Callable, Protocol

from .. import fs
from ..errors import CheckpointError, CheckpointErrorReason
from .safe_io import (DIR_RE, MAX_METADATA, MAX_STATE_FILE, METADATA, METADATA_TMP, check_blob, check_name,
                      chk_name, create_exclusive, open_chk, open_root, read_at, read_local, task_of, unsafe_kind)

_R = CheckpointErrorReason


class CheckpointStore(Protocol):
    """The primitives of a checkpoint store (see the module docstring for the contract)."""

    #: What workers are given to write and read state files (a path, or a URI with its
    #: credentials: sent only over the authenticated control link).
    root: str
    #: How the root appears in messages (never with credentials).
    shown: str

    def dir_of(self, checkpoint_id: int) -> str:
        """Where ``chk-N`` lives, as shown in messages."""
        ...

    def make_root(self) -> None:
        """Make sure the root exists (private); an unreachable store fails here."""
        ...

    def ids(self) -> list[int]:
        """Every ``chk-N`` entry, with or without metadata (anything planted under such a
        name too: verification reports it), ascending; other names are ignored."""
        ...

    def has_metadata(self, checkpoint_id: int) -> bool:
        """Something named ``_metadata`` is in ``chk-N`` (validity is checked on read;
        something planted counts, so that it is reported)."""
        ...

    def put_metadata(self, checkpoint_id: int, doc: bytes) -> str:
        """Make ``doc`` the checkpoint's ``_metadata``, atomically and durably (the commit
        point); never through a link, never over a directory (UNSAFE_PATH). Returns how
        it is shown."""
        ...

    def remove(self, checkpoint_id: int) -> None:
        """Delete ``chk-N`` and everything in it, following nothing; best effort."""
        ...

    def list_files(self, checkpoint_id: int) -> set[str]:
        """The names in ``chk-N`` (empty if there is none or it cannot be listed)."""
        ...

    def retire(self, checkpoint_id: int, keep: set[str]) -> None:
        """``chk-N`` stops being a checkpoint (``_metadata`` goes first) but keeps the files
        named in ``keep``; everything else in it is deleted, nothing followed; best effort."""
        ...

    def read_metadata(self, checkpoint_id: int) -> tuple[bytes, str]:
        """The bytes of ``_metadata`` (at most MAX_METADATA, else TOO_LARGE, unread) and
        how it is shown; MISSING_METADATA if there is none."""
        ...

    def read_file(self, checkpoint_id: int, file: str, size: int, sha256: str,
                  task: str | None = None) -> tuple[bytes, str]:
        """The bytes of state (or spill) file ``file`` of ``chk-N`` and how it is shown:
        ``file`` checked plain (UNSAFE_PATH), ``size`` at most MAX_STATE_FILE, at most
        ``size + 1`` bytes read (more: TOO_LARGE), then length and sha256 checked
        (CHECKSUM_MISMATCH); MISSING_FILE if it is not there (the local store says
        MISSING_METADATA when all of ``chk-N`` is gone). ``task`` names the file's task in
        messages (by default, the file name without ``.state``)."""
        ...


def missing(name: str, what: str, checkpoint_id: int) -> CheckpointError:
    """What a store without descriptors raises for a file that is not there."""
    return CheckpointError(_R.MISSING_METADATA if name == METADATA else _R.MISSING_FILE, f"{what} is missing",
                           checkpoint_id)


def read_verified(read: Callable[[int, str], bytes], checkpoint_id: int, file: str, size: int, sha256: str,
                  shown: str, task: str | None = None) -> bytes:
    """``read_file``'s checks around a store's bounded read (``read(limit, what)``: the
    bytes, at most ``limit``, or a CheckpointError) for stores without descriptors."""
    what = f"checkpoint {checkpoint_id}: state file of task {task or task_of(file)} ({shown})"
    check_name(file, what, checkpoint_id)
    if size > MAX_STATE_FILE:
        raise CheckpointError(_R.TOO_LARGE, f"{what} is recorded as {size:,} bytes, more than the maximum of "
                              f"{MAX_STATE_FILE:,}: the metadata is not trustworthy; delete the checkpoint",
                              checkpoint_id)
    data = read(size, what)
    check_blob(data, size, sha256, what, checkpoint_id)
    return data


class LocalStore:
    """Checkpoints in a local directory, distrusted (the module docstring)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.shown = root

    def dir_of(self, checkpoint_id: int) -> str:
        return os.path.join(self.root, chk_name(checkpoint_id))

    def make_root(self) -> None:
        fs.LocalDir(self.root, private=True).make_root()

    def ids(self) -> list[int]:
        if not os.path.isdir(self.root):
            return []
        ids = [int(m.group(1)) for n in os.listdir(self.root) if (m := DIR_RE.match(n))]
        return sorted(ids)

    def has_metadata(self, checkpoint_id: int) -> bool:
        d = self.dir_of(checkpoint_id)
        if unsafe_kind(d) is not None:
            return os.path.islink(d)  # a planted link is a candidate, reported as UNSAFE_PATH
        return os.path.lexists(os.path.join(d, METADATA))

    def put_metadata(self, checkpoint_id: int, doc: bytes) -> str:
        """Written to an exclusive temp file, fsynced, renamed into place, the directories fsynced."""
        cid = checkpoint_id
        d = self.dir_of(cid)
        chk_fd = open_chk(self.root, cid, create=True)
        try:
            try:
                os.unlink(METADATA_TMP, dir_fd=chk_fd)  # a stale temp (or a link: removed, not followed)
            except FileNotFoundError:
                pass
            except IsADirectoryError:
                raise CheckpointError(_R.UNSAFE_PATH, f"{os.path.join(d, METADATA_TMP)} is a directory: remove it",
                                      cid) from None
            create_exclusive(chk_fd, METADATA_TMP, doc, os.path.join(d, METADATA_TMP), cid)
            try:
                os.replace(METADATA_TMP, METADATA, src_dir_fd=chk_fd, dst_dir_fd=chk_fd)
            except IsADirectoryError:
                raise CheckpointError(_R.UNSAFE_PATH, f"{os.path.join(d, METADATA)} is a directory: remove it",
                                      cid) from None
            os.fsync(chk_fd)
        finally:
            os.close(chk_fd)
        root_fd = open_root(self.root)
        try:
            os.fsync(root_fd)  # the chk-N entry itself must survive a power loss
        finally:
            os.close(root_fd)
        return os.path.join(d, METADATA)

    def remove(self, checkpoint_id: int) -> None:
        """A link or file is unlinked (never followed), a directory removed with rmtree
        (which does not follow links inside it)."""
        d = self.dir_of(checkpoint_id)
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(d, ignore_errors=True)
        else:
            try:
                os.unlink(d)
            except OSError:
                pass

    def list_files(self, checkpoint_id: int) -> set[str]:
        try:
            return set(os.listdir(self.dir_of(checkpoint_id)))
        except OSError:
            return set()

    def retire(self, checkpoint_id: int, keep: set[str]) -> None:
        """A planted link or file is removed (nothing of ours is behind it); in a real
        directory, files are unlinked below its descriptor and the directory fsynced."""
        try:
            chk_fd = open_chk(self.root, checkpoint_id)
        except CheckpointError:
            self.remove(checkpoint_id)  # a planted link or file: nothing of ours is behind it
            return
        try:
            names = os.listdir(chk_fd)
            for name in sorted(names, key=lambda n: n != METADATA):  # _metadata first
                if name in keep:
                    continue
                try:
                    os.unlink(name, dir_fd=chk_fd)
                except IsADirectoryError:
                    shutil.rmtree(os.path.join(self.dir_of(checkpoint_id), name), ignore_errors=True)
                except OSError:
                    pass
            os.fsync(chk_fd)
        finally:
            os.close(chk_fd)

    def read_metadata(self, checkpoint_id: int) -> tuple[bytes, str]:
        """Read below the checkpoint directory's descriptor: no link followed, a FIFO never waited on."""
        path = os.path.join(self.dir_of(checkpoint_id), METADATA)
        try:
            chk_fd = open_chk(self.root, checkpoint_id)
            try:
                raw = read_at(chk_fd, METADATA, None, MAX_METADATA, f"checkpoint {checkpoint_id}: metadata {path}",
                               checkpoint_id)
            finally:
                os.close(chk_fd)
        except CheckpointError as e:
            if e.reason in (_R.NOT_FOUND, _R.MISSING_FILE):  # no directory, or no _metadata in it
                raise CheckpointError(_R.MISSING_METADATA, f"checkpoint {checkpoint_id} has no metadata ({e})",
                                      checkpoint_id) from None
            raise
        return raw, path

    def read_file(self, checkpoint_id: int, file: str, size: int, sha256: str,
                  task: str | None = None) -> tuple[bytes, str]:
        return read_local(self.root, checkpoint_id, file, size, sha256, task)
