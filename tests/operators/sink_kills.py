"""A sink that SIGKILLs its own worker at a step of a commit, for the connector tests."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from operators.base import OperatorContext


class KillAtStep:
    """Mixed into a sink whose commit calls ``_step(name)`` (``before``, ``inside``, ``after``):
    SIGKILLs its worker at ``step`` of its first commit, in the first attempt. The next attempt
    opens ``gate``, which holds the source until then (so the job cannot end first)."""

    ctx: OperatorContext

    def __init__(self, *args: Any, step: str, gate: str, **kw: Any):
        super().__init__(*args, **kw)
        self.kill_step, self.gate = step, gate

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)  # type: ignore[misc]
        if ctx.attempt > 0:
            Path(self.gate).touch()

    def _step(self, step: str) -> None:
        if step == self.kill_step and self.ctx.attempt == 0:
            os.kill(os.getpid(), signal.SIGKILL)
