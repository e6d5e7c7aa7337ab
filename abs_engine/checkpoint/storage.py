"""Durable checkpoint storage on a file system, with the directory distrusted.

Layout: ``DIR/chk-000042/`` holds one ``<task>.<tag>.state`` msgpack file per task (the tag names
the attempt that wrote it) (written by
the workers) and ``_metadata`` (written by the coordinator, last); ``DIR/_lock`` is the
job's directory lock (see lock.py). Invariants:
- A checkpoint exists iff its ``_metadata`` is present and valid. The metadata is written
  to a temp file, fsynced, renamed into place, and the directory fsynced.
- The metadata carries size and sha256 of every state file it references and a sha256 of
  itself; ``verify`` checks all of them, and decodes every state file, before anything is
  restored. A checkpoint that fails any check is skipped by ``latest_valid``.
- No pickle: every file is msgpack.
- Anyone who can write the directory can plant files in it, so nothing found there is
  trusted: names read from metadata must be plain file names (no separator, no ``..``,
  not absolute, no leading dot); every file and directory is opened relative to its
  parent's descriptor with ``O_NOFOLLOW`` (a symlink is refused, never followed), files
  with ``O_NONBLOCK`` (a FIFO cannot block the open) and must be regular files
  (``fstat``); reads are bounded by the recorded size (or ``MAX_METADATA``), so a file
  that grows, or a device, cannot exhaust memory.
- Private: checkpoint directories are made 0700 and files 0600 (checkpoint/directory.py
  makes the root 0700), so no other local user reads a record of the job.
- Writes never follow or overwrite what is planted: directories are made with ``mkdir``
  and refused if they are symlinks or not directories; files are created with
  ``O_CREAT | O_EXCL | O_NOFOLLOW``. Pruning unlinks a symlinked ``chk-N``, never follows it.
- The root given to ``CheckpointStorage`` is resolved once (``realpath``): the user chose
  it; below it, no symlink is followed. The low-level functions refuse a symlinked root.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import stat
import time
from dataclasses import dataclass, field
from typing import Any

from .. import codec
from ..errors import CheckpointError, CheckpointErrorReason
from . import spill
from .incremental import ChainRef, load_chain, merge, referenced
from .snapshot_file import TaskSnapshotData, decode_snapshot, decode_state

METADATA = "_metadata"
METADATA_TMP = METADATA + ".tmp"
MAGIC = "abs-engine-checkpoint"
FORMAT_VERSION = 2  #: written when a checkpoint has incremental chains (1 otherwise: older engines read it)
READ_VERSIONS = (1, 2)
MAX_METADATA = 16 << 20  #: bytes; a metadata file larger than this is refused unread
MAX_STATE_FILE = 4 << 30  #: bytes; the largest state file a checkpoint may reference
_DIR_RE = re.compile(r"^chk-(\d{6,})$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20

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


def _unsafe_kind(path: str, dir_fd: int | None = None) -> str | None:
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


def _open_dir(path: str, shown: str, checkpoint_id: int | None = None, dir_fd: int | None = None) -> int:
    """A descriptor of a real directory (not a symlink). FileNotFoundError passes through."""
    try:
        return os.open(path, _DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as e:
        kind = _unsafe_kind(path, dir_fd)
        if kind is not None or e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise CheckpointError(
                _R.UNSAFE_PATH,
                f"{shown} is {kind or 'not a real directory'}: checkpoint directories must be real "
                "directories, never links; remove it (it was not made by abs-engine)",
                checkpoint_id,
            ) from None
        raise CheckpointError(_R.MISSING_FILE, f"cannot open directory {shown}: {e}", checkpoint_id) from e


def _open_root(root: str) -> int:
    try:
        return _open_dir(root, f"checkpoint directory {root}")
    except FileNotFoundError:
        raise CheckpointError(_R.NOT_FOUND, f"checkpoint directory {root} does not exist") from None


def _open_chk(root: str, checkpoint_id: int, create: bool = False) -> int:
    """A descriptor of ``root/chk-N``: opened below a descriptor of the root, refusing
    symlinks at both levels. With ``create`` it is made first if missing (and the root
    fsynced, so the entry survives a power loss)."""
    root_fd = _open_root(root)
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
            return _open_dir(name, f"checkpoint {checkpoint_id} directory {shown}", checkpoint_id, root_fd)
        except FileNotFoundError:
            raise CheckpointError(_R.MISSING_METADATA,
                                  f"checkpoint {checkpoint_id} has no metadata: {shown} does not exist",
                                  checkpoint_id) from None
    finally:
        os.close(root_fd)


def _read_at(dir_fd: int, name: str, size: int | None, max_size: int, shown: str,
             checkpoint_id: int | None) -> bytes:
    """The bytes of regular file ``name`` below ``dir_fd``: never follows a symlink, never
    blocks on a FIFO, reads at most ``size + 1`` (or ``max_size + 1``) bytes."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
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
            raise _too_large(shown, st.st_size, limit, size is None, checkpoint_id)
        cap = limit if size is not None else st.st_size  # what we expect to read
        buf = bytearray(cap + 1)
        got = 0
        with memoryview(buf) as view:
            while got <= cap:
                n = os.readv(fd, [view[got : min(got + _CHUNK, cap + 1)]])
                if n == 0:
                    break
                got += n
        if got > cap:  # it grew after the fstat: being rewritten, or not a plain file after all
            raise _too_large(shown, got, cap, size is None, checkpoint_id)
        del buf[got:]
        return bytes(buf)
    finally:
        os.close(fd)


def _too_large(shown: str, actual: int, limit: int, is_max: bool, checkpoint_id: int | None) -> CheckpointError:
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
        dir_fd = _open_dir(directory, f"directory {directory}", checkpoint_id)
    except FileNotFoundError:
        raise CheckpointError(_R.MISSING_FILE, f"{shown} is missing (no directory {directory})",
                              checkpoint_id) from None
    try:
        data = _read_at(dir_fd, name, size, max_size, shown, checkpoint_id)
    finally:
        os.close(dir_fd)
    _check_length(data, size, shown, checkpoint_id)
    return data


def _check_length(data: bytes, size: int | None, shown: str, checkpoint_id: int | None) -> None:
    if size is not None and len(data) != size:
        raise CheckpointError(
            _R.CHECKSUM_MISMATCH,
            f"{shown} fails its checksum: {len(data):,} bytes, expected {size:,} (truncated); "
            "the checkpoint is unusable (an older one is used if there is one)",
            checkpoint_id,
        )


def _verified_blob(chk_fd: int, shown_dir: str, task: str, name: str, size: int, sha256: str,
                   checkpoint_id: int) -> bytes:
    shown = os.path.join(shown_dir, name)
    what = f"checkpoint {checkpoint_id}: state file of task {task} ({shown})"
    check_name(name, what, checkpoint_id)
    data = _read_at(chk_fd, name, size, MAX_STATE_FILE, what, checkpoint_id)
    check_blob(data, size, sha256, what, checkpoint_id)
    return data


def check_blob(data: bytes, size: int, sha256: str, what: str, checkpoint_id: int) -> None:
    """CHECKSUM_MISMATCH unless ``data`` has the recorded length and sha256."""
    _check_length(data, size, what, checkpoint_id)
    if hashlib.sha256(data).hexdigest() != sha256:
        raise CheckpointError(
            _R.CHECKSUM_MISMATCH,
            f"{what} fails its checksum (sha256 differs, {len(data):,} bytes): it was damaged after "
            "the checkpoint was taken; the checkpoint is unusable (an older one is used if there is one)",
            checkpoint_id,
        )


# ---- metadata -----------------------------------------------------------------------------


@dataclass(frozen=True)
class FileEntry:
    file: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Metadata:
    checkpoint_id: int
    job: str
    fingerprint: str
    created: float
    final: bool
    tasks: dict[str, FileEntry]
    alignment_ms: dict[str, float]
    duration_ms: float
    #: Identity of the job run that took it ("" when unknown, e.g. older files).
    job_id: str = field(default="", kw_only=True)
    #: The plan's layout (Plan.layout(): its shape, each operator's tasks in subtask order):
    #: what restoring at another parallelism needs; {} in older files (no rescaling from them).
    layout: dict[str, Any] = field(default_factory=dict, kw_only=True)
    #: task -> the files of earlier checkpoints its state file builds on, oldest first
    #: (incremental checkpoints: checkpoint/incremental.py); absent for a full file.
    chains: dict[str, list[ChainRef]] = field(default_factory=dict, kw_only=True)
    #: task -> records in flight on its regular inputs that its state file holds (an
    #: unaligned checkpoint's channel state); absent when none.
    channel_state: dict[str, int] = field(default_factory=dict, kw_only=True)

    def to_dict(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"channel_state": self.channel_state} if self.channel_state else {}
        return {
            **extra,
            "chains": {t: [r.to_list() for r in refs] for t, refs in self.chains.items() if refs},
            "checkpoint_id": self.checkpoint_id,
            "job": self.job,
            "job_id": self.job_id,
            "fingerprint": self.fingerprint,
            "created": self.created,
            "final": self.final,
            "tasks": {t: [e.file, e.size, e.sha256] for t, e in self.tasks.items()},
            "alignment_ms": self.alignment_ms,
            "duration_ms": self.duration_ms,
            "layout": self.layout,
        }

    @staticmethod
    def from_dict(d: Any) -> "Metadata":
        """Metadata from its decoded form; ValueError if any field has the wrong type or an
        unsafe value (file names must be plain, sizes non-negative ints, sha256 64 hex)."""
        if not isinstance(d, dict):
            raise ValueError(f"metadata body is a {type(d).__name__}, not a map")

        def need(key: str, types: type | tuple[type, ...]) -> Any:
            if key not in d:
                raise ValueError(f"field {key!r} is missing")
            v = d[key]
            if not isinstance(v, types) or (isinstance(v, bool) and bool not in _as_tuple(types)):
                raise ValueError(f"field {key!r} is a {type(v).__name__}")
            return v

        cid = need("checkpoint_id", int)
        if cid < 0:
            raise ValueError("negative checkpoint id")
        tasks_raw = need("tasks", dict)
        tasks: dict[str, FileEntry] = {}
        for t, e in tasks_raw.items():
            if not isinstance(t, str):
                raise ValueError(f"task name {t!r} is not a string")
            if not isinstance(e, (list, tuple)) or len(e) != 3:
                raise ValueError(f"entry of task {t!r} is not [file, size, sha256]")
            file, size, sha = e
            _check_file_fields(f"task {t!r}", file, size, sha)
            tasks[t] = FileEntry(file, size, sha)
        alignment_raw = need("alignment_ms", dict)
        alignment: dict[str, float] = {}
        for t, v in alignment_raw.items():
            if not isinstance(t, str) or not isinstance(v, (int, float)) or isinstance(v, bool):
                raise ValueError(f"alignment of {t!r} is not a number")
            alignment[t] = v
        job_id = d.get("job_id", "")
        if not isinstance(job_id, str):
            raise ValueError("field 'job_id' is not a string")
        layout = _layout(d.get("layout", {}), tasks)
        chains = _chains(d.get("chains", {}), tasks, cid)
        channel_state = d.get("channel_state", {})
        if not isinstance(channel_state, dict) or not all(
                t in tasks and isinstance(n, int) and not isinstance(n, bool) and n >= 0
                for t, n in channel_state.items()):
            raise ValueError("field 'channel_state' is not a map of the checkpoint's tasks to record counts")
        return Metadata(
            checkpoint_id=cid,
            job=need("job", str),
            fingerprint=need("fingerprint", str),
            created=need("created", (int, float)),
            final=need("final", bool),
            tasks=tasks,
            alignment_ms=alignment,
            duration_ms=need("duration_ms", (int, float)),
            job_id=job_id,
            layout=layout,
            chains=chains,
            channel_state=channel_state,
        )


def _check_file_fields(where: str, file: Any, size: Any, sha: Any) -> None:
    """A file reference read from metadata: a plain name (not the metadata's own), a
    non-negative int size, a sha256 of 64 hex digits; ValueError (_UnsafeName) naming it."""
    if not is_plain_name(file) or file in (METADATA, METADATA_TMP):
        raise _UnsafeName(f"{where}: file name {file!r} is not a plain file name")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(f"{where}: size {size!r} is not a non-negative integer")
    if not isinstance(sha, str) or not _SHA256_RE.match(sha):
        raise ValueError(f"{where}: sha256 {sha!r} is not 64 hex digits")


def _chains(raw: Any, tasks: dict[str, FileEntry], cid: int) -> dict[str, list[ChainRef]]:
    """The chains field, checked: {task: [[checkpoint id < cid, plain file, size, sha256], ...]}
    with ids strictly ascending."""
    if not isinstance(raw, dict):
        raise ValueError("field 'chains' is not a map")
    out: dict[str, list[ChainRef]] = {}
    for t, refs in raw.items():
        if t not in tasks:
            raise ValueError(f"chain of task {t!r}, which has no state file")
        if not isinstance(refs, (list, tuple)):
            raise ValueError(f"chain of task {t!r} is not a list")
        chain: list[ChainRef] = []
        for ref in refs:
            if not isinstance(ref, (list, tuple)) or len(ref) != 4:
                raise ValueError(f"chain of task {t!r}: {ref!r} is not [checkpoint id, file, size, sha256]")
            rid, file, size, sha = ref
            if not isinstance(rid, int) or isinstance(rid, bool) or not 0 <= rid < cid or (
                    chain and rid <= chain[-1].checkpoint_id):
                raise ValueError(f"chain of task {t!r}: checkpoint id {rid!r} is not ascending and below {cid}")
            _check_file_fields(f"chain of task {t!r}", file, size, sha)
            chain.append(ChainRef(rid, file, size, sha))
        if chain:
            out[t] = chain
    return out


def _layout(raw: Any, tasks: dict[str, FileEntry]) -> dict[str, Any]:
    """The layout field, checked: {"shape": str, "operators": {name: [task ids of ``tasks``]},
    "max_parallelism": int, "keyed": [names of keyed operators]}."""
    if raw == {}:
        return {}
    if not isinstance(raw, dict) or not isinstance(raw.get("shape"), str) or not isinstance(raw.get("operators"), dict):
        raise ValueError("field 'layout' is not {shape, operators}")
    ops: dict[str, list[str]] = {}
    for name, ids in raw["operators"].items():
        if not isinstance(name, str) or not isinstance(ids, (list, tuple)) or not ids:
            raise ValueError(f"layout of operator {name!r} is not a list of tasks")
        for t in ids:
            if t not in tasks:
                raise ValueError(f"layout of operator {name!r} names task {t!r}, which has no state file")
        ops[name] = list(ids)
    max_p = raw.get("max_parallelism", 128)
    if not isinstance(max_p, int) or isinstance(max_p, bool) or not 1 <= max_p <= 1 << 15:
        raise ValueError(f"layout: max_parallelism {max_p!r} is not an int in 1..32768")
    keyed = raw.get("keyed", [])
    if not isinstance(keyed, (list, tuple)) or not all(isinstance(k, str) and k in ops for k in keyed):
        raise ValueError("layout: 'keyed' is not a list of its operators")
    kinds = raw.get("kinds", {})
    if not isinstance(kinds, dict) or not all(k in ops and isinstance(v, str) for k, v in kinds.items()):
        raise ValueError("layout: 'kinds' is not a map of its operators to their kinds")
    return {"shape": raw["shape"], "operators": ops, "max_parallelism": max_p, "keyed": list(keyed),
            "kinds": dict(kinds)}


def encode_metadata(meta: Metadata) -> bytes:
    """The bytes of a ``_metadata`` file: the body, its sha256, magic and format version."""
    body = codec.pack(meta.to_dict())
    # Version 2 only when a chain exists: an engine that knows no chains must refuse such a
    # checkpoint (it would restore a delta as the whole state), and may read any other.
    version = FORMAT_VERSION if meta.chains else 1
    return codec.pack({"magic": MAGIC, "version": version, "body": body,
                       "sha256": hashlib.sha256(body).hexdigest()})


def parse_metadata(raw: bytes, checkpoint_id: int, path: str) -> Metadata:
    """Metadata from the bytes of a ``_metadata`` file, validated field by field:
    CORRUPT_METADATA (or UNSAFE_PATH for a name that leaves the directory), never a
    msgpack error."""
    try:
        doc = codec.unpack(raw)
        if not isinstance(doc, dict):
            raise ValueError("not a map")
        if doc.get("magic") != MAGIC:
            raise ValueError("bad magic")
        if doc.get("version") not in READ_VERSIONS:
            raise ValueError(f"format version {doc.get('version')!r}, this engine reads {READ_VERSIONS}")
        body = doc["body"]
        if not isinstance(body, bytes) or hashlib.sha256(body).hexdigest() != doc["sha256"]:
            raise ValueError("metadata checksum mismatch")
        meta = Metadata.from_dict(codec.unpack(body))
        if meta.checkpoint_id != checkpoint_id:
            raise ValueError(f"it names checkpoint {meta.checkpoint_id} (copied from another checkpoint?)")
        return meta
    except _UnsafeName as e:
        raise CheckpointError(_R.UNSAFE_PATH,
                              f"checkpoint {checkpoint_id}: metadata {path} references a file outside its "
                              f"directory ({e}): it was tampered with; delete the checkpoint",
                              checkpoint_id) from e
    except Exception as e:
        raise CheckpointError(_R.CORRUPT_METADATA,
                              f"checkpoint {checkpoint_id}: metadata {path} is corrupt ({e}); "
                              "the checkpoint is unusable (an older one is used if there is one)",
                              checkpoint_id) from e


class _UnsafeName(ValueError):
    """A file name in metadata that would leave the checkpoint directory."""


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


# ---- state files ----------------------------------------------------------------------------


def _read_local(root: str, checkpoint_id: int, file: str, size: int, sha256: str) -> tuple[bytes, str]:
    """The verified bytes of state file ``file`` of checkpoint ``checkpoint_id``."""
    shown_dir = os.path.join(root, chk_name(checkpoint_id))
    task = file[: -len(".state")] if file.endswith(".state") else file
    chk_fd = _open_chk(root, checkpoint_id)
    try:
        return _verified_blob(chk_fd, shown_dir, task, file, size, sha256, checkpoint_id), os.path.join(shown_dir, file)
    finally:
        os.close(chk_fd)


def load_task_snapshot(checkpoint_dir_root: str, checkpoint_id: int, entry_file: str, size: int,
                       sha256: str, chain: list[ChainRef] | None = None) -> TaskSnapshotData:
    """One task's snapshot, for a worker restoring it: the state file ``entry_file`` of
    checkpoint ``checkpoint_id`` under the checkpoint root (and the files of its incremental
    ``chain``), each read with every check (plain name, no symlinked root/chk dir/file,
    regular file, bounded by its size), compared with its sha256, decoded and resolved.
    Raises CheckpointError, never OSError or a msgpack error."""
    return load_chain(lambda cid, f, n, sha: _read_local(checkpoint_dir_root, cid, f, n, sha), checkpoint_id,
                      (entry_file, size, sha256), chain or [])


# ---- writing helpers ----------------------------------------------------------------------


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _create_exclusive(dir_fd: int, name: str, data: bytes, shown: str, checkpoint_id: int) -> None:
    """Create ``name`` below ``dir_fd`` (never following or overwriting anything already
    there), write ``data`` and fsync it. A partial file is removed on failure."""
    try:
        fd = os.open(name, _CREATE_FLAGS, 0o600, dir_fd=dir_fd)
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
        _write_all(fd, data)
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
    chk_fd = _open_chk(root, checkpoint_id, create=True)
    try:
        _create_exclusive(chk_fd, name, blob, shown, checkpoint_id)
        os.fsync(chk_fd)  # the new directory entry
    finally:
        os.close(chk_fd)
    return shown


# ---- the storage ------------------------------------------------------------------------------


class CheckpointStorage:
    def __init__(self, root: str, retain: int = 3):
        if retain < 1:
            raise ValueError("retain must be >= 1")
        self.root = os.path.realpath(root)
        self.shown = self.root  #: how the root appears in messages (a URI without credentials)
        self.retain = retain

    def dir_of(self, checkpoint_id: int) -> str:
        return os.path.join(self.root, chk_name(checkpoint_id))

    def ids_on_disk(self) -> list[int]:
        """Every ``chk-N`` entry (directory or not: anything planted is reported by verify),
        with or without valid metadata, ascending. Other names (``_lock``) are ignored."""
        if not os.path.isdir(self.root):
            return []
        ids = [int(m.group(1)) for n in os.listdir(self.root) if (m := _DIR_RE.match(n))]
        return sorted(ids)

    def _has_metadata(self, checkpoint_id: int) -> bool:
        """Something named ``_metadata`` is in a real ``chk-N`` directory (validity is
        checked on load; a planted link or FIFO counts, so that it is reported)."""
        d = self.dir_of(checkpoint_id)
        if _unsafe_kind(d) is not None:
            return os.path.islink(d)  # a planted link is a candidate, reported as UNSAFE_PATH
        return os.path.lexists(os.path.join(d, METADATA))

    def completed_ids(self) -> list[int]:
        """Checkpoints whose metadata file is present (validity is checked on load)."""
        return [i for i in self.ids_on_disk() if self._has_metadata(i)]

    # ---- writing ------------------------------------------------------------------------

    def write_metadata(self, meta: Metadata) -> str:
        """Commit a checkpoint: ``_metadata`` written to an exclusive temp file, fsynced,
        renamed into place, the directories fsynced. Refuses unsafe names (UNSAFE_PATH)."""
        cid = meta.checkpoint_id
        for task, e in meta.tasks.items():
            check_name(e.file, f"checkpoint {cid}: state file of task {task}", cid)
        return self._put_metadata(cid, encode_metadata(meta))

    def _put_metadata(self, cid: int, doc: bytes) -> str:
        """Make ``doc`` the checkpoint's ``_metadata``, atomically (the commit point)."""
        d = self.dir_of(cid)
        chk_fd = _open_chk(self.root, cid, create=True)
        try:
            try:
                os.unlink(METADATA_TMP, dir_fd=chk_fd)  # a stale temp (or a link: removed, not followed)
            except FileNotFoundError:
                pass
            except IsADirectoryError:
                raise CheckpointError(_R.UNSAFE_PATH, f"{os.path.join(d, METADATA_TMP)} is a directory: remove it",
                                      cid) from None
            _create_exclusive(chk_fd, METADATA_TMP, doc, os.path.join(d, METADATA_TMP), cid)
            try:
                os.replace(METADATA_TMP, METADATA, src_dir_fd=chk_fd, dst_dir_fd=chk_fd)
            except IsADirectoryError:
                raise CheckpointError(_R.UNSAFE_PATH, f"{os.path.join(d, METADATA)} is a directory: remove it",
                                      cid) from None
            os.fsync(chk_fd)
        finally:
            os.close(chk_fd)
        root_fd = _open_root(self.root)
        try:
            os.fsync(root_fd)  # the chk-N entry itself must survive a power loss
        finally:
            os.close(root_fd)
        return os.path.join(d, METADATA)

    def _remove(self, checkpoint_id: int) -> None:
        """Delete ``chk-N``: a link or file is unlinked (never followed), a directory removed
        with rmtree (which does not follow links inside it)."""
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

    def prune(self, protect: dict[int, set[str]] | None = None) -> list[int]:
        """Keep the newest ``retain`` completed checkpoints; delete older ones and orphans
        (directories without metadata) older than the newest completed one. Files that a
        kept checkpoint's incremental chains reference, or that ``protect`` names
        (checkpoint id -> file names: what running tasks may still build on), survive: a
        directory holding such files only loses its ``_metadata`` and its other files
        (checkpoint/incremental.py). Returns the ids that are no longer checkpoints."""
        completed = self.completed_ids()
        keep = set(completed[-self.retain :])
        newest = completed[-1] if completed else 0
        metas = []
        for i in sorted(keep):
            try:
                metas.append(self.load_metadata(i))
            except CheckpointError as e:
                if e.reason is _R.UNREACHABLE:
                    return []  # cannot tell what is referenced: delete nothing now
                # unusable: what it references does not matter
        needed = merge(referenced(metas), protect or {})
        removed = []
        for i in self.ids_on_disk():
            if i in keep or i > newest:
                continue
            if i in needed:
                if self._has_metadata(i) or self._has_unneeded(i, needed[i]):
                    self._retire(i, needed[i])
                    removed.append(i)
                continue
            self._remove(i)
            removed.append(i)
        return removed

    def _has_unneeded(self, checkpoint_id: int, files: set[str]) -> bool:
        try:
            return bool(set(os.listdir(self.dir_of(checkpoint_id))) - files)
        except OSError:
            return False

    def _retire(self, checkpoint_id: int, files: set[str]) -> None:
        """``chk-N`` stops being a checkpoint (its ``_metadata`` goes first) but keeps
        ``files``, which others reference; everything else in it is deleted. A link is
        unlinked, never followed."""
        try:
            chk_fd = _open_chk(self.root, checkpoint_id)
        except CheckpointError:
            self._remove(checkpoint_id)  # a planted link or file: nothing of ours is behind it
            return
        try:
            names = os.listdir(chk_fd)
            for name in sorted(names, key=lambda n: n != METADATA):  # _metadata first
                if name in files:
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

    def remove_orphans_after(self, checkpoint_id: int) -> list[int]:
        """At a restart: directories newer than the checkpoint restored from are from the
        failed attempt (incomplete or unusable); delete those without metadata."""
        removed = []
        for i in self.ids_on_disk():
            if i > checkpoint_id and not self._has_metadata(i):
                self._remove(i)
                removed.append(i)
        return removed

    # ---- reading ------------------------------------------------------------------------

    def load_metadata(self, checkpoint_id: int) -> Metadata:
        """The metadata of a checkpoint, read safely (bounded by MAX_METADATA, no link
        followed, a FIFO never waited on) and validated field by field."""
        raw, path = self._read_metadata_raw(checkpoint_id)
        return parse_metadata(raw, checkpoint_id, path)

    def _read_metadata_raw(self, checkpoint_id: int) -> tuple[bytes, str]:
        """The bytes of ``_metadata`` (bounded by MAX_METADATA) and how its path is shown;
        MISSING_METADATA if there is none."""
        path = os.path.join(self.dir_of(checkpoint_id), METADATA)
        try:
            chk_fd = _open_chk(self.root, checkpoint_id)
        except CheckpointError as e:
            if e.reason is _R.NOT_FOUND:
                raise CheckpointError(_R.MISSING_METADATA, f"checkpoint {checkpoint_id} has no metadata ({e})",
                                      checkpoint_id) from None
            raise
        try:
            raw = _read_at(chk_fd, METADATA, None, MAX_METADATA, f"checkpoint {checkpoint_id}: metadata {path}",
                           checkpoint_id)
        except CheckpointError as e:
            if e.reason is _R.MISSING_FILE:
                raise CheckpointError(_R.MISSING_METADATA, f"checkpoint {checkpoint_id} has no metadata ({path})",
                                      checkpoint_id) from None
            raise
        finally:
            os.close(chk_fd)
        return raw, path

    def _read_blobs(self, checkpoint_id: int, meta: Metadata, tasks: list[str]) -> dict[str, tuple[bytes, str]]:
        """The verified bytes of the given tasks' state files (size and sha256 as in
        ``meta``), each with how its path is shown."""
        d = self.dir_of(checkpoint_id)
        chk_fd = _open_chk(self.root, checkpoint_id)
        try:
            out = {}
            for task in tasks:
                e = meta.tasks[task]
                blob = _verified_blob(chk_fd, d, task, e.file, e.size, e.sha256, checkpoint_id)
                out[task] = (blob, os.path.join(d, e.file))
            return out
        finally:
            os.close(chk_fd)

    def _read_file(self, checkpoint_id: int, file: str, size: int, sha256: str) -> tuple[bytes, str]:
        """The verified bytes of one state file (of this or an earlier checkpoint: a chain's)."""
        return _read_local(self.root, checkpoint_id, file, size, sha256)

    def _snapshots(self, checkpoint_id: int, meta: Metadata, tasks: list[str] | None = None,
                   keep_spilled: bool = True) -> dict[str, TaskSnapshotData]:
        """The tasks' snapshots, every file verified and decoded; ``keep_spilled=False``
        (verification only): spill files are checked one at a time and not kept."""
        tasks = list(meta.tasks) if tasks is None else tasks
        plain = [t for t in tasks if t not in meta.chains]
        blobs = self._read_blobs(checkpoint_id, meta, plain)
        out = {task: spill.attach(decode_snapshot(blob, f"{shown} (task {task})", checkpoint_id), self._read_file,
                                  checkpoint_id, keep_spilled)
               for task, (blob, shown) in blobs.items()}
        for t in tasks:
            if t in meta.chains:
                e = meta.tasks[t]
                out[t] = load_chain(self._read_file, checkpoint_id, (e.file, e.size, e.sha256), meta.chains[t],
                                    keep_spilled)
        for t, snap in out.items():
            if snap.deltas and t not in meta.chains:
                raise CheckpointError(_R.CORRUPT_STATE, f"checkpoint {checkpoint_id}: the state file of task {t} "
                                      "holds deltas but the metadata names no chain for it: the checkpoint is "
                                      "unusable", checkpoint_id)
        return out

    def verify(self, checkpoint_id: int) -> Metadata:
        """Load the metadata, check size and sha256 of every file it references, and decode
        each one (CORRUPT_STATE if it does not decode)."""
        meta = self.load_metadata(checkpoint_id)
        self._snapshots(checkpoint_id, meta, keep_spilled=False)
        return meta

    def latest_valid(self, fingerprint: str | None = None, job_id: str | None = None,
                     unusable: dict[int, str] | None = None, shape: str | None = None,
                     any_shape: bool = False, operators: set[str] | None = None
                     ) -> tuple[Metadata | None, list[CheckpointError]]:
        """The newest checkpoint that passes verification; the errors of those skipped.

        With ``job_id``, a checkpoint taken by another job (a different, non-empty job id)
        is skipped with FOREIGN_JOB. With ``fingerprint``, the newest valid checkpoint of
        another plan shape raises PLAN_MISMATCH, unless ``shape`` is given and equals the
        checkpoint's (the same dataflow at another parallelism: the caller rescales), or
        ``any_shape`` (allow_non_restored_state: the caller restores operators by name).
        ``operators`` (the dataflow's) only make a PLAN_MISMATCH say what changed.
        ``unusable`` (id -> why) are skipped too: checkpoints a worker already failed to restore."""
        skipped: list[CheckpointError] = []
        for cid in reversed(self.completed_ids()):
            if unusable and cid in unusable:
                skipped.append(CheckpointError(_R.CORRUPT_STATE, f"checkpoint {cid} could not be restored: "
                                               f"{unusable[cid]}", cid))
                continue
            try:
                meta = self.verify(cid)
            except CheckpointError as e:
                if e.reason is _R.UNREACHABLE:
                    raise  # the store is down, not the checkpoint: never fall back past it
                skipped.append(e)
                continue
            if job_id is not None and meta.job_id and meta.job_id != job_id:
                skipped.append(CheckpointError(
                    _R.FOREIGN_JOB,
                    f"checkpoint {cid} in {self.shown} belongs to job id {meta.job_id!r}, not {job_id!r}: "
                    "two jobs must not share a checkpoint directory; give each job a directory of its own",
                    cid,
                ))
                continue
            if fingerprint is not None and meta.fingerprint != fingerprint:
                if (shape is not None and meta.layout.get("shape") == shape) or (any_shape and meta.layout):
                    return meta, skipped  # the same dataflow at another parallelism, or a changed one
                old = set(meta.layout.get("operators", {}))
                diff = ""
                if operators is not None and old and old != operators:
                    diff = (f"; operators removed: {sorted(old - operators) or 'none'}, "
                            f"added: {sorted(operators - old) or 'none'}")
                raise CheckpointError(
                    _R.PLAN_MISMATCH,
                    f"checkpoint {cid} in {self.shown} was taken by a job of another shape "
                    f"(operators or edges changed{diff}; a change of parallelism alone is rescaled): restore "
                    "with the same dataflow, or use an empty checkpoint directory; to restore it into the "
                    "changed dataflow on purpose (operators matched by name, state of removed ones dropped, "
                    "added ones starting empty) pass allow_non_restored_state=True",
                    cid,
                )
            return meta, skipped
        return None, skipped

    def read_snapshot(self, checkpoint_id: int, task: str, meta: Metadata | None = None) -> TaskSnapshotData:
        """One task's decoded snapshot, read with every check (``meta`` defaults to
        verify()'s; the file is checked against it again either way)."""
        meta = meta or self.verify(checkpoint_id)
        return self._snapshots(checkpoint_id, meta, [task])[task]

    def read_state(self, checkpoint_id: int, task: str, meta: Metadata | None = None) -> dict[str, Any]:
        """Decoded per-operator state of one task (``meta`` as in read_snapshot)."""
        return self.read_snapshot(checkpoint_id, task, meta).states

    def read_logs(self, checkpoint_id: int, task: str, meta: Metadata | None = None) -> dict[str, list[Any]]:
        """The records a task logged on its back-edges for this checkpoint (``meta`` as in
        read_snapshot)."""
        return self.read_snapshot(checkpoint_id, task, meta).logs

    def describe(self, checkpoint_id: int) -> dict[str, Any]:
        meta = self.load_metadata(checkpoint_id)
        d = self.dir_of(checkpoint_id)
        size = sum(e.size for e in meta.tasks.values())
        return {
            "checkpoint_id": checkpoint_id,
            "created": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(meta.created)),
            "final": meta.final,
            "tasks": len(meta.tasks),
            "bytes": size,
            "duration_ms": round(meta.duration_ms, 1),
            "path": d,
            #: incremental: the checkpoints whose files this one's state builds on
            "builds_on": sorted({r.checkpoint_id for refs in meta.chains.values() for r in refs}),
        }
