"""Checkpoint storage for the simulation: the real ``CheckpointStorage`` on a temporary
directory (``--storage disk``), or its contract in memory (the default: a real
write_metadata costs three fsyncs and prune a listdir per checkpoint, and 1,000 seeds must
run in seconds on a loaded machine). Both store the state files the tasks' writer puts.
"""

from __future__ import annotations

import hashlib
import os

from .. import codec
from ..checkpoint.metadata import Metadata
from ..checkpoint.storage import CheckpointStorage
from ..errors import CheckpointError, CheckpointErrorReason


class MemoryStorage(CheckpointStorage):
    """CheckpointStorage's contract, in memory (see the module docstring)."""

    def __init__(self, retain: int):
        super().__init__("/nonexistent/abs-sim", retain)
        self.files: dict[int, dict[str, bytes]] = {}
        self.metas: dict[int, Metadata] = {}

    def ids_on_disk(self) -> list[int]:
        return sorted(self.files)

    def completed_ids(self) -> list[int]:
        return [i for i in sorted(self.files) if i in self.metas]

    def write_metadata(self, meta: Metadata) -> str:
        self.files.setdefault(meta.checkpoint_id, {})
        self.metas[meta.checkpoint_id] = Metadata.from_dict(codec.unpack(codec.pack(meta.to_dict())))
        return self.dir_of(meta.checkpoint_id)

    def _remove(self, i: int) -> None:
        self.files.pop(i, None)
        self.metas.pop(i, None)

    def prune(self, protect: dict[int, set[str]] | None = None) -> list[int]:
        # The simulated tasks write full snapshots only: nothing is shared to protect.
        completed = self.completed_ids()
        keep, newest = set(completed[-self.retain :]), (completed[-1] if completed else 0)
        removed = [i for i in self.ids_on_disk() if i not in keep and i <= newest]
        for i in removed:
            self._remove(i)
        return removed

    def remove_orphans_after(self, checkpoint_id: int) -> list[int]:
        removed = [i for i in self.ids_on_disk() if i > checkpoint_id and i not in self.metas]
        for i in removed:
            self._remove(i)
        return removed

    def load_metadata(self, checkpoint_id: int) -> Metadata:
        if checkpoint_id not in self.metas:
            raise CheckpointError(CheckpointErrorReason.MISSING_METADATA, f"no metadata {checkpoint_id}", checkpoint_id)
        return self.metas[checkpoint_id]

    def verify(self, checkpoint_id: int) -> Metadata:
        meta = self.load_metadata(checkpoint_id)
        for task, e in meta.tasks.items():
            data = self.files[checkpoint_id].get(e.file)
            if data is None or len(data) != e.size or hashlib.sha256(data).hexdigest() != e.sha256:
                raise CheckpointError(CheckpointErrorReason.CHECKSUM_MISMATCH,
                                      f"checkpoint {checkpoint_id}: bad state file of {task}", checkpoint_id)
        return meta

    def write_file(self, checkpoint_id: int, name: str, blob: bytes) -> None:
        self.files.setdefault(checkpoint_id, {})[name] = blob

    def read_file(self, checkpoint_id: int, name: str) -> bytes:
        return self.files[checkpoint_id][name]


class DiskStorage(CheckpointStorage):
    """The real CheckpointStorage, plus the state-file writes the workers do."""

    def write_file(self, checkpoint_id: int, name: str, blob: bytes) -> None:
        d = self.dir_of(checkpoint_id)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, name), "wb") as f:
            f.write(blob)

    def read_file(self, checkpoint_id: int, name: str) -> bytes:
        with open(os.path.join(self.dir_of(checkpoint_id), name), "rb") as f:
            return f.read()


Storage = MemoryStorage | DiskStorage
