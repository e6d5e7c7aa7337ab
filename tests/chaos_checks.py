"""What a chaos test must prove besides the exact output: that its kills happened and that
recovery restored from the checkpoints they followed (an engine that always restarted
from scratch would give the right output too)."""

from __future__ import annotations

from abs_engine import JobResult
from abs_engine.testing import KillOnCheckpoints


def assert_each_kill_restored(res: JobResult, chaos: KillOnCheckpoints, min_kills: int = 1) -> None:
    """Every kill right after a periodic checkpoint c was followed by a restore from exactly
    c; every restart restored from a checkpoint (none from scratch). A kill that fell after
    the job's final checkpoint may find the workers done (then nothing restarts)."""
    finals = {c.checkpoint_id for c in res.checkpoints if c.final}
    assert res.kills == len(chaos.killed), (res.kills, chaos.killed)
    mid_job = [c for c in chaos.killed_after if c not in finals]
    assert len(mid_job) >= min_kills, f"kills after {chaos.killed_after}, final checkpoints {finals}"
    assert [c for c in res.restored_from if c not in finals] == mid_job, (res.restored_from, chaos.killed_after)
    assert set(res.restored_from) <= set(chaos.killed_after)
    assert res.restarts == len(res.restored_from) >= min_kills
    assert min(res.restored_from) > 0
