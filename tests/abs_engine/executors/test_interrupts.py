"""Stopping at once: a second Ctrl-C (or one with stop_with_savepoint_on_signal=False)
ends run() with JobInterrupted saying how to resume, every worker stopped; resuming then
gives the exact output."""

from __future__ import annotations

import collections
import os
import signal

import pytest

from abs_engine import JobInterrupted
from abs_engine.testing import CapturingSink
from tests.abs_engine.executors.procs import servers_of, workers_of
from tests.abs_engine.executors.test_rescaling import pipeline, pipeline_oracle

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
N = 1_000_000


def interrupt_after(checkpoints: int, times: int):  # type: ignore[no-untyped-def]
    """A stop_when hook that sends this driver SIGINT ``times`` times, right after the given
    number of completed checkpoints (as a user's Ctrl-C would), and never cancels by itself."""
    sent: list[bool] = []

    def hook(r) -> bool:  # type: ignore[no-untyped-def]
        if not sent and len(r.checkpoints) >= checkpoints:
            sent.append(True)
            for _ in range(times):
                os.kill(os.getpid(), signal.SIGINT)
        return False

    return hook


def my_workers() -> list[int]:
    """Live (not zombie) worker processes (and fork servers) this process started."""
    return sorted(workers_of(os.getpid(), live=True)) + servers_of(os.getpid())


@pytest.mark.parametrize("signals,on_signal", [(2, True), (1, False)])
def test_stopping_at_once_says_how_to_resume_and_leaves_no_worker(tmp_path, signals, on_signal):
    ck = str(tmp_path / "ck")
    sink = CapturingSink(tmp_path / "out")
    with pytest.raises(JobInterrupted) as info:
        pipeline(N, sink, 2).run(checkpoint_interval=0.02, checkpoint_dir=ck, stop_with_savepoint_on_signal=on_signal,
                                 stop_when=interrupt_after(2, signals))
    assert "without a savepoint" in str(info.value) and f"--resume --checkpoint-dir {ck}" in str(info.value)
    assert info.value.checkpoint_dir == ck
    assert my_workers() == []
    pipeline(N, sink, 2).run(checkpoint_interval=0.05, checkpoint_dir=ck, resume=True)
    assert collections.Counter(tuple(r) for r in sink.records()) == pipeline_oracle(N)


def test_stopping_at_once_with_a_temporary_directory_says_so(tmp_path):
    with pytest.raises(JobInterrupted) as info:
        pipeline(N, CapturingSink(tmp_path / "out"), 2).run(checkpoint_interval=0.02,
                                                             stop_with_savepoint_on_signal=False,
                                                             stop_when=interrupt_after(1, 1))
    assert "temporary directory" in str(info.value) and info.value.checkpoint_dir is None
    assert my_workers() == []
