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
import threading
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
    """Writes the tracker's document when it changed, at most every WRITE_EVERY seconds.

    The driver's thread only builds the document (under the tracker's lock); encoding and
    the write (an fsync, or a PUT to an object store) happen on a writer thread of its own,
    so a slow disk or store never holds up the job's coordination. The thread writes the
    newest document it was handed (older ones are dropped unwritten); a write that fails
    is tried again on the next period. Statistics are never worth failing a job over.
    """

    def __init__(self, location: str):
        self.dir = fs.open_dir(location, private=True)
        self.taken = -1  #: the tracker version last handed to the thread
        self.next_at = 0.0
        self.error = ""  #: why the last write failed ("" if it did not)
        self._slot: dict[str, Any] | None = None
        self._busy = False
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="stats-writer", daemon=True)
        self._thread.start()

    def write(self, tracker: "JobTracker", force: bool = False) -> None:
        """Hand the tracker's document to the writer if it changed and one is due (always
        when ``force``, and then wait until it is written)."""
        now = time.monotonic()
        if tracker.version != self.taken and (force or now >= self.next_at):
            self.next_at = now + WRITE_EVERY
            self.taken = tracker.version
            doc = tracker.report_doc()
            with self._cond:
                self._slot = doc
                self._cond.notify_all()
        if force:
            self.flush()

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until what was handed over is written (False: still writing at the timeout)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._slot is None and not self._busy, timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Write what was handed over, then end the writer thread (one job, one thread)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._slot is not None or self._closed)
                if self._slot is None:
                    return  # closed, and everything handed over is written
                doc, self._slot, self._busy = self._slot, None, True
            try:
                assert doc is not None
                data = encode(doc)
                self.dir.put((STATS_FILE,), data)
                self.error = ""
            except Exception as e:  # noqa: BLE001 - a full disk, an unreachable store: retried
                self.error = f"{type(e).__name__}: {e}"
                self.taken = -1  # the next period writes again, changed or not
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()


def encode(doc: dict[str, Any]) -> bytes:
    """The stored form: compact JSON within MAX_STATS_BYTES (past it, without the per-subtask
    details, which are what grows with the number of tasks)."""
    data = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
    if len(data) > MAX_STATS_BYTES:
        data = json.dumps({**doc, "details": {}}, separators=(",", ":"), allow_nan=False).encode()
    if len(data) > MAX_STATS_BYTES:
        raise ValueError(f"the job's statistics take {len(data):,} bytes, more than {MAX_STATS_BYTES:,}")
    return data


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
        doc = json.loads(data, parse_constant=_no_constant)  # (NaN and Infinity are not JSON: not ours)
    except ValueError as e:
        raise CheckpointError(CheckpointErrorReason.CORRUPT_STATE, f"{STATS_FILE} in {shown} is not JSON ({e}): "
                                                             "it was damaged; run the job again to rewrite it") from None
    if not (isinstance(doc, dict) and isinstance(doc.get("job"), dict) and isinstance(doc.get("checkpoints"), dict)
            and isinstance(doc.get("details"), dict) and doc.get("version") == 1):
        raise CheckpointError(CheckpointErrorReason.CORRUPT_STATE,
                              f"{STATS_FILE} in {shown} is not a statistics document of this abs-engine version")
    return doc


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


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
