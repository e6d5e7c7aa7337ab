"""The in-process executor (executor="inprocess"): the same job in the calling thread, over
in-memory channels. Its output equals the process executor's and a batch oracle on word
count, the bank loop and a windowed Nexmark query; it checkpoints, recovers from a crash
and from an exception exactly once, applies the poison-record rule, and runs user code on
the caller's own thread (where a breakpoint stops the job)."""

from __future__ import annotations

import collections
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from abs_engine import Dataflow, JobFailed
from abs_engine.testing import CapturingSink, GatedSource, TestingSource, fail_at, write_zipf_corpus
from examples import bank, wordcount
from examples.nexmark.queries import QUERIES, canonical


def wordcount_output(path: str) -> dict[str, int]:
    with open(path) as f:
        return {w: int(n) for w, n in (line.rstrip("\n").split("\t") for line in f)}


def test_word_count_equals_the_process_executor_and_the_oracle(tmp_path: Path) -> None:
    corpus = write_zipf_corpus(tmp_path / "in.txt", 60_000, seed=3)
    outs = {}
    for executor in ("inprocess", "local"):
        out = str(tmp_path / f"{executor}.tsv")
        res = wordcount.build_flow(corpus, out, parallelism=2).run(
            executor=executor, checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / f"ck-{executor}"))
        assert res.restarts == 0 and res.checkpoints_completed >= 1
        outs[executor] = wordcount_output(out)
    with open(corpus) as f:
        oracle = collections.Counter(f.read().split())
    assert outs["inprocess"] == outs["local"] == dict(oracle)


def test_the_bank_loop_equals_the_process_executor_and_the_oracle(tmp_path: Path) -> None:
    accounts, count = 20, 3_000
    outs = {}
    for executor in ("inprocess", "local"):
        out = str(tmp_path / f"{executor}.tsv")
        bank.build_flow(accounts, count, seed=5, output=out, parallelism=2).run(
            executor=executor, checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / f"ck-{executor}"))
        outs[executor] = bank.read_output(out)
    assert outs["inprocess"] == outs["local"] == bank.oracle(accounts, count, 5)


def test_a_windowed_nexmark_query_equals_the_process_executor(tmp_path: Path) -> None:
    build, oracle = QUERIES["q5"]
    outs = {}
    for executor in ("inprocess", "local"):
        sink = CapturingSink(tmp_path / f"out-{executor}")
        build(8_000, sink, 2, 5, rate=1_000).run(executor=executor, checkpoint_interval=0.05,
                                                 checkpoint_dir=str(tmp_path / f"ck-{executor}"))
        outs[executor] = canonical(sink.records())
    expected = canonical(oracle(8_000, 5, rate=1_000))
    assert expected and outs["inprocess"] == outs["local"] == expected


def counted(tmp_path: Path, items: list[Any], *maps: Any, hold: int | None = None,
            **run: Any) -> tuple[Any, list[Any]]:
    """A keyed running count of ``items`` run in process. ``hold``: each source subtask
    holds after that many records until a checkpoint has completed."""
    sink = CapturingSink(tmp_path / "out")
    flow = Dataflow("inproc", parallelism=2)
    source: Any = TestingSource(items, batch_size=10)
    if hold is not None:
        gate = tmp_path / "gate"
        source = GatedSource(source, gate, after=hold)
        run["stop_when"] = lambda r: r.checkpoints_completed >= 1 and gate.touch()  # opens it; never stops
    stream = flow.source(source, name="src")
    for i, fn in enumerate(maps):
        stream = stream.map(fn, name=f"m{i}")
    stream.key_by(lambda r: r % 7).count(name="count").sink(sink, name="sink", parallelism=1)
    res = flow.run(executor="inprocess", checkpoint_dir=str(tmp_path / "ck"), restart_delay=0, **run)
    return res, sink.records()


def running_counts(items: list[int]) -> collections.Counter[tuple[int, int]]:
    totals = collections.Counter(i % 7 for i in items)
    return collections.Counter((k, n) for k, t in totals.items() for n in range(1, t + 1))


def test_a_crash_restarts_from_the_newest_checkpoint_exactly_once(tmp_path: Path) -> None:
    items = list(range(3_000))
    with_abort = items[:2_000] + [TestingSource.ABORT] + items[2_000:]
    # The sources hold at 500 records each until a checkpoint completed: the crash, later,
    # restarts from a checkpoint, whatever the speed of the machine.
    res, out = counted(tmp_path, with_abort, hold=500, checkpoint_interval=0.01)
    assert res.restarts == 1 and res.restored_from and res.restored_from[0] >= 1
    assert "SimulatedCrash" in res.failures[0]
    assert collections.Counter(tuple(r) for r in out) == running_counts(items)
    assert os.environ.get("ABS_ENGINE_INPROCESS") is None  # the caller's environment is as it was


def test_an_exception_fails_over_once_and_a_poison_record_fails_the_job(tmp_path: Path) -> None:
    items = list(range(500))
    res, out = counted(tmp_path / "a", items, fail_at(200), checkpoint_interval=0.01)  # each subtask sees 250
    assert res.restarts == 1 and "injected failure at record 200" in res.failures[0]
    assert collections.Counter(tuple(r) for r in out) == running_counts(items)

    def poison(r: int) -> int:
        if r == 42:
            raise ValueError("bad row")
        return r

    with pytest.raises(JobFailed, match="failed again on the same record") as e:
        counted(tmp_path / "b", items, poison, checkpoint_interval=0.01)
    assert "42" in str(e.value) and "poison" in str(e.value)


def test_user_code_runs_on_the_callers_thread(tmp_path: Path) -> None:
    log = str(tmp_path / "where")  # the function is shipped as a copy, as to a worker: it reports in a file

    def where(r: int) -> int:
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {threading.get_ident()}\n")
        return r

    res, out = counted(tmp_path, list(range(100)), where, checkpoint_interval=0.05)
    with open(log) as f:
        seen = set(f.read().splitlines())
    assert seen == {f"{os.getpid()} {threading.get_ident()}"}
    assert collections.Counter(tuple(r) for r in out) == running_counts(list(range(100)))
