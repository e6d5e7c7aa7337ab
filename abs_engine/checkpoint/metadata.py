"""The checkpoint metadata schema: what ``_metadata`` records (a checkpoint's tasks with
the size and sha256 of each state file, incremental chains, the plan's layout), its
encoding, and a parser that checks every field of a file it did not write (names must be
plain, numbers numbers, the file's own sha256 must match) before anything is trusted.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from .. import codec
from ..errors import CheckpointError, CheckpointErrorReason
from .incremental import ChainRef
from .safe_io import METADATA, METADATA_TMP, MAGIC, FORMAT_VERSION, READ_VERSIONS, SHA256_RE, is_plain_name

_R = CheckpointErrorReason

# ---- metadata -----------------------------------------------------------------------------


@dataclass(frozen=True)
class FileRef:
    """A file of a checkpoint, as its metadata records it: read bounded by ``size`` and
    verified against ``sha256`` before a byte of it is decoded. The one (file, size, sha256)
    type: metadata, restore specs (restore_spec.py) and chains (ChainRef adds the id)."""

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
    tasks: dict[str, FileRef]
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
            if not isinstance(v, types) or (isinstance(v, bool) and bool not in as_tuple(types)):
                raise ValueError(f"field {key!r} is a {type(v).__name__}")
            return v

        cid = need("checkpoint_id", int)
        if cid < 0:
            raise ValueError("negative checkpoint id")
        tasks_raw = need("tasks", dict)
        tasks: dict[str, FileRef] = {}
        for t, e in tasks_raw.items():
            if not isinstance(t, str):
                raise ValueError(f"task name {t!r} is not a string")
            if not isinstance(e, (list, tuple)) or len(e) != 3:
                raise ValueError(f"entry of task {t!r} is not [file, size, sha256]")
            file, size, sha = e
            check_file_fields(f"task {t!r}", file, size, sha)
            tasks[t] = FileRef(file, size, sha)
        alignment_raw = need("alignment_ms", dict)
        alignment: dict[str, float] = {}
        for t, v in alignment_raw.items():
            if not isinstance(t, str) or not isinstance(v, (int, float)) or isinstance(v, bool):
                raise ValueError(f"alignment of {t!r} is not a number")
            alignment[t] = v
        job_id = d.get("job_id", "")
        if not isinstance(job_id, str):
            raise ValueError("field 'job_id' is not a string")
        layout = parse_layout(d.get("layout", {}), tasks)
        chains = parse_chains(d.get("chains", {}), tasks, cid)
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


def check_file_fields(where: str, file: Any, size: Any, sha: Any) -> None:
    """A file reference read from metadata: a plain name (not the metadata's own), a
    non-negative int size, a sha256 of 64 hex digits; ValueError (UnsafeName) naming it."""
    if not is_plain_name(file) or file in (METADATA, METADATA_TMP):
        raise UnsafeName(f"{where}: file name {file!r} is not a plain file name")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(f"{where}: size {size!r} is not a non-negative integer")
    if not isinstance(sha, str) or not SHA256_RE.match(sha):
        raise ValueError(f"{where}: sha256 {sha!r} is not 64 hex digits")


def parse_chains(raw: Any, tasks: dict[str, FileRef], cid: int) -> dict[str, list[ChainRef]]:
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
            check_file_fields(f"chain of task {t!r}", file, size, sha)
            chain.append(ChainRef(rid, file, size, sha))
        if chain:
            out[t] = chain
    return out


def parse_layout(raw: Any, tasks: dict[str, FileRef]) -> dict[str, Any]:
    """The layout field, checked: {"shape": str, "operators": {name: [task ids of ``tasks``]},
    "max_parallelism": int, "keyed": [names of keyed operators], "kinds": {name: kind},
    "parts": {name: [[field, part], ...]}} (older checkpoints may lack the last two)."""
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
    parts = raw.get("parts", {})
    if not isinstance(parts, dict) or not all(
            k in ops and isinstance(v, (list, tuple)) and all(
                isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in v)
            for k, v in parts.items()):
        raise ValueError("layout: 'parts' is not a map of its operators to [field, part] pairs")
    return {"shape": raw["shape"], "operators": ops, "max_parallelism": max_p, "keyed": list(keyed),
            "kinds": dict(kinds), "parts": {k: [list(p) for p in v] for k, v in parts.items()}}


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
    except UnsafeName as e:
        raise CheckpointError(_R.UNSAFE_PATH,
                              f"checkpoint {checkpoint_id}: metadata {path} references a file outside its "
                              f"directory ({e}): it was tampered with; delete the checkpoint",
                              checkpoint_id) from e
    except Exception as e:
        raise CheckpointError(_R.CORRUPT_METADATA,
                              f"checkpoint {checkpoint_id}: metadata {path} is corrupt ({e}); "
                              "the checkpoint is unusable (an older one is used if there is one)",
                              checkpoint_id) from e


class UnsafeName(ValueError):
    """A file name in metadata that would leave the checkpoint directory."""


def as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)
