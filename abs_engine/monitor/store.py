"""A job's statistics stored beside its checkpoints (``<checkpoint_dir>/_job_stats.json``),
for ``abs-engine report`` once the job is over.

JSON, not msgpack: it is not checkpoint state (nothing restores from it), people read it,
and it is the dashboard API's own document (``JobTracker.report_doc``). Written whole to a
temporary name and renamed (fs.Directory.put), so a reader sees the previous version or the
next, never half of one. Reading is bounded and refuses anything but a regular file inside
the directory (a planted link or FIFO is an error, never followed).
"""

from __future__ import annotations

import json
import os
import stat
import time
from typing import TYPE_CHECKING, Any

from .. import fs
from ..errors import CheckpointError, CheckpointErrorReason

if TYPE_CHECKING:
    from .tracker import JobTracker

STATS_FILE = "_job_stats.json"
MAX_STATS_BYTES = 64 << 20  #: a stored document is refused past this (it holds ~1000 checkpoints)
WRITE_EVERY = 2.0  #: seconds between writes while the job runs (each rewrites the whole file)


class StatsWriter:
    """Writes the tracker's document when it changed, at most every WRITE_EVERY seconds."""

    def __init__(self, location: str):
        self.dir = fs.open_dir(location)
        self.written = -1  #: the tracker version last written
        self.next_at = 0.0

    def write(self, tracker: "JobTracker", force: bool = False) -> None:
        now = time.monotonic()
        if tracker.version == self.written or (not force and now < self.next_at):
            return
        self.next_at = now + WRITE_EVERY
        self.written = tracker.version
        data = json.dumps(tracker.report_doc(), separators=(",", ":"), allow_nan=False).encode()
        try:
            self.dir.put((STATS_FILE,), data)
        except OSError:
            pass  # statistics are not worth failing a job over; the next write tries again


def read_stats(location: str) -> dict[str, Any]:
    """The document stored in checkpoint directory ``location``: CheckpointError if it is
    missing (NOT_FOUND), not a regular file (UNSAFE_PATH), too big (TOO_LARGE) or not a
    statistics document (CORRUPT_STATE)."""
    shown = fs.redact(location)
    try:
        if fs.is_remote(location):
            data = fs.open_dir(location).read((STATS_FILE,), MAX_STATS_BYTES)
        else:
            data = _read_local(os.path.join(fs.local_path(location), STATS_FILE))
    except FileNotFoundError:
        raise CheckpointError(CheckpointErrorReason.NOT_FOUND,
                              f"no job statistics in {shown} (no {STATS_FILE}): was a job run with "
                              f"checkpoint_dir={shown!r}? (a job without checkpoint_dir keeps none)") from None
    except fs.TooLarge as e:
        raise CheckpointError(CheckpointErrorReason.TOO_LARGE,
                              f"{STATS_FILE} in {shown} holds {e.size:,} bytes, more than the "
                              f"{MAX_STATS_BYTES:,} a statistics file can: not one abs-engine wrote") from None
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise CheckpointError(CheckpointErrorReason.CORRUPT_STATE, f"{STATS_FILE} in {shown} is not JSON ({e}): "
                                                             "it was damaged; run the job again to rewrite it") from None
    if not (isinstance(doc, dict) and isinstance(doc.get("job"), dict) and isinstance(doc.get("checkpoints"), dict)
            and isinstance(doc.get("details"), dict) and doc.get("version") == 1):
        raise CheckpointError(CheckpointErrorReason.CORRUPT_STATE,
                              f"{STATS_FILE} in {shown} is not a statistics document of this abs-engine version")
    return doc


def _read_local(path: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise CheckpointError(CheckpointErrorReason.UNSAFE_PATH,
                              f"{path} cannot be opened as a plain file ({e.strerror}): refusing it") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(CheckpointErrorReason.UNSAFE_PATH, f"{path} is not a regular file: refusing it")
        if st.st_size > MAX_STATS_BYTES:
            raise fs.TooLarge(st.st_size, MAX_STATS_BYTES)
        data = f.read(MAX_STATS_BYTES + 1)
    if len(data) > MAX_STATS_BYTES:
        raise fs.TooLarge(len(data), MAX_STATS_BYTES)
    return data
