"""Writes snapshot files and acknowledges them, on a thread of its own: the task thread
only encodes its state (a consistent copy) and goes on processing.

Invariants: a snapshot file is written through ``storage.write_state_file`` (the
``chk-N`` directory must be a real directory, the file is created exclusively: nothing
planted in the checkpoint directory is followed or overwritten), fsynced together with
its directory, and only then acknowledged. A path that is not ``ROOT/chk-N/NAME`` for the
snapshot's checkpoint id is refused before anything is written.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
from typing import Callable

from .. import messages
from ..checkpoint.storage import chk_name, write_state_file
from .control import ControlLink


def split_state_path(checkpoint_id: int, path: str) -> tuple[str, str]:
    """``ROOT/chk-N/NAME`` -> (ROOT, NAME); ValueError if the directory is not the one of
    ``checkpoint_id``."""
    chk_dir, name = os.path.split(path)
    root, chk = os.path.split(chk_dir)
    if chk != chk_name(checkpoint_id) or not root or not name:
        raise ValueError(f"snapshot path {path!r} is not ROOT/{chk_name(checkpoint_id)}/NAME")
    return root, name


class SnapshotWriter:
    """Writes snapshot files and sends the acknowledgements, off the task thread."""

    def __init__(self, control: ControlLink, task: str, on_error: Callable[[BaseException], None]):
        self.control = control
        self.task = task
        self.on_error = on_error
        self.jobs: queue.Queue[tuple[int, str, bytes, float, int, bool] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="snapshot-writer", daemon=True)
        self.thread.start()

    def submit(self, checkpoint_id: int, path: str, blob: bytes, alignment_ms: float,
               logged: int, finished: bool) -> None:
        self.jobs.put((checkpoint_id, path, blob, alignment_ms, logged, finished))

    def flush(self) -> None:
        """Wait until every submitted snapshot is written and acknowledged."""
        self.jobs.join()

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            try:
                if job is None:
                    return
                cid, path, blob, alignment_ms, logged, finished = job
                root, name = split_state_path(cid, path)
                write_state_file(root, cid, name, blob)
                digest = hashlib.sha256(blob).hexdigest()
                self.control.send(
                    messages.Ack(cid, self.task, name, len(blob), digest, alignment_ms,
                                 logged, finished)
                )
            except BaseException as e:  # noqa: BLE001 - reported to the driver, then the worker dies
                self.on_error(e)
            finally:
                self.jobs.task_done()
