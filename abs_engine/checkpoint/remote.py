"""Checkpoints on a remote store (``s3://``, ``gs://``, ``hdfs://``...): ``RemoteStore``, the
``CheckpointStore`` (stores.py) whose bytes move through ``abs_engine.fs.Store``; and the
entry points that pick local or remote from a location (storage, a worker's state-file
write and read, where the job's lock lives).

The layout and the logic are storage.py's (``ROOT/chk-000042/<task>.<tag>.state`` and
``_metadata``); only the bytes move differently. Invariants:
- The commit rule object stores honour: state files first, then ``_metadata`` in one
  atomic put, last (no rename on S3); a checkpoint without ``_metadata`` does not exist.
  A reader never sees half a metadata object, so a crash at any moment leaves either the
  old set of checkpoints or the old set plus the new one.
- Everything read back is distrusted as on a local disk: names in metadata must be plain,
  every read is bounded by the size in the metadata (or MAX_METADATA) before a byte is
  buffered, and sizes and sha256s are checked before anything is decoded. There are no
  symlinks or FIFOs on an object store, so those checks have nothing to do here.
- State file names carry the attempt (``<task>.<tag>.state``), so a writer of an older
  attempt can never replace a file that committed metadata references; a state file is
  never put over an existing one (checked first: object stores have no O_EXCL, and the
  per-attempt names make the check-then-put window harmless).
- A store that cannot be reached is CheckpointError(UNREACHABLE), never a skipped
  checkpoint: restoring an older checkpoint because the network failed would be wrong.
"""

from __future__ import annotations

import os

from .. import fs
from ..errors import CheckpointError, CheckpointErrorReason
from .incremental import ChainRef, load_chain
from .snapshot_file import TaskSnapshotData
from .safe_io import DIR_RE, MAX_METADATA, METADATA, check_name, chk_name, load_task_snapshot, write_state_file
from .storage import CheckpointStorage
from .stores import missing, read_verified

_R = CheckpointErrorReason


def _unreachable(e: BaseException, checkpoint_id: int | None = None) -> CheckpointError:
    return CheckpointError(_R.UNREACHABLE, f"checkpoint storage unreachable: {e}", checkpoint_id)


def _store(uri: str) -> fs.Store:
    try:
        return fs.Store(uri, private=True)
    except fs.StoreError as e:
        raise _unreachable(e) from e


class RemoteStore:
    """A ``CheckpointStore`` (stores.py) on a remote store: the bytes through pyarrow.fs."""

    def __init__(self, uri: str):
        self.objects = _store(uri)
        self.root = uri  # workers get the full URI (over the authenticated control link)
        self.shown = self.objects.shown

    def dir_of(self, checkpoint_id: int) -> str:
        return self.objects.show(chk_name(checkpoint_id))

    def make_root(self) -> None:
        try:
            self.objects.make_root()
        except fs.StoreError as e:
            raise _unreachable(e) from e

    def ids(self) -> list[int]:
        try:
            names = self.objects.list()
        except fs.StoreError as e:
            raise _unreachable(e) from e
        return sorted(int(m.group(1)) for n in names if (m := DIR_RE.match(n)))

    def has_metadata(self, checkpoint_id: int) -> bool:
        try:
            return self.objects.exists(chk_name(checkpoint_id), METADATA)
        except fs.StoreError as e:
            raise _unreachable(e, checkpoint_id) from e

    def put_metadata(self, checkpoint_id: int, doc: bytes) -> str:
        """One atomic put: no rename on an object store."""
        chk = chk_name(checkpoint_id)
        try:
            self.objects.put((chk, METADATA), doc)  # the commit point: one atomic put
        except fs.StoreError as e:
            raise _unreachable(e, checkpoint_id) from e
        return self.objects.show(chk, METADATA)

    def remove(self, checkpoint_id: int) -> None:
        try:
            self.objects.delete_dir(chk_name(checkpoint_id))
        except fs.StoreError:
            pass  # pruning is best effort; the next prune tries again

    def list_files(self, checkpoint_id: int) -> set[str]:
        try:
            return set(self.objects.list(chk_name(checkpoint_id)))
        except fs.StoreError:
            return set()

    def retire(self, checkpoint_id: int, keep: set[str]) -> None:
        chk = chk_name(checkpoint_id)
        try:
            self.objects.delete_file(chk, METADATA)  # first: from here on it is not a checkpoint
            for name in self.objects.list(chk):
                if name not in keep:
                    self.objects.delete_file(chk, name)
        except (fs.StoreError, FileNotFoundError):
            pass  # best effort, as pruning; the next prune tries again

    def read_metadata(self, checkpoint_id: int) -> tuple[bytes, str]:
        shown = self.objects.show(chk_name(checkpoint_id), METADATA)
        raw = _read(self.objects, chk_name(checkpoint_id), METADATA, MAX_METADATA,
                    f"checkpoint {checkpoint_id}: metadata {shown}", checkpoint_id, None)
        return raw, shown

    def read_file(self, checkpoint_id: int, file: str, size: int, sha256: str,
                  task: str | None = None) -> tuple[bytes, str]:
        chk = chk_name(checkpoint_id)
        shown = self.objects.show(chk, file)
        return read_verified(lambda limit, what: _read(self.objects, chk, file, limit, what, checkpoint_id, size),
                             checkpoint_id, file, size, sha256, shown, task), shown


class RemoteStorage(CheckpointStorage):
    """CheckpointStorage on a remote store: the same logic over a ``RemoteStore``."""

    store: RemoteStore

    def __init__(self, uri: str, retain: int = 3):
        super().__init__(RemoteStore(uri), retain)


def _read(store: fs.Store, chk: str, name: str, limit: int, what: str, checkpoint_id: int,
          size: int | None) -> bytes:
    """Bytes of ``chk/name``, bounded by ``limit``; typed errors as storage.py's."""
    try:
        return store.read((chk, name), limit)
    except FileNotFoundError:
        raise missing(name, what, checkpoint_id) from None
    except fs.TooLarge as e:
        why = ("fails its checksum: it holds more bytes than recorded in the metadata" if size is not None
               else "is larger than the maximum")
        raise CheckpointError(_R.TOO_LARGE, f"{what} {why} ({e}); it was changed after the checkpoint was "
                              "taken: the checkpoint is unusable (an older one is used if there is one)",
                              checkpoint_id) from None
    except fs.StoreError as e:
        raise _unreachable(e, checkpoint_id) from e


# ---- the entry points: a location is a local path or a URI ---------------------------------


def open_storage(location: str, retain: int = 3) -> CheckpointStorage:
    """The checkpoint storage at ``location``: a local path or ``file://`` URI (storage.py,
    descriptor-safe), or a remote URI (RemoteStorage)."""
    if fs.is_remote(location):
        return RemoteStorage(location, retain)
    return CheckpointStorage(fs.local_path(location), retain)


def write_task_state(root: str, checkpoint_id: int, name: str, blob: bytes) -> str:
    """A worker writes its state file ``root/chk-N/name`` (never over an existing file);
    returns how the path is shown."""
    if not fs.is_remote(root):
        return write_state_file(root, checkpoint_id, name, blob)
    store = _store(root)
    chk = chk_name(checkpoint_id)
    check_name(name, f"checkpoint {checkpoint_id}: state file {store.show(chk, str(name))}", checkpoint_id)
    try:
        if store.size(chk, name) is not None:
            raise CheckpointError(_R.UNSAFE_PATH, f"{store.show(chk, name)} already exists (abs-engine did not "
                                  "write it in this attempt): it is never overwritten; another job may be "
                                  "writing this checkpoint location, use one of your own", checkpoint_id)
        store.put((chk, name), blob)
    except fs.StoreError as e:
        raise _unreachable(e, checkpoint_id) from e
    return store.show(chk, name)


def load_task_state(root: str, checkpoint_id: int, name: str, size: int, sha256: str,
                    chain: list[ChainRef] | None = None) -> TaskSnapshotData:
    """A worker reads the state file it restores from, and its incremental chain, with
    every check (storage.py's ``load_task_snapshot`` for local paths)."""
    if not fs.is_remote(root):
        return load_task_snapshot(root, checkpoint_id, name, size, sha256, chain)
    return load_chain(RemoteStore(root).read_file, checkpoint_id, (name, size, sha256), chain or [])


def control_dir(location: str) -> str:
    """Where the job's lock and output fence live: the checkpoint directory itself when it
    is local; for a remote location, a private directory on this machine named after it
    (flock has no meaning on an object store; see docs/known-limits.md)."""
    if not fs.is_remote(location):
        return fs.local_path(location)
    import hashlib

    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    d = os.path.join(base, "abs-engine", "control", hashlib.sha256(fs.redact(location).encode()).hexdigest()[:24])
    os.makedirs(d, mode=0o700, exist_ok=True)
    return d
