"""Channel state spilled out of a task's memory into its checkpoint's directory.

A session of the channel-state log (runtime/channel_state.py) may wait long for its
barriers: round a loop (aligned checkpoints log back-edges until the barrier comes back),
or unaligned behind a lot of data in flight. What it logs would otherwise stay in memory
until the session completes. Past ``channel_state_memory`` bytes in one session, the task
hands what it has logged so far to its writer thread, which writes it as a *spill file*
next to the task's state file (``<task>.<tag>.spill<k>``) and frees it; the
state file, written when the session completes, lists its spill files in order.

Invariants:
- A spill file is the msgpack map {channel: packed array of records}, written once,
  exclusively and fsynced, by the same writer thread (FIFO) as the state file, so every
  spill file a state file lists was written, and its size and sha256 known, before the
  state file is built.
- The records of channel c are those of spill 0, spill 1, ..., then the state file's own
  log of c: the order they arrived in.
- A spill file is read only through the state file that lists it, which passed its own
  size and sha256 check: each spill file is read with the same checks (plain name, in
  that checkpoint's directory, bounded by its recorded size, sha256), before any is
  decoded. A damaged or missing one makes the checkpoint unusable, like any state file.
- Spill files live and die with their checkpoint's directory: an incremental chain never
  reads another checkpoint's logs, so retention that keeps only a retired checkpoint's
  chained state files loses nothing; savepoints copy them (checkpoint/savepoint.py).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable

from .. import codec
from ..errors import CheckpointError, CheckpointErrorReason

if TYPE_CHECKING:
    from .snapshot_file import TaskSnapshotData

#: Bytes of channel state one checkpoint's log may hold in a task's memory before it spills.
DEFAULT_MEMORY = 32 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")
SpillRef = tuple[str, int, str]  #: (file name, size, sha256)


def file_name(state_file: str, index: int) -> str:
    """The name of spill ``index`` of a task whose state file (in the same ``chk-N``) is
    ``state_file``."""
    stem = state_file[: -len(".state")] if state_file.endswith(".state") else state_file
    return f"{stem}.spill{index}"


def encode(logs: dict[str, list[bytes]]) -> bytes:
    """A spill file: the map {channel: packed array}, each array the frames' payloads joined
    as they travelled (never decoded)."""
    return codec.pack({ch: codec.join_arrays(frames) for ch, frames in logs.items() if frames})


def parse_refs(raw: Any) -> tuple[SpillRef, ...]:
    """A state file's list of spill files, validated (ValueError names what is wrong)."""
    if raw is None:
        return ()
    if not isinstance(raw, (list, tuple)):
        raise ValueError("'spilled' is not a list")
    refs = []
    for r in raw:
        if (not isinstance(r, (list, tuple)) or len(r) != 3 or not isinstance(r[0], str)
                or not isinstance(r[1], int) or isinstance(r[1], bool) or r[1] < 0
                or not isinstance(r[2], str) or not _SHA256.fullmatch(r[2])):
            raise ValueError(f"a spill reference {r!r} is not [file, size, sha256]")
        refs.append((r[0], r[1], r[2]))
    return tuple(refs)


def attach(snap: "TaskSnapshotData", read: Callable[[int, str, int, str], tuple[bytes, str]],
           checkpoint_id: int, keep: bool = True) -> "TaskSnapshotData":
    """``snap`` with the records of its spill files put before its own logs, channel by
    channel. ``read(cid, file, size, sha256)`` returns verified bytes (storage's readers).
    ``keep=False`` (verification): each file is read, checked and decoded, then dropped, so
    at most one is held at a time; the logs are left as they were."""
    if not snap.spilled:
        return snap
    if keep:  # every file verified before any is decoded
        blobs = [read(checkpoint_id, f, size, sha) for f, size, sha in snap.spilled]
    logs: dict[str, list[Any]] = {}
    for i, (f, size, sha) in enumerate(snap.spilled):
        blob, shown = blobs[i] if keep else read(checkpoint_id, f, size, sha)
        try:
            doc = codec.unpack(blob)
            if not isinstance(doc, dict) or not all(isinstance(k, str) for k in doc):
                raise ValueError("not a map of channels")
            for ch, data in doc.items():
                records = codec.unpack(data)
                if keep:
                    logs.setdefault(ch, []).extend(records)
        except Exception as e:
            raise CheckpointError(CheckpointErrorReason.CORRUPT_STATE,
                                  f"spill file {shown} passes its checksum but cannot be decoded ({e}): the "
                                  "checkpoint is unusable", checkpoint_id) from e
        del blob, doc
    if not keep:
        return replace(snap, spilled=())
    for ch, records in snap.logs.items():
        logs.setdefault(ch, []).extend(records)
    return replace(snap, logs=logs, spilled=())
