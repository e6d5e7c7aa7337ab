"""Regressions found in review: each test reproduces a scenario that once lost, duplicated
or hung, and requires the exact output."""

from __future__ import annotations

import os
import signal
import time

import pytest

from abs_engine import Dataflow
from abs_engine.testing import CapturingSink, TestingSource, fail_at
from examples.collatz import collatz_steps
from operators import Operator, RangeSource

pytestmark = pytest.mark.slow


def test_a_task_restored_after_it_finished_does_not_emit_its_final_results_again(tmp_path):
    """Branch A finishes (count_final emits) long before branch B; B's worker is killed
    later, the job restores from a checkpoint taken after A finished."""
    sink_a, sink_b = CapturingSink(tmp_path / "a"), CapturingSink(tmp_path / "b")
    flow = Dataflow("refinish", parallelism=1)
    flow.source(TestingSource([i % 10 for i in range(100)]), name="small").key_by().count_final(name="cnt").sink(
        sink_a, name="sinkA")
    flow.source(RangeSource(300_000, batch_size=20), name="big").map(fail_at(250_000, kind="kill"), name="killer") \
        .sink(sink_b, name="sinkB")
    res = flow.run(checkpoint_interval=0.02, checkpoint_dir=str(tmp_path / "ck"), restart_delay=0)
    assert res.restarts == 1 and res.restored_from, res
    assert sorted(sink_a.records()) == [(k, 10) for k in range(10)]
    assert sorted(sink_b.records()) == list(range(300_000))


class Step(Operator):
    def process(self, batch):
        return [("done", s, k) if n == 1 else ("more", s, n // 2 if n % 2 == 0 else 3 * n + 1, k + 1)
                for s, n, k in batch]


def is_more(r):
    return r[0] == "more"


def is_done(r):
    return r[0] == "done"


def strip(r):
    return (r[1], r[2], r[3])


def test_two_loops_in_sequence_terminate(tmp_path):
    """Loop 2 is fed by loop 1's output: it can only be proven drained after loop 1 ended."""
    sink = CapturingSink(tmp_path / "out")
    flow = Dataflow("two_loops", parallelism=2)
    seeds = flow.source(RangeSource(1, 500), name="src").map(lambda n: (n, n, 0), name="seed")
    l1 = flow.feedback(name="l1")
    s1 = seeds.union(l1, name="m1").key_by(lambda r: r[1]).apply_keyed(Step(), name="step1")
    l1.connect(s1.filter(is_more, name="more1").map(strip, name="again1"))
    x = s1.filter(is_done, name="done1").map(lambda r: (r[1], 3 * r[1], 0), name="reseed")
    l2 = flow.feedback(name="l2")
    s2 = x.union(l2, name="m2").key_by(lambda r: r[1]).apply_keyed(Step(), name="step2")
    l2.connect(s2.filter(is_more, name="more2").map(strip, name="again2"))
    s2.filter(is_done, name="done2").map(lambda r: (r[1], r[2])).sink(sink, parallelism=1)
    assert len(flow.compile().loops()) == 2
    res = flow.run(mode="none", stop_when=lambda r: False)
    assert not res.cancelled
    assert sorted(sink.records()) == [(n, collatz_steps(3 * n)) for n in range(1, 500)]


class Once(Operator):
    def process(self, batch):
        return [("done", s, k) if k >= 1 else ("more", s, k + 1) for s, k in batch]


def slow_even(x):
    if x % 2 == 0:
        time.sleep(0.0001)  # makes one subtask's regular input end late (a workload, not a wait)
    return (x, 0)


class KillAfterFirstCommit(CapturingSink):
    def notify_checkpoint_complete(self, checkpoint_id):
        super().notify_checkpoint_complete(checkpoint_id)
        if self.ctx.attempt == 0:
            os.kill(os.getpid(), signal.SIGKILL)


def skew_loops(sink, n: int, parallelism: int) -> Dataflow:
    """Two loop heads W and V feeding each other's loops; W's regular input ends late, so
    checkpoints time out before W takes them and W holds its back-edge behind old barriers."""
    flow = Dataflow("skew", parallelism=parallelism)
    src = flow.source(TestingSource(range(1, n), batch_size=500), name="S")
    mw = src.map(slow_even, name="mw")
    mv = src.map(lambda x: (-x, 0), name="mv")
    fb_w, fb_v = flow.feedback(name="fb_w"), flow.feedback(name="fb_v")
    w = mw.union(fb_w, name="W")
    v = mv.union(fb_v, name="V")
    u = w.key_by(lambda r: r[0]).apply_keyed(Once(), name="U")
    fb_v.connect(u.filter(lambda r: r[0] == "more", name="more").map(lambda r: (r[1], r[2]), name="strip"))
    fb_w.connect(v.rebalance().map(lambda r: r, name="vmap"))
    u.filter(lambda r: r[0] == "done", name="done").map(lambda r: r[1], name="fmt").sink(sink, parallelism=1)
    return flow


@pytest.mark.parametrize("parallelism", [1, 2])
def test_timed_out_checkpoints_around_loops_neither_hang_nor_lose_records(tmp_path, parallelism):
    """At parallelism 2 an abandoned checkpoint once left an input blocked forever; at 1 a
    back-edge held behind an old barrier was not logged for the next checkpoint, and the
    restore (the sink kills its worker after the first commit) lost its records."""
    n = 30_000
    sink = KillAfterFirstCommit(tmp_path / "o")
    t0 = time.monotonic()
    res = skew_loops(sink, n, parallelism).run(
        checkpoint_interval=0.05, checkpoint_timeout=0.5, restart_delay=0, checkpoint_dir=str(tmp_path / "ck"),
        tolerable_failed_checkpoints=None,  # this test is about timeouts that do not fail the job over
        stop_when=lambda r: time.monotonic() - t0 > 60)
    assert not res.cancelled, "hung"
    assert res.restarts == 1
    assert sorted(sink.records()) == sorted(list(range(1, n)) + [-x for x in range(1, n)])
