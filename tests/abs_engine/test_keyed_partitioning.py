"""``key_by`` partitions the input of whatever follows it, keyed state or not: a map, a
filter, an operator of yours or a sink after ``key_by(f)`` gets all of a key's records on one
subtask, in the stream's order. (Until this was fixed such an edge hashed the whole record:
an upsert sink after key_by received one key's rows on two subtasks, and the older row could
win.)"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest

from abs_engine import Dataflow
from abs_engine.testing import CapturingSink, TestingSource
from operators.base import OperatorContext, Operator


class TagSubtask(Operator):
    """Each record as (its subtask's index, the record)."""

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self.index = ctx.subtask_index

    def process(self, batch: list[Any]) -> list[Any]:
        return [(self.index, r) for r in batch]


def key_of(r: tuple[str, int]) -> str:
    return r[0]


@pytest.mark.parametrize("between", ["map", "filter", "none"])
def test_every_record_of_a_key_reaches_one_subtask_in_order(tmp_path: Path, between: str) -> None:
    items = [(f"k{i % 13}", i) for i in range(3_000)]
    flow = Dataflow("partitioned")
    keyed = flow.source(TestingSource(items, batch_size=50), "read").key_by(key_of)
    after: Any = {"map": lambda: keyed.map(lambda r: r, "m", parallelism=4),
                  "filter": lambda: keyed.filter(lambda r: True, "f", parallelism=4),
                  "none": lambda: keyed}[between]()
    sink = CapturingSink(str(tmp_path / "out"))
    after.apply(TagSubtask(), "tag", parallelism=4).sink(sink, "out", parallelism=4)
    flow.run(executor="inprocess", checkpoint_dir=str(tmp_path / "ck"))
    subtasks: dict[str, set[int]] = collections.defaultdict(set)
    order: dict[str, list[int]] = collections.defaultdict(list)
    for index, (k, i) in sink.records():
        subtasks[k].add(index)
        order[k].append(i)
    assert all(len(s) == 1 for s in subtasks.values()), dict(subtasks)
    assert len({next(iter(s)) for s in subtasks.values()}) > 1  # the keys are spread over subtasks
    assert order == {k: [i for kk, i in items if kk == k] for k in order}


def test_a_union_of_two_keyed_streams_reads_each_with_its_own_key(tmp_path: Path) -> None:
    """A union after key_by takes records of other streams too: no stream's key function is
    applied to another's records (the union's inputs are partitioned alike)."""
    flow = Dataflow("keyed-union")
    pairs = flow.source(TestingSource([(f"k{i}", i) for i in range(100)]), "pairs").key_by(key_of)
    numbers = flow.source(TestingSource(list(range(100))), "numbers").key_by(lambda n: n % 3)
    sink = CapturingSink(str(tmp_path / "out"))
    pairs.union(numbers, parallelism=2).sink(sink, "out")
    flow.run(executor="inprocess", checkpoint_dir=str(tmp_path / "ck"))
    assert sorted(map(repr, sink.records())) == sorted(map(repr, [(f"k{i}", i) for i in range(100)] + list(range(100))))
