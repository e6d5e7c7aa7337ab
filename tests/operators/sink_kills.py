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


def run_killing_drivers(flow: Any, ck: str, gate: Path, times: int = 2) -> Any:
    """Run ``flow`` supervised and SIGKILL its driver ``times`` times, each once a newer
    checkpoint completed (its source held by ``gate`` meanwhile; opened after): its result,
    checked to have ended cleanly after exactly those crashes."""
    from tests.abs_engine.executors.procs import run_in_thread
    from tests.abs_engine.executors.test_supervisor import kill_drivers

    t, box = run_in_thread(lambda: flow.run(supervise=True, checkpoint_dir=ck, checkpoint_interval=0.05,
                                            restart_delay=0.2, driver_restarts=3))
    try:
        kill_drivers(ck, times)
    finally:
        gate.touch()
        t.join(120)
    assert not t.is_alive() and "error" not in box, box.get("error")
    assert box["result"].driver_crashes == ["killed by signal 9"] * times
    return box["result"]
