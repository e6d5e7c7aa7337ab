"""Writes snapshot files and acknowledges them, on a thread of its own: the task thread
only encodes its state (a consistent copy) and goes on processing."""

from __future__ import annotations

import hashlib
import os
import queue
import threading
from typing import Callable

from .. import messages
from .control import ControlLink


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
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(blob)
                    f.flush()
                    os.fsync(f.fileno())
                digest = hashlib.sha256(blob).hexdigest()
                self.control.send(
                    messages.Ack(cid, self.task, os.path.basename(path), len(blob), digest, alignment_ms,
                                 logged, finished)
                )
            except BaseException as e:  # noqa: BLE001 - reported to the driver, then the worker dies
                self.on_error(e)
            finally:
                self.jobs.task_done()
