"""Unaligned checkpoints (mode="unaligned") and the aligned timeout, end to end: real worker
processes, real SIGKILLs after completed checkpoints, output compared with a batch oracle;
the checkpoints persisted records in flight (else the runs would prove nothing about channel
state), and a checkpoint with channel state resumes exactly at another parallelism."""

from __future__ import annotations

import collections
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from abs_engine import Dataflow
from abs_engine.checkpoint.savepoint import load_savepoint, write_savepoint
from abs_engine.checkpoint.storage import CheckpointStorage
from abs_engine.testing import CapturingSink, GatedSource, KillOnCheckpoints, TestingSource
from examples import bank, collatz
from tests.abs_engine.executors.test_rescaling import pipeline, pipeline_oracle, resumed_hold
from tests.chaos_checks import assert_each_kill_restored

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WORDS = [f"w{(i * 7919) % 5003}" for i in range(300_000)]


def wordcount(sink: CapturingSink, parallelism: int, gate: Path | None = None) -> Dataflow:
    """With ``gate``: each source subtask holds half-way through its words until the file
    exists (the chaos opens it after its last kill: the job cannot end before them)."""
    flow = Dataflow("wordcount", parallelism=parallelism)
    source: Any = TestingSource(WORDS, batch_size=500)
    if gate is not None:
        source = GatedSource(source, gate, after=len(WORDS) // parallelism // 2)
    flow.source(source, name="words").key_by().count_final(name="count").sink(sink, name="sink", parallelism=1)
    return flow


def persisted_in_flight(res) -> int:  # type: ignore[no-untyped-def]
    unaligned = [c for c in res.checkpoints if c.mode == "unaligned"]
    assert unaligned, [c.mode for c in res.checkpoints]
    assert all(c.unaligned_tasks > 0 for c in unaligned)
    assert all((c.inflight_records == 0) == (c.inflight_bytes == 0) for c in res.checkpoints)
    return sum(c.inflight_records for c in res.checkpoints)


# (One parallelism end to end; the protocol at others: the simulation's topologies, in-process.)
@pytest.mark.parametrize("parallelism", [2])
def test_wordcount_unaligned_is_exact_under_sigkills(tmp_path, parallelism):
    sink, gate = CapturingSink(tmp_path / "out"), tmp_path / "gate"
    chaos = KillOnCheckpoints([1, 3], seed=parallelism, open_gate=gate)
    res = wordcount(sink, parallelism, gate).run(mode="unaligned", checkpoint_interval=0.02, chaos=chaos,
                                           checkpoint_dir=str(tmp_path / "ck"), restart_delay=0)
    assert_each_kill_restored(res, chaos, min_kills=len(chaos.after))  # (all mid-job: held)
    assert dict(sink.records()) == collections.Counter(WORDS)
    persisted_in_flight(res)


def assert_pipeline_cuts_consistent(ck: str, n: int) -> None:
    """In every completed checkpoint: records the sources emitted == counted by count1 + in
    flight into count1, and count1's emissions (one per count) == counted by count2 + in
    flight into count2 (Chandy and Lamport's cut: state plus channel state)."""
    storage = CheckpointStorage(ck)
    ids = storage.completed_ids()
    assert ids
    for cid in ids:
        meta = storage.verify(cid)
        left = counted1 = counted2 = into1 = into2 = 0
        for t in meta.tasks:
            state, logs = storage.read_state(cid, t, meta), storage.read_logs(cid, t, meta)
            in_flight = sum(len(v) for v in logs.values())
            if t.startswith("source#"):
                offsets = state["source"]
                offsets = offsets["inner"] if isinstance(offsets, dict) else offsets  # (a GatedSource's)
                left += sum(len(range(a, n, step)) for a, step in offsets)
            elif t.startswith("count1#"):
                counted1, into1 = counted1 + sum(state["count1"].values()), into1 + in_flight
            elif t.startswith("count2#"):
                counted2, into2 = counted2 + sum(state["count2"].values()), into2 + in_flight
        assert counted1 + into1 == n - left, (cid, counted1, into1, n - left)
        assert counted2 + into2 == counted1, (cid, counted2, into2, counted1)


@pytest.mark.parametrize("parallelism", [4])
def test_pipeline_unaligned_emits_every_record_once_under_sigkills(tmp_path, parallelism):
    n, sink, ck, gate = 300_000, CapturingSink(tmp_path / "out"), str(tmp_path / "ck"), tmp_path / "gate"
    chaos = KillOnCheckpoints([1, 3], seed=10 + parallelism, open_gate=gate)  # (held half-way until the kills)
    res = pipeline(n, sink, parallelism, gate, hold=n // parallelism // 2).run(
        mode="unaligned", checkpoint_interval=0.02, chaos=chaos, checkpoint_dir=ck, restart_delay=0,
        retained_checkpoints=10_000)
    assert_each_kill_restored(res, chaos, min_kills=len(chaos.after))  # (all mid-job: held)
    assert collections.Counter(tuple(r) for r in sink.records()) == pipeline_oracle(n)
    assert persisted_in_flight(res) > 0, "no checkpoint held records in flight: the run proves nothing"
    assert_pipeline_cuts_consistent(ck, n)


def collatz_seed(n: int) -> tuple[int, int, int]:
    return (n, n, 0)


def collatz_current(r: tuple[int, int, int]) -> int:
    return r[1]


def held_collatz(numbers: int, output: str, parallelism: int, gate: Path) -> Dataflow:
    """collatz.build_flow's loop, each source subtask held half-way through its numbers
    until ``gate`` exists."""
    from operators import FileSink, RangeSource

    flow = Dataflow("collatz", parallelism=parallelism)
    held = GatedSource(RangeSource(1, numbers + 1), gate, after=numbers // parallelism // 2)
    seeds = flow.source(held, name="numbers").map(collatz_seed, name="seed")
    loop = flow.feedback(name="loop")
    stepped = seeds.union(loop, name="merge").key_by(collatz_current).apply_keyed(collatz.CollatzStep(), name="step")
    loop.connect(stepped.filter(collatz.is_more, name="unfinished").map(collatz.strip_tag, name="again"))
    stepped.filter(collatz.is_done, name="finished").map(collatz.fmt, name="format").sink(
        FileSink(output), name="write", parallelism=1)
    return flow


@pytest.mark.parametrize("parallelism", [2])  # (and 4 aligned: tests/examples/test_loops.py)
def test_collatz_unaligned_is_exact_under_sigkills(tmp_path, parallelism):
    n, out, gate = 15_000, str(tmp_path / "out.tsv"), tmp_path / "gate"
    chaos = KillOnCheckpoints([1, 2, 3], seed=parallelism, open_gate=gate)  # (held half-way until the kills)
    res = held_collatz(n, out, parallelism, gate).run(mode="unaligned", checkpoint_interval=0.05, chaos=chaos,
                                                      checkpoint_dir=str(tmp_path / "ck"), restart_delay=0)
    assert_each_kill_restored(res, chaos, min_kills=len(chaos.after))  # (all mid-job: held)
    assert collatz.read_output(out) == collatz.oracle(n)
    persisted_in_flight(res)


@pytest.mark.parametrize("parallelism", [2])  # (and 4 aligned: tests/examples/test_loops.py)
def test_bank_unaligned_is_exact_and_conserved_in_every_checkpoint(tmp_path, parallelism):
    """Conservation on every completed checkpoint: balances + credits in flight (back-edge
    logs and regular inputs' channel state alike) == the money the bank started with."""
    accounts, transfers, seed, ck = 50, 75_000, parallelism, str(tmp_path / "ck")
    out, gate = str(tmp_path / "out.tsv"), tmp_path / "gate"
    chaos = KillOnCheckpoints([1, 2, 3], seed=20 + parallelism, open_gate=gate)  # (held half-way until the kills)
    held = GatedSource(bank.TransferSource(accounts, transfers, seed), gate, after=transfers // parallelism // 2)
    res = bank.build_flow(accounts, transfers, seed, out, parallelism, source=held).run(
        mode="unaligned", checkpoint_interval=0.03, chaos=chaos, checkpoint_dir=ck, restart_delay=0,
        retained_checkpoints=10_000)
    assert_each_kill_restored(res, chaos, min_kills=len(chaos.after))  # (all mid-job: held)
    assert bank.read_output(out) == bank.oracle(accounts, transfers, seed)
    storage = CheckpointStorage(ck)
    assert len(storage.completed_ids()) >= 3
    for cid in storage.completed_ids():
        assert bank.conserved_total(storage, cid, accounts) == bank.INITIAL * accounts, cid
    assert persisted_in_flight(res) > 0


def test_the_aligned_timeout_turns_slow_alignments_unaligned_and_stays_exact(tmp_path):
    """aligned_timeout=0: every task that has to wait for a second barrier snapshots unaligned
    at once (the checkpoint's barriers carry that on), and the output is still exact."""
    n, sink, gate = 400_000, CapturingSink(tmp_path / "out"), tmp_path / "gate"
    chaos = KillOnCheckpoints([2], seed=4, open_gate=gate)  # (held half-way until the kill)
    res = pipeline(n, sink, 2, gate, hold=n // 4).run(aligned_timeout=0.0, checkpoint_interval=0.02, chaos=chaos,
                                   checkpoint_dir=str(tmp_path / "ck"), restart_delay=0)
    assert_each_kill_restored(res, chaos, min_kills=len(chaos.after))  # (all mid-job: held)
    assert collections.Counter(tuple(r) for r in sink.records()) == pipeline_oracle(n)
    assert {c.mode for c in res.checkpoints} == {"aligned"}
    assert any(c.unaligned_tasks > 0 for c in res.checkpoints), "no alignment ever timed out"


def stop_with_channel_state(r) -> bool:  # type: ignore[no-untyped-def]
    """stop_when: the newest completed checkpoint holds records in flight."""
    return bool(r.checkpoints) and r.checkpoints[-1].mode == "unaligned" and r.checkpoints[-1].inflight_records > 0


def newest_with_channel_state(ck: str) -> int:
    """Make the newest checkpoint one that holds records in flight on regular channels: those
    completed after it (between stop_when's look and the cancel, or up to the job's end if it
    finished before stop_when saw one) are deleted, as if the job had stopped right after it."""
    storage = CheckpointStorage(ck)
    ids = [c for c in storage.completed_ids() if storage.load_metadata(c).channel_state]
    assert ids, "no checkpoint holds channel state: the run proves nothing"
    for later in [c for c in storage.ids_on_disk() if c > ids[-1]]:
        shutil.rmtree(storage.dir_of(later))
    return ids[-1]


@pytest.mark.parametrize("before,after", [(2, 3), (4, 1)])  # up and down
def test_a_checkpoint_with_channel_state_rescales_exactly(tmp_path, before, after):
    """Stopped right after an unaligned checkpoint that holds records in flight, resumed at
    another parallelism under SIGKILLs: every record emitted once. Records in flight into
    the keyed counts were routed by key group to the subtask that now owns their count; at
    parallelism 1 the sink is fused behind count2 and replays its own channel state there."""
    n, ck, gate = 300_000, str(tmp_path / "ck"), tmp_path / "gate"
    hold = n // (2 * before)  # half the input, then held: the first run cannot finish, it is stopped
    sink = CapturingSink(tmp_path / "out")
    pipeline(n, sink, before, gate, hold).run(mode="unaligned", checkpoint_interval=0.02, checkpoint_dir=ck,
                                              retained_checkpoints=10_000, stop_when=stop_with_channel_state)
    # Cancelled after a checkpoint with channel state (one taken before no subtask had
    # finished: a rescale could not rebuild a finished one's output); every checkpoint is
    # kept, and that newest one becomes the one to resume from (its output rolled back to it).
    newest = newest_with_channel_state(ck)
    # Held again half-way through what is left, until the kills (every one mid-job, at any speed).
    gate2 = tmp_path / "gate2"
    chaos = KillOnCheckpoints([1, 2], seed=before * 10 + after, open_gate=gate2)
    res = pipeline(n, sink, after, gate2, resumed_hold(ck, newest, "source", n, after)).run(
        mode="unaligned", checkpoint_interval=0.05, checkpoint_dir=ck, resume=True, chaos=chaos, restart_delay=0,
        retained_checkpoints=10_000)
    assert res.restored_from[0] == newest
    assert collections.Counter(tuple(r) for r in sink.records()) == pipeline_oracle(n)
    assert_pipeline_cuts_consistent(ck, n)  # before and after the rescale
    assert_each_kill_restored(replace(res, restored_from=res.restored_from[1:]), chaos, min_kills=len(chaos.after))


@pytest.mark.parametrize("before,after", [(2, 3)])  # (and down, 4->1, aligned: tests/examples/test_loops.py)
def test_bank_rescaled_from_an_unaligned_checkpoint_is_exact_and_conserved(tmp_path, before, after):
    """The cycle rescaled from an unaligned checkpoint: credits in flight on the back-edge
    and on the loop's regular channels re-routed to the subtask that now owns their account;
    money conserved in every checkpoint before and after."""
    accounts, transfers, seed = 50, 75_000, before * 10 + after
    ck, out, gate, gate2 = str(tmp_path / "ck"), str(tmp_path / "out.tsv"), tmp_path / "gate", tmp_path / "gate2"
    # The first run is not held (after=transfers: more than a subtask reads): its source floods
    # the loop, as checkpoints with channel state need. It is gated only for its state's shape.
    held = GatedSource(bank.TransferSource(accounts, transfers, seed), gate, after=transfers)
    bank.build_flow(accounts, transfers, seed, out, before, source=held).run(
        mode="unaligned", checkpoint_interval=0.03, checkpoint_dir=ck, retained_checkpoints=10_000,
        stop_when=lambda r: len(r.checkpoints) >= 2 and stop_with_channel_state(r))
    newest = newest_with_channel_state(ck)  # (cancelled, or finished first: as above)
    # Held half-way through what is left (if nothing is: at once, idle but not finished), until the
    # kills: every one mid-job, at any speed.
    chaos = KillOnCheckpoints([1, 2], seed=seed, open_gate=gate2)
    held = GatedSource(bank.TransferSource(accounts, transfers, seed), gate2,
                       after=resumed_hold(ck, newest, "transfers", transfers, after))
    res = bank.build_flow(accounts, transfers, seed, out, after, source=held).run(
        mode="unaligned", checkpoint_interval=0.03, checkpoint_dir=ck, retained_checkpoints=10_000, resume=True,
        chaos=chaos, restart_delay=0)
    assert res.restored_from[0] == newest
    assert_each_kill_restored(replace(res, restored_from=res.restored_from[1:]), chaos, min_kills=len(chaos.after))
    storage = CheckpointStorage(ck)
    assert bank.read_output(out) == bank.oracle(accounts, transfers, seed)
    for cid in storage.completed_ids():
        assert bank.conserved_total(storage, cid, accounts) == bank.INITIAL * accounts, cid


def test_unaligned_with_incremental_checkpoints_is_exact_under_sigkills(tmp_path):
    n, sink, ck, gate = 300_000, CapturingSink(tmp_path / "out"), str(tmp_path / "ck"), tmp_path / "gate"
    chaos = KillOnCheckpoints([2, 4], seed=6, open_gate=gate)  # (held half-way until the kills)
    res = pipeline(n, sink, 2, gate, hold=n // 2 // 2).run(
        mode="unaligned", incremental_checkpoints=True, checkpoint_interval=0.02, chaos=chaos, checkpoint_dir=ck,
        restart_delay=0, retained_checkpoints=10_000)
    assert_each_kill_restored(res, chaos, min_kills=len(chaos.after))  # (all mid-job: held)
    assert collections.Counter(tuple(r) for r in sink.records()) == pipeline_oracle(n)
    assert any(c.delta_tasks for c in res.checkpoints) and persisted_in_flight(res) > 0
    assert_pipeline_cuts_consistent(ck, n)


@pytest.mark.spark
def test_a_spark_source_on_the_spark_executor_unaligned_is_exact_under_sigkills(tmp_path, spark, text_dir):
    """Spark on both sides: a SparkSource read by workers that run inside a Spark barrier
    stage, unaligned checkpoints, SIGKILLs after checkpoints; word counts exact."""
    from operators import FileSink
    from operators.spark import SparkSource
    from tests.conftest import batch_word_count_dir
    from tests.operators.test_spark import counts_file
    from tests.operators.test_spark import wordcount as spark_wordcount

    out = str(tmp_path / "out.tsv")
    chaos = KillOnCheckpoints([1, 2], seed=8)
    res = spark_wordcount(SparkSource.text(text_dir, spark=spark), FileSink(out), 2).run(
        mode="unaligned", checkpoint_interval=0.05, chaos=chaos, restart_delay=0, executor="spark", spark=spark)
    assert_each_kill_restored(res, chaos, min_kills=1)
    assert counts_file(out) == batch_word_count_dir(text_dir)
    assert any(c.mode == "unaligned" for c in res.checkpoints)


def spill_files(ck: str) -> int:
    """Spill files (checkpoint/spill.py) in the checkpoints that completed."""
    storage = CheckpointStorage(ck)
    return sum(1 for cid in storage.completed_ids() for f in os.listdir(storage.dir_of(cid)) if ".spill" in f)


@pytest.mark.parametrize("mode", ["unaligned"])  # (logs back-edges and regular inputs: every kind of log spills)
def test_channel_state_past_its_memory_limit_spills_and_stays_exact(tmp_path, mode):
    """channel_state_memory=0: every frame a checkpoint logs goes to a spill file at once
    (back-edges round the bank's loop; every input when unaligned). Money is conserved in
    every completed checkpoint counting the spilled credits, and after SIGKILLs the
    output is exact: the spill files were read back, in order, at each restore."""
    accounts, transfers, seed, ck = 50, 75_000, 3, str(tmp_path / "ck")
    out, gate = str(tmp_path / "out.tsv"), tmp_path / "gate"
    chaos = KillOnCheckpoints([1, 2, 3], seed=31, open_gate=gate)  # (held half-way until the kills)
    held = GatedSource(bank.TransferSource(accounts, transfers, seed), gate, after=transfers // 2 // 2)
    res = bank.build_flow(accounts, transfers, seed, out, 2, source=held).run(
        mode=mode, checkpoint_interval=0.03, chaos=chaos, checkpoint_dir=ck, restart_delay=0,
        retained_checkpoints=10_000, channel_state_memory=0)
    assert_each_kill_restored(res, chaos, min_kills=len(chaos.after))  # (all mid-job: held)
    assert bank.read_output(out) == bank.oracle(accounts, transfers, seed)
    storage = CheckpointStorage(ck)
    for cid in storage.completed_ids():
        assert bank.conserved_total(storage, cid, accounts) == bank.INITIAL * accounts, cid
    assert sum(c.inflight_records for c in res.checkpoints) > 0
    assert spill_files(ck) > 0, "nothing spilled: the run proves nothing about spill files"
    # A savepoint of a checkpoint that spilled is self-contained: its spill files come along.
    spilled = [c for c in storage.completed_ids() if any(".spill" in f for f in os.listdir(storage.dir_of(c)))]
    meta = storage.verify(spilled[-1])
    sp_storage, sp_meta = load_savepoint(write_savepoint(storage, meta, str(tmp_path / "sp")), meta.fingerprint, "")
    assert sp_meta.checkpoint_id == spilled[-1]
    assert bank.conserved_total(sp_storage, spilled[-1], accounts) == bank.INITIAL * accounts
