"""Durable checkpoint storage on a file system.

Layout: ``DIR/chk-000042/`` holds one ``<task>.state`` msgpack file per task (written by
the workers) and ``_metadata`` (written by the coordinator, last). Invariants:
- A checkpoint exists iff its ``_metadata`` is present and valid. The metadata is written
  to a temp file, fsynced, renamed into place, and the directory fsynced.
- The metadata carries size and sha256 of every state file it references and a sha256 of
  itself; ``verify`` checks all of them before anything is restored.
- No pickle: every file is msgpack.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from dataclasses import dataclass
from typing import Any

from .. import codec
from ..errors import CheckpointError, CheckpointErrorReason

METADATA = "_metadata"
MAGIC = "abs-engine-checkpoint"
FORMAT_VERSION = 1
_DIR_RE = re.compile(r"^chk-(\d{6,})$")


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "checkpoint_id": self.checkpoint_id,
            "job": self.job,
            "fingerprint": self.fingerprint,
            "created": self.created,
            "final": self.final,
            "tasks": {t: [e.file, e.size, e.sha256] for t, e in self.tasks.items()},
            "alignment_ms": self.alignment_ms,
            "duration_ms": self.duration_ms,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Metadata":
        return Metadata(
            checkpoint_id=d["checkpoint_id"],
            job=d["job"],
            fingerprint=d["fingerprint"],
            created=d["created"],
            final=d["final"],
            tasks={t: FileEntry(*e) for t, e in d["tasks"].items()},
            alignment_ms=dict(d["alignment_ms"]),
            duration_ms=d["duration_ms"],
        )


@dataclass(frozen=True)
class TaskSnapshotData:
    states: dict[str, Any]  #: operator -> decoded state
    logs: dict[str, list[Any]]  #: back-edge channel -> records logged in flight
    finished: bool  #: the task had finished (end of stream sent) when it snapshotted


def decode_snapshot(blob: bytes, path: str) -> TaskSnapshotData:
    """A task's state file, decoded. Raises CheckpointError(CORRUPT_STATE), never a msgpack error."""
    try:
        doc = codec.unpack(blob)
        states = {name: codec.unpack(data) for name, data in doc["operators"].items()}
        logs = {ch: list(codec.unpack(data)) for ch, data in doc.get("logs", {}).items()}
        return TaskSnapshotData(states, logs, bool(doc.get("finished", False)))
    except Exception as e:
        raise CheckpointError(CheckpointErrorReason.CORRUPT_STATE,
                              f"state file {path} passes its checksum but cannot be decoded ({e})") from e


def decode_state(blob: bytes, path: str) -> dict[str, Any]:
    """A task's state file -> {operator: decoded state}."""
    return decode_snapshot(blob, path).states


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointStorage:
    def __init__(self, root: str, retain: int = 3):
        if retain < 1:
            raise ValueError("retain must be >= 1")
        self.root = os.path.abspath(root)
        self.retain = retain

    def dir_of(self, checkpoint_id: int) -> str:
        return os.path.join(self.root, f"chk-{checkpoint_id:06d}")

    def ids_on_disk(self) -> list[int]:
        """Every chk-N directory, with or without valid metadata, ascending."""
        if not os.path.isdir(self.root):
            return []
        ids = [int(m.group(1)) for n in os.listdir(self.root) if (m := _DIR_RE.match(n))]
        return sorted(ids)

    def completed_ids(self) -> list[int]:
        """Checkpoints whose metadata file is present (validity is checked on load)."""
        return [i for i in self.ids_on_disk() if os.path.exists(os.path.join(self.dir_of(i), METADATA))]

    # ---- writing ------------------------------------------------------------------------

    def write_metadata(self, meta: Metadata) -> str:
        d = self.dir_of(meta.checkpoint_id)
        os.makedirs(d, exist_ok=True)
        body = codec.pack(meta.to_dict())
        doc = codec.pack({"magic": MAGIC, "version": FORMAT_VERSION, "body": body,
                          "sha256": hashlib.sha256(body).hexdigest()})
        tmp = os.path.join(d, METADATA + ".tmp")
        with open(tmp, "wb") as f:
            f.write(doc)
            f.flush()
            os.fsync(f.fileno())
        final = os.path.join(d, METADATA)
        os.replace(tmp, final)
        _fsync_dir(d)
        _fsync_dir(self.root)  # the chk-N entry itself must survive a power loss
        return final

    def prune(self) -> list[int]:
        """Keep the newest ``retain`` completed checkpoints; delete older ones and orphans
        (directories without metadata) older than the newest completed one."""
        completed = self.completed_ids()
        keep = set(completed[-self.retain :])
        newest = completed[-1] if completed else 0
        removed = []
        for i in self.ids_on_disk():
            if i in keep or i > newest:
                continue
            shutil.rmtree(self.dir_of(i), ignore_errors=True)
            removed.append(i)
        return removed

    def remove_orphans_after(self, checkpoint_id: int) -> list[int]:
        """At a restart: directories newer than the checkpoint restored from are from the
        failed attempt (incomplete or unusable); delete those without metadata."""
        removed = []
        for i in self.ids_on_disk():
            if i > checkpoint_id and not os.path.exists(os.path.join(self.dir_of(i), METADATA)):
                shutil.rmtree(self.dir_of(i), ignore_errors=True)
                removed.append(i)
        return removed

    # ---- reading ------------------------------------------------------------------------

    def load_metadata(self, checkpoint_id: int) -> Metadata:
        path = os.path.join(self.dir_of(checkpoint_id), METADATA)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            raise CheckpointError(CheckpointErrorReason.MISSING_METADATA,
                                  f"checkpoint {checkpoint_id} has no metadata ({path})", checkpoint_id) from None
        try:
            doc = codec.unpack(raw)
            if doc.get("magic") != MAGIC:
                raise ValueError("bad magic")
            if doc.get("version") != FORMAT_VERSION:
                raise ValueError(f"format version {doc.get('version')!r}, this engine reads {FORMAT_VERSION}")
            body = doc["body"]
            if hashlib.sha256(body).hexdigest() != doc["sha256"]:
                raise ValueError("metadata checksum mismatch")
            return Metadata.from_dict(codec.unpack(body))
        except Exception as e:
            raise CheckpointError(CheckpointErrorReason.CORRUPT_METADATA,
                                  f"checkpoint {checkpoint_id}: metadata {path} is corrupt ({e})",
                                  checkpoint_id) from e

    def verify(self, checkpoint_id: int) -> Metadata:
        """Load the metadata and check size and sha256 of every file it references."""
        meta = self.load_metadata(checkpoint_id)
        d = self.dir_of(checkpoint_id)
        for task, entry in meta.tasks.items():
            path = os.path.join(d, entry.file)
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                raise CheckpointError(CheckpointErrorReason.MISSING_FILE,
                                      f"checkpoint {checkpoint_id}: state file of task {task} is missing ({path})",
                                      checkpoint_id) from None
            if len(data) != entry.size or hashlib.sha256(data).hexdigest() != entry.sha256:
                raise CheckpointError(CheckpointErrorReason.CHECKSUM_MISMATCH,
                                      f"checkpoint {checkpoint_id}: state file of task {task} fails its checksum "
                                      f"({path}: {len(data)} bytes, expected {entry.size})", checkpoint_id)
        return meta

    def latest_valid(self, fingerprint: str | None = None) -> tuple[Metadata | None, list[CheckpointError]]:
        """The newest checkpoint that passes verification; the errors of those skipped."""
        skipped: list[CheckpointError] = []
        for cid in reversed(self.completed_ids()):
            try:
                meta = self.verify(cid)
            except CheckpointError as e:
                skipped.append(e)
                continue
            if fingerprint is not None and meta.fingerprint != fingerprint:
                raise CheckpointError(
                    CheckpointErrorReason.PLAN_MISMATCH,
                    f"checkpoint {cid} in {self.root} was taken by a job of another shape "
                    "(operators, parallelism or edges changed): restore with the same dataflow, "
                    "or use an empty checkpoint directory",
                    cid,
                )
            return meta, skipped
        return None, skipped

    def read_state(self, checkpoint_id: int, task: str, meta: Metadata | None = None) -> dict[str, Any]:
        """Decoded per-operator state of one task (verified against the metadata, unless
        ``meta`` is passed: it must come from verify())."""
        meta = meta or self.verify(checkpoint_id)
        entry = meta.tasks[task]
        path = os.path.join(self.dir_of(checkpoint_id), entry.file)
        with open(path, "rb") as f:
            return decode_state(f.read(), path)

    def read_logs(self, checkpoint_id: int, task: str, meta: Metadata | None = None) -> dict[str, list[Any]]:
        """The records a task logged on its back-edges for this checkpoint (``meta`` as in
        read_state)."""
        meta = meta or self.verify(checkpoint_id)
        path = os.path.join(self.dir_of(checkpoint_id), meta.tasks[task].file)
        with open(path, "rb") as f:
            return decode_snapshot(f.read(), path).logs

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
        }
