"""count_final's combiner (operators/combiners.py): it counts before the shuffle, sends
pairs at its thresholds and at the end, and what it holds at a barrier is its snapshot:
restored or rescaled, nothing is counted twice or lost."""

from __future__ import annotations

import collections
import random
from pathlib import Path

import pytest

from abs_engine import Dataflow
from abs_engine.errors import JobFailed
from abs_engine.testing import CapturingSink, TestingSource
from operators import combiners
from operators.base import OperatorContext, RecordError
from operators.combiners import PreCount, SumCounts


def opened(op):  # type: ignore[no-untyped-def]
    op.open(OperatorContext("op", 0, 1, 0, False))
    return op


def words(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [f"w{int(rng.paretovariate(1.2)) % 500}" for _ in range(n)]


def test_pairs_leave_at_the_thresholds_and_at_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(combiners, "FLUSH_RECORDS", 1_000)
    pre, total = opened(PreCount()), opened(SumCounts())
    data = words(5_500)
    sent = []
    for i in range(0, len(data), 300):
        out = pre.process(data[i:i + 300])
        assert not out or pre.counted == 0  # sent: nothing held back
        sent.append(len(out))
        total.process(out)
    assert [i for i, n in enumerate(sent) if n] == [3, 7, 11, 15]  # after 1,200, 2,400, 3,600 and 4,800 records
    total.process(pre.finish())
    assert dict(total.finish()) == collections.Counter(data)


def test_a_batch_of_many_keys_leaves_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(combiners, "FLUSH_KEYS", 100)
    pre = opened(PreCount())
    assert pre.process([f"k{i}" for i in range(99)]) == []
    assert len(pre.process(["k99", "k0"])) == 100


def test_the_counts_held_at_a_barrier_restore_and_rescale_without_loss() -> None:
    data = words(3_000, seed=2)
    olds = []
    for part in (data[:1_000], data[1_000:2_500], data[2_500:]):
        pre = opened(PreCount())
        assert pre.process(part) == []  # held: below the thresholds
        olds.append(pre.snapshot(1))
    restored = opened(PreCount())
    restored.restore(olds[1])
    assert collections.Counter(dict(restored.finish())) == collections.Counter(data[1_000:2_500])
    news = [opened(PreCount()) for _ in range(2)]
    for i, op in enumerate(news):
        op.restore(op.rescale_state(olds, i, 2, lambda k: True))
    assert news[1].finish() == []  # every pre-shuffle count went to one new subtask
    assert collections.Counter(dict(news[0].finish())) == collections.Counter(data)


def test_a_key_function_that_raises_names_the_record_or_skips_it() -> None:
    pre = opened(PreCount(lambda r: r["w"]))
    with pytest.raises(RecordError) as info:
        pre.process([{"w": "a"}, {"x": 1}])
    assert info.value.record == {"x": 1}
    skipping = PreCount(lambda r: r["w"])
    skipping.key_on_error = "skip"
    opened(skipping).process([{"w": "a"}, {"x": 1}, {"w": "a"}])
    assert dict(skipping.finish()) == {"a": 2} and len(skipping.take_skipped()) == 1


def test_an_unhashable_key_fails_the_job_naming_key_by(tmp_path: Path) -> None:
    flow = Dataflow("unhashable", parallelism=2)
    flow.source(TestingSource([[1], [2]]), name="src").key_by().count_final(name="count").sink(
        CapturingSink(tmp_path / "o"), name="sink")
    with pytest.raises(JobFailed) as info:
        flow.run(executor="inprocess", restart_attempts=0)
    assert "unhashable" in str(info.value) and "key_by" in str(info.value)
