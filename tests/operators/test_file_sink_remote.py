"""FileSink on an object store (the S3-compatible server the tests start on loopback): each
subtask's epoch becomes one object put whole when its checkpoint completes; a restore rolls
back the objects of later epochs and puts the pending ones again. The lines, read back from
S3, equal the batch oracle after a crash in process, after SIGKILLs of workers, and after a
restore from an older checkpoint than the one published last."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any, Callable

import pytest

from abs_engine import Dataflow, fs
from abs_engine.testing import GatedSource, KillOnCheckpoints, TestingSource, fail_at
from operators import FileSink
from operators.base import OperatorContext

#: Real external systems (a server, a table format): the whole suite runs them, not the fast tier.
pytestmark = pytest.mark.slow


def lines_in(uri: str) -> collections.Counter[str]:
    store = fs.Store(uri)
    names = sorted(n for n in store.list() if n.startswith("part-"))
    assert not [n for n in store.list() if fs.leftover_of(n)]  # nothing half-written is left
    out: collections.Counter[str] = collections.Counter()
    for n in names:
        out.update(store.read((n,), 1 << 30).decode().splitlines())
    return out


def words(n: int) -> list[str]:
    return [f"w{i % 37}-{i}" for i in range(n)]


def test_a_crash_in_process_leaves_every_line_once(s3_server: Callable[[str], str], tmp_path: Path) -> None:
    out = s3_server("filesink-inprocess")
    items = words(5_000)
    flow = Dataflow("remote-lines")
    (flow.source(TestingSource(items), "read", parallelism=2).map(fail_at(2_000), "crash")
     .sink(FileSink(out), "out", parallelism=2))
    res = flow.run(executor="inprocess", checkpoint_interval=0.01, checkpoint_dir=str(tmp_path / "ck"))
    assert res.restarts == 1
    assert lines_in(out) == collections.Counter(items)


def test_a_restore_rolls_back_objects_of_later_epochs(s3_server: Callable[[str], str]) -> None:
    out = s3_server("filesink-rollback")
    ctx = OperatorContext("out", 0, 1, 0, False)
    sink = FileSink(out)
    sink.check()
    sink.open(ctx)
    sink.process(["a", "b"])
    state1 = sink.snapshot(1)
    sink.notify_checkpoint_complete(1)
    sink.process(["c"])
    sink.snapshot(2)
    sink.notify_checkpoint_complete(2)  # published; then checkpoint 2 turns out unreadable
    again = FileSink(out)
    again.open(OperatorContext("out", 0, 1, 1, True))
    again.restore(state1)  # from checkpoint 1: epoch 2's object goes, "c" is read again
    assert lines_in(out) == collections.Counter(["a", "b"])
    fresh = FileSink(out)
    fresh.open(OperatorContext("out", 0, 1, 0, False))  # a run started afresh
    assert lines_in(out) == collections.Counter()


def test_sigkills_of_workers_leave_every_line_once(s3_server: Callable[[str], str], tmp_path: Path) -> None:
    out, gate = s3_server("filesink-kills"), tmp_path / "gate"
    items = words(40_000)
    chaos = KillOnCheckpoints([2, 4], seed=7, open_gate=gate)
    flow = Dataflow("remote-kills")
    source: Any = GatedSource(TestingSource(items, batch_size=500), gate, after=5_000)
    (flow.source(source, "read", parallelism=2).key_by(lambda w: w.split("-")[0]).map(lambda w: w, "route")
     .sink(FileSink(out), "out", parallelism=2))
    res = flow.run(checkpoint_interval=0.05, checkpoint_dir=s3_server("filesink-ck"), chaos=chaos)
    assert len(chaos.killed) == 2 and res.restarts == 2
    assert lines_in(out) == collections.Counter(items)
