"""Benchmark workloads: word count, and a paper-like pipeline of keyed stages joined by full
hash shuffles whose output streams continuously (so stalls on the output can be seen)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from abs_engine import Dataflow
from operators import FileSink, RangeSource, TextFileSource
from operators.base import OperatorContext, Sink


class GapSink(Sink):
    """Drops records, but notes when each batch arrives; at the end writes the longest gap
    between two arrivals (the stall a checkpointing mode puts on the output) to a JSON file."""

    def __init__(self, path: str):
        self.path = path

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self.last: float | None = None
        self.max_gap = 0.0
        self.count = 0

    def process(self, batch: list[Any]) -> list[Any]:
        now = time.monotonic()
        if self.last is not None:
            self.max_gap = max(self.max_gap, now - self.last)
        self.last = now
        self.count += len(batch)
        return []

    def finish(self) -> list[Any]:
        with open(self.path, "w") as f:
            json.dump({"max_gap_s": self.max_gap, "records": self.count}, f)
        return []


def add_pair(acc: Any, rec: Any) -> Any:
    return (acc[0], acc[1] + rec[1])


class Stage1Key:
    """Spreads records over ``keys`` keys: the size of the first stage's state."""

    def __init__(self, keys: int):
        self.keys = keys

    def __call__(self, i: int) -> Any:
        return ((i * 7_919) % self.keys, 1)


def stage2_key(kv: Any) -> Any:
    return (kv[1][1] % 1_009, 1)


def stage3_key(kv: Any) -> Any:
    return kv[1] % 101


def first(r: Any) -> Any:
    return r[0]


def wordcount(corpus: str, out: str, parallelism: int) -> Dataflow:
    flow = Dataflow("wordcount", parallelism=parallelism)
    flow.source(TextFileSource(corpus)).flat_map(str.split).key_by().count_final().sink(FileSink(out), parallelism=1)
    return flow


def pipeline(records: int, gaps_path: str, parallelism: int, keys: int | None = None) -> Dataflow:
    """source -> keyed running sum -> keyed running count -> keyed running count -> sink,
    each keyed stage behind a full hash shuffle; every stage emits one record per input.
    The first stage holds ``keys`` keys (default: half the records), so snapshots carry
    real state, as in the ABS paper's experiments."""
    flow = Dataflow("pipeline", parallelism=parallelism)
    k1 = Stage1Key(keys or max(1, records // 2))
    s = flow.source(RangeSource(records, batch_size=2_000), name="source").map(k1, name="k1")
    s1 = s.key_by(first).reduce(add_pair, name="sum")
    s2 = s1.map(stage2_key, name="k2").key_by(first).count(name="count1")
    s3 = s2.map(stage3_key, name="k3").key_by().count(name="count2")
    s3.sink(GapSink(gaps_path), name="sink", parallelism=1)
    return flow


def read_gap(path: str) -> dict[str, float]:
    with open(path) as f:
        return json.load(f)


def output_words(path: str) -> int:
    with open(path, encoding="utf-8") as f:
        return sum(int(line.rsplit("\t", 1)[1]) for line in f)


def cleanup(path: str) -> None:
    if os.path.exists(path):
        os.remove(path)
