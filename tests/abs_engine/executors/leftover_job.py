"""A job whose sink stops itself (SIGSTOP) once, before or while it publishes: the
leftover-writer scenario of the fencing tests. Run as a script it is the driver that the
test SIGKILLs: ``python -m tests.abs_engine.executors.leftover_job OUT MARKER MODE CKDIR HB``."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from abs_engine import Dataflow
from abs_engine.errors import FencedOut
from abs_engine.testing import TestingSource
from operators import FileSink

N = 60_000


class StallingSink(FileSink):
    """Stops its own process the first time it is about to publish after something was
    already published (so a stale truncate would visibly damage the output). mode "before":
    before it takes the fence; "during": while it holds it. Writes MARKER.fenced if, once
    woken, the fence refused it."""

    def __init__(self, path: str, marker: str, mode: str):
        super().__init__(path)
        self.marker = marker
        self.mode = mode

    def _stall(self) -> None:
        tmp = self.marker + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(os.getpid()))
        os.replace(tmp, self.marker)
        os.kill(os.getpid(), signal.SIGSTOP)

    def _due(self) -> bool:
        return self.published > 0 and bool(self.pending) and not os.path.exists(self.marker)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        if self.mode == "before" and self._due():
            self._stall()
        try:
            super().notify_checkpoint_complete(checkpoint_id)
        except FencedOut:
            with open(self.marker + ".fenced", "w") as f:
                f.write(str(os.getpid()))
            raise

    def _publish(self, upto: Any) -> None:
        if self.mode == "during" and upto is not None and self._due():
            self._stall()
        super()._publish(upto)


def tag(x: int) -> str:
    if x % 50 == 0:
        time.sleep(0.001)  # stretches the job over a couple of dozen checkpoints (the workload)
    return f"r{x}"


def build(out: str, marker: str, mode: str) -> Dataflow:
    flow = Dataflow("leftover", parallelism=2)
    flow.source(TestingSource(range(N), batch_size=50)).map(tag).sink(StallingSink(out, marker, mode), parallelism=1)
    return flow


if __name__ == "__main__":
    out, marker, mode, ckdir, hb = sys.argv[1:6]
    build(out, marker, mode).run(checkpoint_interval=0.05, checkpoint_dir=ckdir, restart_delay=0,
                                 heartbeat_interval=float(hb), task_timeout=0)
