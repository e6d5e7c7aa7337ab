"""Savepoints: SIGTERM (or `abs-engine savepoint --stop`) takes one and stops the job with
its sinks committed; a job started from it, at another parallelism too, ends exactly once;
retention never removes it; a damaged one is refused, never a fresh start."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time

import pytest

from abs_engine import Dataflow
from abs_engine.checkpoint.remote import open_storage
from abs_engine.errors import CheckpointError, CheckpointErrorReason
from abs_engine.testing import CapturingSink, write_zipf_corpus
from operators.generators import RangeSource
from tests.abs_engine.executors.test_rescaling import pipeline, pipeline_oracle

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
N = 200_000
HOLD = N // 4  #: each of the first run's 2 source subtasks holds there (half the input) until its gate opens


def sigterm_after(checkpoints: int):  # type: ignore[no-untyped-def]
    """A stop_when hook that sends this driver SIGTERM once, right after the given number of
    completed checkpoints, and never cancels by itself (the signal does the stopping)."""
    sent: list[bool] = []

    def hook(r) -> bool:  # type: ignore[no-untyped-def]
        if len(r.checkpoints) >= checkpoints and not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
        return False

    return hook


def committed_matches_savepoint(sink_dir: str, savepoint: str) -> None:
    """The sink's output holds exactly what the savepoint says is committed: everything it
    had published plus every epoch up to the savepoint's checkpoint (notify published them)."""
    storage = open_storage(savepoint)
    (cid,) = storage.completed_ids()
    meta = storage.verify(cid)
    (task,) = [t for t in meta.tasks if t.startswith("sink")]
    state = storage.read_state(cid, task, meta)["sink"]
    expected = state["published"] + sum(len(d) for e, d in state["pending"] if e <= cid)
    assert os.path.getsize(os.path.join(sink_dir, "captured", "part-00000")) == expected > 0


@pytest.mark.parametrize("after", [2, 3])
def test_sigterm_stops_with_a_committed_savepoint_and_a_restore_from_it_is_exact(tmp_path, after):
    sink_dir = tmp_path / "out"
    sp_dir, gate = str(tmp_path / "savepoints"), tmp_path / "gate"
    res = pipeline(N, CapturingSink(sink_dir), 2, gate, HOLD).run(
        checkpoint_interval=0.02, checkpoint_dir=str(tmp_path / "ck"), savepoint_dir=sp_dir,
        retained_checkpoints=1, stop_when=sigterm_after(0))
    assert res.stopped_with_savepoint and res.savepoint.startswith(sp_dir) and not res.cancelled
    assert not any(c.final for c in res.checkpoints)  # stopped mid-job, not at its end
    assert res.restarts == 0 and res.failures == []  # a clean stop: no task failed on the way out
    committed_matches_savepoint(str(sink_dir), res.savepoint)
    # Retention (1) removed the checkpoints the savepoint came from; the savepoint is whole.
    assert open_storage(res.savepoint).verify(open_storage(res.savepoint).completed_ids()[0])
    gate.touch()
    again = pipeline(N, CapturingSink(sink_dir), after, gate, HOLD).run(
        checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / "ck2"), restore_from=res.savepoint)
    assert again.restored_from[0] == open_storage(res.savepoint).completed_ids()[0]
    assert collections.Counter(tuple(r) for r in CapturingSink(sink_dir).records()) == pipeline_oracle(N)


def test_a_damaged_savepoint_is_refused_not_ignored(tmp_path):
    res = pipeline(N, CapturingSink(tmp_path / "out"), 2, tmp_path / "gate", HOLD).run(
        checkpoint_interval=0.02, checkpoint_dir=str(tmp_path / "ck"), savepoint_dir=str(tmp_path / "sp"),
        stop_when=sigterm_after(0))
    storage = open_storage(res.savepoint)
    (cid,) = storage.completed_ids()
    victim = os.path.join(storage.dir_of(cid), sorted(e.file for e in storage.verify(cid).tasks.values())[0])
    with open(victim, "r+b") as f:
        byte = f.read(1)
        f.seek(0)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(CheckpointError) as info:
        pipeline(N, CapturingSink(tmp_path / "out2"), 2).run(checkpoint_dir=str(tmp_path / "ck2"),
                                                             restore_from=res.savepoint)
    assert info.value.reason is CheckpointErrorReason.CHECKSUM_MISMATCH
    assert not (tmp_path / "out2").exists() or not CapturingSink(tmp_path / "out2").records()


def test_the_cli_stops_a_running_job_with_a_savepoint(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env = dict(os.environ, PYTHONPATH=root)
    ck = str(tmp_path / "ck")
    corpus = write_zipf_corpus(str(tmp_path / "in.txt"), 8_000_000, seed=3)  # a few seconds of work
    job = subprocess.Popen([sys.executable, os.path.join(root, "examples", "wordcount.py"), "--source", "file",
                            "--input", corpus, "--output",
                            str(tmp_path / "out.tsv"), "--checkpoint-dir", ck, "--checkpoint-interval", "0.05"],
                           cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not open_storage(ck).completed_ids() if os.path.isdir(ck) else True:  # observing the job, bounded
            assert time.monotonic() < deadline and job.poll() is None, job.stderr.read() if job.stderr else ""
            time.sleep(0.05)
        cli = subprocess.run([sys.executable, "-m", "abs_engine.cli", "savepoint", ck, "--stop"], cwd=root,
                             env=env, capture_output=True, text=True, timeout=120)
        assert cli.returncode == 0, cli.stderr
        savepoint = cli.stdout.strip().splitlines()[-1]
        out, err = job.communicate(timeout=120)
        assert job.returncode == 0, err[-2000:]
        assert "stopped with savepoint" in out and savepoint in out
    finally:
        if job.poll() is None:
            job.kill()
    assert open_storage(savepoint).completed_ids()


def _padded(i: int) -> tuple[int, str]:
    return i, "x" * 10_000  # frames far larger than socket buffers: a blocked send is mid-frame


def _slow_unless_told(r: tuple[int, str]) -> int:
    if os.environ.get("ABS_TEST_SLOW_CONSUMER"):
        time.sleep(0.001)  # the bottleneck: its producer is blocked sending nearly all the time
    return r[0]


def backpressured(sink_dir: str):  # type: ignore[no-untyped-def]
    flow = Dataflow("backpressured")
    (flow.source(RangeSource(BACKPRESSURED_N, batch_size=100), "read", parallelism=1).map(_padded, "pad")
     .rebalance().map(_slow_unless_told, "slow", parallelism=2)
     .sink(CapturingSink(sink_dir), "out", parallelism=1))
    return flow


BACKPRESSURED_N = 30_000


@pytest.mark.timeout(120)
def test_stopping_with_a_savepoint_under_backpressure_stops_and_loses_nothing(tmp_path, monkeypatch):
    """A consumer told to stop keeps reading (and discarding) its inputs until it may go: its
    producer, blocked sending to it with its own stop notification unread, must get to commit
    too. (When consumers stopped reading, this job never stopped.) What was discarded came
    after the savepoint, so the job resumed from it ends exactly once."""
    sink_dir = str(tmp_path / "out")
    monkeypatch.setenv("ABS_TEST_SLOW_CONSUMER", "1")
    res = backpressured(sink_dir).run(checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / "ck"),
                                      savepoint_dir=str(tmp_path / "sp"), channel_buffer=65536,
                                      stop_when=sigterm_after(1))
    assert res.stopped_with_savepoint and res.restarts == 0 and res.failures == []
    assert not any(c.final for c in res.checkpoints)
    monkeypatch.delenv("ABS_TEST_SLOW_CONSUMER")
    again = backpressured(sink_dir).run(checkpoint_interval=0.5, checkpoint_dir=str(tmp_path / "ck2"),
                                        restore_from=res.savepoint)
    assert again.restored_from[0] == open_storage(res.savepoint).completed_ids()[0]
    assert sorted(CapturingSink(sink_dir).records()) == list(range(BACKPRESSURED_N))
