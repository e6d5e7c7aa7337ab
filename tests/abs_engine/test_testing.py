"""The testing kit itself: TestingSource.ABORT really aborts (also after cloudpickle), and
KillOnCheckpoints kills right after the checkpoint completions it was given."""

from __future__ import annotations

import collections
import pickle
import signal
import subprocess
import sys
import time

import cloudpickle
import pytest

from abs_engine import Dataflow
from abs_engine.checkpoint.storage import CheckpointStorage
from abs_engine.testing import CapturingSink, GatedSource, KillOnCheckpoints, TestingSource
from operators import Source
from operators.base import OperatorContext
from tests.chaos_checks import assert_each_kill_restored


def test_abort_marker_survives_pickling():
    for dumps in (pickle.dumps, cloudpickle.dumps):
        assert pickle.loads(dumps(TestingSource.ABORT)) is TestingSource.ABORT
        src = pickle.loads(dumps(TestingSource([1, TestingSource.ABORT, 2])))
        assert src.items[1] is TestingSource.ABORT


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("parallelism", [1, 2])
def test_abort_kills_the_worker_once_and_the_job_recovers_exactly(tmp_path, parallelism):
    items = [f"r{i}" for i in range(3_000)]
    with_abort = items[:1_700] + [TestingSource.ABORT] + items[1_700:]
    sink = CapturingSink(tmp_path / "out")
    flow = Dataflow("abort", parallelism=parallelism)
    flow.source(TestingSource(with_abort, batch_size=50)).map(str.upper).sink(sink, parallelism=1)
    res = flow.run(checkpoint_interval=0.02, restart_delay=0)
    assert res.restarts == 1, res.failures  # attempt 0 dies at ABORT; attempt 1 skips it
    assert "signal 9" in res.failures[0]
    assert collections.Counter(sink.records()) == collections.Counter(s.upper() for s in items)


def test_kill_on_checkpoints_kills_a_live_worker_after_the_given_completions():
    procs = {t: subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
             for t in ("a", "b", "c")}
    try:
        pids = {t: p.pid for t, p in procs.items()}
        chaos = KillOnCheckpoints([2, 4], seed=7)
        assert chaos.poll(100.0, pids) is None  # wall-clock moments mean nothing to it
        assert chaos.on_checkpoint(11, pids) is None  # completion 1
        first = chaos.on_checkpoint(12, pids)  # completion 2
        assert first in pids
        assert procs[first].wait(timeout=30) == -signal.SIGKILL
        live = {t: p for t, p in pids.items() if t != first}
        assert chaos.on_checkpoint(13, live) is None  # completion 3
        second = chaos.on_checkpoint(14, live)  # completion 4
        assert second in live
        assert procs[second].wait(timeout=30) == -signal.SIGKILL
        assert chaos.on_checkpoint(15, {t: p for t, p in live.items() if t != second}) is None
        assert chaos.killed == [first, second] and chaos.killed_after == [12, 14]
        [survivor] = set(pids) - {first, second}
        assert procs[survivor].poll() is None
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def test_kill_on_checkpoints_rejects_completion_zero():
    with pytest.raises(ValueError):
        KillOnCheckpoints([0, 1])


class Endless(Source):
    """Emits nothing and never ends: the job runs until ``stop_when``."""

    def read_batch(self):
        time.sleep(0.005)  # an idle source polls; not synchronisation
        return []

    def snapshot(self, checkpoint_id):
        return 0

    def restore(self, state):
        pass


def endless_flow(sink: CapturingSink) -> Dataflow:
    flow = Dataflow("endless", parallelism=1)
    numbers = flow.source(TestingSource(range(500), batch_size=10), name="numbers")
    numbers.union(flow.source(Endless(), name="idle")).map(lambda x: x * 2).sink(sink, parallelism=1)
    return flow


def run_endless_with_kills(tmp_path):
    sink = CapturingSink(tmp_path / "out")
    chaos = KillOnCheckpoints([1, 3], seed=5)
    res = endless_flow(sink).run(checkpoint_interval=0.02, checkpoint_dir=str(tmp_path / "ck"), chaos=chaos,
                                 restart_delay=0, stop_when=lambda r: len(r.checkpoints) >= 5)
    return res, chaos


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_kill_on_checkpoints_in_a_job_is_followed_by_restores_from_those_checkpoints(tmp_path):
    res, chaos = run_endless_with_kills(tmp_path)
    assert res.cancelled and len(chaos.killed) == 2
    assert res.kills == 2 and res.restarts == 2
    assert res.restored_from == chaos.killed_after
    assert_each_kill_restored(res, chaos, min_kills=2)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_the_restore_check_fails_for_an_engine_that_restarts_from_scratch(tmp_path, monkeypatch):
    """The oracle is not vacuous: with recovery from scratch the output could be right,
    but assert_each_kill_restored fails."""
    monkeypatch.setattr(CheckpointStorage, "latest_valid", lambda self, *a, **k: (None, []))
    res, chaos = run_endless_with_kills(tmp_path)
    assert res.kills == 2 and res.restored_from == []
    with pytest.raises(AssertionError):
        assert_each_kill_restored(res, chaos, min_kills=1)


def test_gated_source_holds_until_its_gate_opens(tmp_path):
    gate = tmp_path / "gate"
    src = GatedSource(TestingSource(range(10), batch_size=3), gate, after=4)
    src.open(OperatorContext("read", 0, 1, 0, False))
    assert src.read_batch() == [0, 1, 2] and src.read_batch() == [3, 4, 5]  # past `after`: held from here
    assert src.read_batch() == [] and src.read_batch() == []
    state = src.snapshot(1)
    gate.touch()
    assert src.read_batch() == [6, 7, 8]
    again = GatedSource(TestingSource(range(10), batch_size=3), gate, after=4)
    again.open(OperatorContext("read", 0, 1, 1, True))
    again.restore(state)
    assert again.read_batch() == [6, 7, 8] and again.read_batch() == [9] and again.read_batch() is None


def test_a_gate_on_a_store_holds_workers_that_share_no_disk(s3_server):
    from abs_engine import fs

    gate = fs.join(s3_server("gated"), "gate")
    src = GatedSource(TestingSource(range(6), batch_size=3), gate, after=3)
    src.open(OperatorContext("read", 0, 1, 0, False))
    assert src.read_batch() == [0, 1, 2] and src.read_batch() == []  # held
    fs.Store(s3_server("gated")).put(("gate",), b"")
    assert src.read_batch() == [3, 4, 5] and src.read_batch() is None


def test_a_gate_on_a_store_that_fails_stays_closed_and_a_bucket_is_no_gate(s3_server, monkeypatch):
    from abs_engine import fs

    answers = iter([fs.StoreError("store down"), False, True])

    def exists(self: fs.Store, *names: str) -> bool:
        a = next(answers)
        if isinstance(a, Exception):
            raise a
        return a

    monkeypatch.setattr(fs.Store, "exists", exists)
    src = GatedSource(TestingSource(range(6), batch_size=3), fs.join(s3_server("down"), "gate"), after=3)
    src.open(OperatorContext("read", 0, 1, 0, False))
    assert src.read_batch() == [0, 1, 2]
    assert src.read_batch() == [] and src.read_batch() == []  # down, then closed: held, the task lives
    assert src.read_batch() == [3, 4, 5]
    with pytest.raises(ValueError, match="names no object"):
        GatedSource(TestingSource(range(6)), "s3://bucket/", after=3)  # when the flow is built
