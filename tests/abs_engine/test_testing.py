"""The testing kit itself: TestingSource.ABORT really aborts (also after cloudpickle), and
KillOnCheckpoints kills right after the checkpoint completions it was given."""

from __future__ import annotations

import collections
import pickle

import cloudpickle
import pytest

from abs_engine import Dataflow
from abs_engine.testing import CapturingSink, TestingSource


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
