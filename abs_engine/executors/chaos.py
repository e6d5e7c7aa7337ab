"""The ``chaos`` option's hooks (abs_engine/testing.py: ``RandomKills``,
``KillOnCheckpoints``): the driver asks the chaos object, at each turn of its loops and
after each completed checkpoint, whether to SIGKILL one of the attempt's workers; every kill
is counted (``JobResult.kills``) and logged. Without ``chaos`` both hooks do nothing.
A job of several pipelines asks the one chaos object from each pipeline's driver thread:
the hooks are called one at a time (``_LOCK``), so a chaos object need not be thread-safe.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from .attempt import Attempt
from .config import JobResult


_LOCK = threading.Lock()


class Chaos:
    def __init__(self, chaos: Any, started: float, result: JobResult, log: Callable[[str], None]):
        self.chaos = chaos  #: the ``chaos`` option (None: none)
        self.started = started  #: when the job started (time.monotonic()): chaos times count from it
        self.result = result
        self.log = log

    def poll(self, attempt: Attempt) -> None:
        """Kills at moments of the job (``chaos.poll(elapsed, pids)``)."""
        if self.chaos is None:
            return
        with _LOCK:
            victim = self.chaos.poll(time.monotonic() - self.started, attempt.live_pids())
        if victim is not None:
            self.result.kills += 1
            self.log(f"chaos: SIGKILL {victim}")

    def on_checkpoint(self, checkpoint_id: int, attempt: Attempt) -> None:
        """Kills on checkpoint events (``chaos.on_checkpoint(id, pids)``): a kill after a
        completed checkpoint is sure to be followed by a restore from one."""
        hook = getattr(self.chaos, "on_checkpoint", None)
        if hook is None:
            return
        with _LOCK:
            victim = hook(checkpoint_id, attempt.live_pids())
        if victim is not None:
            self.result.kills += 1
            self.log(f"chaos: SIGKILL {victim} after checkpoint {checkpoint_id}")
