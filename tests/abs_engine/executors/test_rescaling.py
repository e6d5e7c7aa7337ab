"""Rescaling on restore, exactly once: a job stopped at one parallelism resumes at another
(2 -> 3, 4 -> 1, 1 -> 4) under SIGKILLs, and its output equals the batch oracle; keyed
state is re-split by key group, the file source's unread byte ranges dealt out."""

from __future__ import annotations

import collections
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from abs_engine import Dataflow
from abs_engine.checkpoint.storage import CheckpointStorage
from abs_engine.errors import JobFailed
from abs_engine.testing import CapturingSink, GatedSource, KillOnCheckpoints, TestingSource
from operators import FileSink, TextFileSource
from tests.abs_engine.executors.test_recovery import as_counts, output_lines
from tests.chaos_checks import assert_each_kill_restored
from tests.conftest import batch_word_count

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def held_wordcount(src: str, out: str, parallelism: int, gate: Path, after: int) -> Dataflow:
    """test_recovery's word count, each source subtask held after ``after`` lines until
    ``gate`` exists (both runs of a rescale need the gated source: its state is the gate's)."""
    flow = Dataflow("wordcount", parallelism=parallelism)
    source = GatedSource(TextFileSource(src, batch_bytes=1 << 15), gate, after=after)
    flow.source(source, name="lines").flat_map(str.split, name="split").key_by().count_final(name="count").sink(
        FileSink(out), name="write", parallelism=1)
    return flow


def resumed_hold(ck: str, checkpoint_id: int, source: str, total: int, parallelism: int) -> int:
    """The ``after`` of a GatedSource (operator ``source``, ``total`` records) resumed from
    ``checkpoint_id`` at ``parallelism``: about half-way through what each new subtask has
    left. (A rescaled gate counts on from the most any old subtask had read.)"""
    storage = CheckpointStorage(ck)
    meta = storage.load_metadata(checkpoint_id)
    states = [storage.read_state(checkpoint_id, t, meta) for t in meta.tasks]
    reads = [int(s[source]["read"]) for s in states if source in s]
    assert reads, (checkpoint_id, meta.tasks)
    return max(reads) + (total - sum(reads)) // parallelism // 2


@pytest.mark.parametrize("before,after", [(2, 3)])  # (and down, 4->1: the pipeline's below)
def test_wordcount_resumed_at_another_parallelism_under_sigkills_is_exact(medium_corpus, tmp_path, before, after):
    ck, out, gate, gate2 = str(tmp_path / "ck"), str(tmp_path / "out.tsv"), tmp_path / "gate", tmp_path / "gate2"
    with open(medium_corpus, "rb") as f:
        lines = sum(1 for _ in f)
    first = held_wordcount(medium_corpus, out, before, gate, lines // before // 2).run(
        checkpoint_interval=0.05, checkpoint_dir=ck, stop_when=lambda r: len(r.checkpoints) >= 1)
    # Stopped mid-job (held half-way): its newest checkpoint holds partial counts and offsets.
    assert first.cancelled and not any(c.final for c in first.checkpoints)
    last = max(c.checkpoint_id for c in first.checkpoints)
    # Held again half-way through what is left, until the kills (every one mid-job, at any speed).
    chaos = KillOnCheckpoints([1, 2], seed=before * 10 + after, open_gate=gate2)
    hold = resumed_hold(ck, last, "lines", lines, after)
    res = held_wordcount(medium_corpus, out, after, gate2, hold).run(
        checkpoint_interval=0.05, checkpoint_dir=ck, resume=True, chaos=chaos, restart_delay=0)
    assert res.restored_from[0] == last
    assert as_counts(output_lines(out)) == batch_word_count(medium_corpus)
    # The run began with a restore (from `last`); every kill after it restored once more.
    assert_each_kill_restored(replace(res, restored_from=res.restored_from[1:]), chaos, min_kills=len(chaos.after))


class Remember(TestingSource):
    """A source whose state has no rescaling rule (the default refuses)."""

    def rescale_state(self, old, index, parallelism, owns):  # type: ignore[no-untyped-def]
        from operators.base import Source

        return Source.rescale_state(self, old, index, parallelism, owns)


def test_an_operator_whose_state_cannot_be_split_is_refused_naming_it(tmp_path):
    ck = str(tmp_path / "ck")

    def flow(p: int) -> Dataflow:
        f = Dataflow("refuse", parallelism=p)
        # Held after 100 records (the gate never opens): the first run cannot finish before
        # its second checkpoint, however fast the machine (it once did, with 100,000 records).
        source = GatedSource(Remember(range(1_000), batch_size=10), tmp_path / "gate", after=100)
        # One output for both runs: the second restores what the first committed there (another
        # path made the sink's restore fail too, and which failure came first was a race).
        f.source(source, name="remember").sink(CapturingSink(tmp_path / "c"), parallelism=1)
        return f

    assert flow(1).run(checkpoint_interval=0.01, checkpoint_dir=ck,
                       stop_when=lambda r: len(r.checkpoints) >= 2).cancelled
    with pytest.raises(JobFailed) as info:
        flow(2).run(checkpoint_dir=ck, resume=True, restart_attempts=3)
    assert info.value.operator == "remember" and "cannot redistribute" in str(info.value)
    assert "cannot be retried" in str(info.value)  # refused at once, not after every restart


K1, K2 = 5_000, 97


def stage1_key(i: int) -> int:
    return i % K1


def stage2_key(r: tuple[int, int]) -> int:
    return r[1] % K2


def pipeline(n: int, sink: CapturingSink, parallelism: int, gate: Path | None = None, hold: int = 0) -> Dataflow:
    """The benchmark's pipeline shape with an exact oracle: two keyed shuffles of running
    counts, every record emitted downstream and captured (so each emission must happen once).
    With ``gate``, each source subtask holds after ``hold`` records until the file exists."""
    from operators import RangeSource

    flow = Dataflow("pipeline", parallelism=parallelism)
    source: Any = RangeSource(n, batch_size=1_000)
    if gate is not None:
        source = GatedSource(source, gate, after=hold)
    s1 = flow.source(source, name="source").map(stage1_key, name="k1").key_by().count(
        name="count1")
    s1.key_by(stage2_key).count(name="count2").sink(sink, name="sink", parallelism=1)
    return flow


def pipeline_oracle(n: int) -> collections.Counter[tuple[int, int]]:
    per_key = collections.Counter(i % K1 for i in range(n))
    stage1 = [(k, c) for k, m in per_key.items() for c in range(1, m + 1)]
    per_key2 = collections.Counter(stage2_key(r) for r in stage1)
    return collections.Counter((k, c) for k, m in per_key2.items() for c in range(1, m + 1))


@pytest.mark.parametrize("before,after", [(4, 1)])  # (and up, 2->3: word count's above)
def test_pipeline_resumed_at_another_parallelism_emits_every_record_once(tmp_path, before, after):
    n, ck, gate = 200_000, str(tmp_path / "ck"), tmp_path / "gate"
    hold = n // (2 * before)  # half the input, then held until the gate opens: stopped mid-job
    sink = CapturingSink(tmp_path / "out")
    first = pipeline(n, sink, before, gate, hold).run(checkpoint_interval=0.02, checkpoint_dir=ck,
                                                      stop_when=lambda r: len(r.checkpoints) >= 1)
    assert first.cancelled and not any(c.final for c in first.checkpoints)  # stopped mid-job
    last = max(c.checkpoint_id for c in first.checkpoints)
    # Held again half-way through what is left, until the kills (every one mid-job, at any speed).
    gate2 = tmp_path / "gate2"
    chaos = KillOnCheckpoints([1, 2], seed=before + after, open_gate=gate2)
    res = pipeline(n, sink, after, gate2, resumed_hold(ck, last, "source", n, after)).run(
        checkpoint_interval=0.05, checkpoint_dir=ck, resume=True, chaos=chaos, restart_delay=0)
    assert res.restored_from[0] == last
    assert collections.Counter(tuple(r) for r in sink.records()) == pipeline_oracle(n)
    assert_each_kill_restored(replace(res, restored_from=res.restored_from[1:]), chaos, min_kills=len(chaos.after))


def audited(records: list[int], sink: CapturingSink, audit: CapturingSink | None, parallelism: int,
            gate: Path, batch_size: int = 100, hold: int | None = None) -> Dataflow:
    """A count per key, and (when ``audit`` is given) a second keyed branch with a sink of its
    own. Each source subtask holds after ``hold`` records (default: a third of its records)
    until ``gate`` exists."""
    f = Dataflow("audited", parallelism=parallelism)
    hold = len(records) // (3 * parallelism) if hold is None else hold
    held = GatedSource(TestingSource(records, batch_size=batch_size), gate, after=hold)
    src = f.source(held, name="source")
    src.key_by(lambda x: x % 1000).count(name="count").sink(sink, name="sink", parallelism=1)
    if audit is not None:
        src.filter(lambda x: x % 7 == 0, name="sevens").key_by().count(name="audit").sink(
            audit, name="audit_sink", parallelism=1)
    return f


@pytest.mark.parametrize("after", [2, 3])
def test_a_branch_removed_with_allow_non_restored_state_keeps_the_rest_exact(tmp_path, after):
    records, ck, gate = list(range(60_000)), str(tmp_path / "ck"), tmp_path / "gate"
    sink, audit = CapturingSink(tmp_path / "out"), CapturingSink(tmp_path / "audit")
    first = audited(records, sink, audit, 2, gate, batch_size=20).run(
        checkpoint_interval=0.02, checkpoint_dir=ck, stop_when=lambda r: len(r.checkpoints) >= 2)
    assert first.cancelled
    last = max(c.checkpoint_id for c in first.checkpoints)
    # Held again half-way through what is left, until the kill (mid-job, at any speed).
    gate2 = tmp_path / "gate2"
    hold = resumed_hold(ck, last, "source", len(records), after)
    with pytest.raises(Exception) as info:  # the audit branch's state has nowhere to go
        audited(records, sink, None, after, gate2, hold=hold).run(checkpoint_dir=ck, resume=True, restart_attempts=0)
    assert "audit" in str(info.value) and "allow_non_restored_state" in str(info.value)
    chaos = KillOnCheckpoints([1], seed=after, open_gate=gate2)
    res = audited(records, sink, None, after, gate2, hold=hold).run(
        checkpoint_dir=ck, resume=True, allow_non_restored_state=True, checkpoint_interval=0.05, chaos=chaos,
        restart_delay=0)
    assert res.restored_from[0] == last
    assert_each_kill_restored(replace(res, restored_from=res.restored_from[1:]), chaos, min_kills=len(chaos.after))
    seen: collections.Counter[int] = collections.Counter()
    oracle: collections.Counter[tuple[int, int]] = collections.Counter()
    for x in records:
        seen[x % 1000] += 1
        oracle[(x % 1000, seen[x % 1000])] += 1
    assert collections.Counter(tuple(r) for r in sink.records()) == oracle
