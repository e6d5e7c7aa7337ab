"""Checkpoint storage for the simulation: the production ``CheckpointStorage`` -- its
commit, verification, retention and choice of checkpoint -- over a store in memory
(``MemoryStore``, the default: a local write_metadata costs three fsyncs and prune a
listdir per checkpoint, and 1,000 seeds must run in seconds on a loaded machine), or over
a temporary directory (``--storage disk``, the local store). Only the bytes are the
simulation's; ``open_storage`` also gives how a task's writer puts a state file.

The memory store keeps the contract of checkpoint/stores.py: ``put_metadata`` is one
assignment (a reader sees all of it or nothing); reads check the name plain, refuse
more bytes than recorded (or MAX_METADATA) and check length and sha256, with the same
CheckpointError reasons as the other stores; a state file is never written over an
existing one. There are no links or FIFOs in a dict, so nothing can be followed.
"""

from __future__ import annotations

from typing import Callable

from ..checkpoint.remote import write_task_state
from ..checkpoint.safe_io import MAX_METADATA, METADATA, check_name, chk_name, too_large
from ..checkpoint.storage import CheckpointStorage
from ..checkpoint.stores import missing, read_verified
from ..errors import CheckpointError, CheckpointErrorReason

_R = CheckpointErrorReason

#: How a task's writer puts a state file: (checkpoint id, name, bytes).
Put = Callable[[int, str, bytes], object]


class MemoryStore:
    """A ``CheckpointStore`` in memory: checkpoint id -> file name -> bytes."""

    def __init__(self, name: str = "simulation") -> None:
        self.root = f"memory://{name}"
        self.shown = self.root
        self.blobs: dict[int, dict[str, bytes]] = {}

    def dir_of(self, checkpoint_id: int) -> str:
        return f"{self.root}/{chk_name(checkpoint_id)}"

    def make_root(self) -> None:
        return None

    def ids(self) -> list[int]:
        return sorted(self.blobs)

    def has_metadata(self, checkpoint_id: int) -> bool:
        return METADATA in self.blobs.get(checkpoint_id, ())

    def put_metadata(self, checkpoint_id: int, doc: bytes) -> str:
        self.blobs.setdefault(checkpoint_id, {})[METADATA] = bytes(doc)  # one assignment: the commit point
        return f"{self.dir_of(checkpoint_id)}/{METADATA}"

    def remove(self, checkpoint_id: int) -> None:
        self.blobs.pop(checkpoint_id, None)

    def list_files(self, checkpoint_id: int) -> set[str]:
        return set(self.blobs.get(checkpoint_id, ()))

    def retire(self, checkpoint_id: int, keep: set[str]) -> None:
        files = self.blobs.get(checkpoint_id, {})
        files.pop(METADATA, None)  # first: from here on it is not a checkpoint
        for name in [n for n in files if n not in keep]:
            del files[name]

    def read_metadata(self, checkpoint_id: int) -> tuple[bytes, str]:
        shown = f"{self.dir_of(checkpoint_id)}/{METADATA}"
        return self._read(checkpoint_id, METADATA, MAX_METADATA, f"checkpoint {checkpoint_id}: metadata {shown}",
                          None), shown

    def read_file(self, checkpoint_id: int, file: str, size: int, sha256: str,
                  task: str | None = None) -> tuple[bytes, str]:
        shown = f"{self.dir_of(checkpoint_id)}/{file}"
        return read_verified(lambda limit, what: self._read(checkpoint_id, file, limit, what, size), checkpoint_id,
                             file, size, sha256, shown, task), shown

    def _read(self, checkpoint_id: int, name: str, limit: int, what: str, size: int | None) -> bytes:
        data = self.blobs.get(checkpoint_id, {}).get(name)
        if data is None:
            raise missing(name, what, checkpoint_id)
        if len(data) > limit:
            raise too_large(what, len(data), limit, size is None, checkpoint_id)
        return data

    def write_file(self, checkpoint_id: int, name: str, blob: bytes) -> str:
        """A worker's state-file write (remote.write_task_state's contract): a plain name,
        never over an existing file (UNSAFE_PATH)."""
        shown = f"{self.dir_of(checkpoint_id)}/{name}"
        check_name(name, f"checkpoint {checkpoint_id}: state file {shown}", checkpoint_id)
        files = self.blobs.setdefault(checkpoint_id, {})
        if name in files:
            raise CheckpointError(_R.UNSAFE_PATH, f"{shown} already exists: it is never overwritten", checkpoint_id)
        files[name] = bytes(blob)
        return shown


def open_storage(kind: str, retain: int, root: str | None = None) -> tuple[CheckpointStorage, Put]:
    """The simulation's checkpoint storage (``kind``: ``memory`` or ``disk``, a directory
    at ``root``) and how a task's writer puts a state file there."""
    if kind == "memory":
        store = MemoryStore()
        return CheckpointStorage(store, retain), store.write_file
    if root is None:
        raise ValueError("disk storage needs a root directory")
    storage = CheckpointStorage(root, retain)
    return storage, lambda checkpoint_id, name, blob: write_task_state(storage.root, checkpoint_id, name, blob)
