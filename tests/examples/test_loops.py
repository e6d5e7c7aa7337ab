"""Cyclic dataflows end to end: exactly-once under SIGKILLs while the loop is busy,
conservation of money in every checkpoint, termination (and non-termination)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from abs_engine import Dataflow
from abs_engine.checkpoint.storage import CheckpointStorage
from abs_engine.testing import CapturingSink, GatedSource, KillOnCheckpoints, TestingSource
from examples import bank, collatz
from operators import Operator, RangeSource
from tests.chaos_checks import assert_each_kill_restored

pytestmark = pytest.mark.slow


def killed_run(build, tmp_path, read, kills: int, seed: int, **run) -> tuple[Any, Any]:
    """The output of a run whose workers are SIGKILLed right after its first ``kills``
    checkpoint completions (each kill must be followed by a restore from that checkpoint,
    except one that falls after the final checkpoint), and its result. The callers compare
    the output with an exact oracle: what an uninterrupted run must output (an uninterrupted
    run's own output was compared too, and equalled the oracle every time: it proved nothing
    more, at the cost of a second run)."""
    out = str(tmp_path / "killed.tsv")
    chaos = KillOnCheckpoints(range(1, kills + 1), seed=seed)
    res = build(out).run(chaos=chaos, restart_delay=0, **run)
    assert_each_kill_restored(res, chaos, min_kills=1)
    return read(out), res


# One parallelism end to end (2 unaligned: executors/test_unaligned.py); the protocol at
# others: the simulation's topologies.
@pytest.mark.parametrize("parallelism", [4])
def test_collatz_loop_exactly_once_under_sigkill(tmp_path, parallelism):
    n = 15_000
    killed, res = killed_run(
        lambda out: collatz.build_flow(n, out, parallelism), tmp_path, collatz.read_output,
        kills=2, seed=parallelism, checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / "ck"))
    assert killed == collatz.oracle(n)
    assert res.restarts >= 1


@pytest.mark.parametrize("parallelism", [4])
def test_bank_loop_exactly_once_and_conserved_in_every_checkpoint(tmp_path, parallelism):
    accounts, transfers, seed = 50, 75_000, parallelism
    ck = str(tmp_path / "ck")
    killed, res = killed_run(
        lambda out: bank.build_flow(accounts, transfers, seed, out, parallelism), tmp_path, bank.read_output,
        kills=3, seed=10 + parallelism, checkpoint_interval=0.03, checkpoint_dir=ck, retained_checkpoints=10_000)
    assert killed == bank.oracle(accounts, transfers, seed)
    storage = CheckpointStorage(ck)
    ids = storage.completed_ids()
    assert len(ids) >= 3
    logged = 0
    for cid in ids:
        assert bank.conserved_total(storage, cid, accounts) == bank.INITIAL * accounts, cid
        logged += sum(len(v) for t in storage.load_metadata(cid).tasks for v in storage.read_logs(cid, t).values())
    assert logged > 0, "no checkpoint caught money in flight: the check would be vacuous"


@pytest.mark.parametrize("seed", range(8))
def test_bank_conservation_over_many_seeds(tmp_path, seed):
    accounts, ck = 20 + seed, str(tmp_path / "ck")
    flow = bank.build_flow(accounts, 60_000, seed, str(tmp_path / "out.tsv"), parallelism=1 + seed % 3)
    flow.run(checkpoint_interval=0.01, checkpoint_dir=ck, retained_checkpoints=10_000)
    storage = CheckpointStorage(ck)
    for cid in storage.completed_ids():
        assert bank.conserved_total(storage, cid, accounts) == bank.INITIAL * accounts, cid
    assert bank.read_output(str(tmp_path / "out.tsv")) == bank.oracle(accounts, 60_000, seed)


def forever(x: int) -> int:
    return x + 1


def test_a_loop_that_never_drains_keeps_checkpointing_and_does_not_finish(tmp_path):
    flow = Dataflow("forever", parallelism=2)
    loop = flow.feedback()
    spin = flow.source(RangeSource(100)).union(loop).map(forever)
    loop.connect(spin)
    spin.filter(lambda x: x < 0).sink(CapturingSink(tmp_path / "none"))
    res = flow.run(checkpoint_interval=0.02, stop_when=lambda r: len(r.checkpoints) >= 8)
    assert res.cancelled
    assert len(res.checkpoints) >= 8 and not any(c.final for c in res.checkpoints)


def nested_oracle(x: int) -> tuple[int, int]:
    outer = inner_total = 0
    while True:
        inner_total += x % 3  # the inner loop runs x % 3 times per outer round
        if outer == x % 4:
            return outer, inner_total
        outer += 1


def inner_step(r: Any) -> Any:
    x, outer, inner, total = r
    return (x, outer, inner + 1, total + 1) if inner < x % 3 else r


def outer_step(r: Any) -> Any:
    x, outer, inner, total = r
    return ("out", x, outer, total) if outer == x % 4 else ("again", x, outer + 1, 0, total)


class MapOp(Operator):
    def __init__(self, fn):
        self.fn = fn

    def process(self, batch):
        return [self.fn(r) for r in batch]


def nested_flow(sink: CapturingSink, gate: Any = None) -> Dataflow:
    """With ``gate``: each source subtask holds half-way through its numbers until the file exists."""
    flow = Dataflow("nested", parallelism=2)
    outer_fb, inner_fb = flow.feedback(name="outer_fb"), flow.feedback(name="inner_fb")
    source: Any = TestingSource(range(2_000), batch_size=64)
    if gate is not None:
        source = GatedSource(source, gate, after=2_000 // 2 // 2)
    start = flow.source(source).map(lambda x: (x, 0, 0, 0))
    outer_in = start.union(outer_fb, name="outer_in")
    inner = outer_in.union(inner_fb, name="inner_in").key_by(lambda r: r[0]).apply_keyed(MapOp(inner_step),
                                                                                          name="inner")
    inner_fb.connect(inner.filter(lambda r: r[2] < r[0] % 3))
    outer = inner.filter(lambda r: r[2] >= r[0] % 3).key_by(lambda r: r[0]).apply_keyed(MapOp(outer_step),
                                                                                         name="outer")
    outer_fb.connect(outer.filter(lambda r: r[0] == "again").map(lambda r: (r[1], r[2], r[3], r[4])))
    outer.filter(lambda r: r[0] == "out").map(lambda r: (r[1], r[2], r[3])).sink(sink, parallelism=1)
    return flow


def test_nested_loops_with_keyed_exchanges(tmp_path):
    """An outer loop around an inner loop, both through hash exchanges, parallelism 2."""
    expected = sorted((x, *nested_oracle(x)) for x in range(2_000))
    assert len(nested_flow(CapturingSink(tmp_path / "plan")).compile().back_edges) == 2
    sink, gate = CapturingSink(tmp_path / "out"), tmp_path / "gate"
    chaos = KillOnCheckpoints([1, 2], seed=3, open_gate=gate)
    res = nested_flow(sink, gate).run(checkpoint_interval=0.02, chaos=chaos, restart_delay=0)
    assert_each_kill_restored(res, chaos, min_kills=len(chaos.after))  # (all mid-job: held)
    assert sorted(sink.records()) == expected


def test_bank_stop_the_world_under_sigkill_is_exact_and_conserved(tmp_path):
    accounts, transfers, seed = 40, 75_000, 7
    ck = str(tmp_path / "ck")
    killed, res = killed_run(
        lambda out: bank.build_flow(accounts, transfers, seed, out, 2), tmp_path, bank.read_output,
        kills=3, seed=77, mode="stop-the-world", checkpoint_interval=0.05, checkpoint_dir=ck,
        retained_checkpoints=10_000)
    assert killed == bank.oracle(accounts, transfers, seed)
    storage = CheckpointStorage(ck)
    assert storage.completed_ids()
    for cid in storage.completed_ids():
        assert bank.conserved_total(storage, cid, accounts) == bank.INITIAL * accounts, cid


@pytest.mark.spark
def test_bank_loop_on_the_spark_executor_under_sigkill_is_exact_and_conserved(tmp_path, spark):
    """The cycle on Spark: workers inside a barrier stage, SIGKILLed after checkpoints;
    balances identical to an uninterrupted run, money conserved in every checkpoint."""
    accounts, transfers, seed, parallelism = 40, 60_000, 21, 2
    ck = str(tmp_path / "ck")
    killed, res = killed_run(
        lambda out: bank.build_flow(accounts, transfers, seed, out, parallelism), tmp_path, bank.read_output,
        kills=2, seed=31, checkpoint_interval=0.03, checkpoint_dir=ck, retained_checkpoints=10_000,
        executor="spark", spark=spark)
    assert killed == bank.oracle(accounts, transfers, seed)
    storage = CheckpointStorage(ck)
    for cid in storage.completed_ids():
        assert bank.conserved_total(storage, cid, accounts) == bank.INITIAL * accounts, cid


@pytest.mark.parametrize("before,after", [(4, 1)])  # (and up, 2->3, unaligned: executors/test_unaligned.py)
def test_bank_resumed_at_another_parallelism_under_sigkill_is_exact_and_conserved(tmp_path, before, after):
    """The cycle rescaled: balances re-split by key group, credits in flight on the
    back-edge re-routed to the subtask that now owns their account."""
    accounts, transfers, seed = 50, 60_000, before * 10 + after
    ck, out, gate = str(tmp_path / "ck"), str(tmp_path / "out.tsv"), tmp_path / "gate"

    def held() -> GatedSource[Any]:  # a third of each subtask's transfers, then held until the gate opens
        return GatedSource(bank.TransferSource(accounts, transfers, seed), gate, after=transfers // (3 * before))

    first = bank.build_flow(accounts, transfers, seed, out, before, held()).run(
        checkpoint_interval=0.03, checkpoint_dir=ck, retained_checkpoints=10_000,
        stop_when=lambda r: len(r.checkpoints) >= 2)
    assert first.cancelled
    # resumed held too (each subtask restores a read count past the hold), until the kills are made
    chaos = KillOnCheckpoints([1, 2], seed=seed, open_gate=gate)
    res = bank.build_flow(accounts, transfers, seed, out, after, held()).run(
        checkpoint_interval=0.03, checkpoint_dir=ck, retained_checkpoints=10_000, resume=True, chaos=chaos,
        restart_delay=0)
    assert res.restored_from[0] == max(c.checkpoint_id for c in first.checkpoints)
    # the run began with a restore (the rescale); every kill after it restored once more
    assert_each_kill_restored(dataclasses.replace(res, restored_from=res.restored_from[1:]), chaos,
                              min_kills=len(chaos.after))
    assert bank.read_output(out) == bank.oracle(accounts, transfers, seed)
    storage = CheckpointStorage(ck)
    for cid in storage.completed_ids():  # before and after the rescale
        assert bank.conserved_total(storage, cid, accounts) == bank.INITIAL * accounts, cid
