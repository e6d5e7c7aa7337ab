"""Golden-output recovery (Arroyo-style): run word count uninterrupted, then again with
checkpoints and real SIGKILLs of worker processes; the output must be identical, and equal
to a plain batch count. Every kill is a real SIGKILL of a real worker process (sources,
counters or the sink, chosen by a seeded RNG) right after a checkpoint completes, so each
is followed by a restore from that checkpoint, which the tests check."""

from __future__ import annotations

import collections
import os
from typing import Any

import pytest

from abs_engine import Dataflow
from abs_engine.testing import GatedSource, KillOnCheckpoints, fail_at
from operators import FileSink, TextFileSource
from tests.chaos_checks import assert_each_kill_restored
from tests.conftest import batch_word_count

pytestmark = pytest.mark.slow


def wordcount(src: str, out: str, parallelism: int, gate: str | None = None, name: str = "wordcount") -> Dataflow:
    """With ``gate``: each source subtask holds half-way through its lines until the file
    exists (KillOnCheckpoints opens it after its last kill: the job cannot end before them)."""
    flow = Dataflow(name, parallelism=parallelism)
    source: Any = TextFileSource(src, batch_bytes=1 << 15)
    if gate is not None:
        with open(src, "rb") as f:
            lines = sum(1 for _ in f)
        source = GatedSource(source, gate, after=lines // parallelism // 2)
    words = flow.source(source).flat_map(str.split)
    words.key_by().count_final().sink(FileSink(out), parallelism=1)
    return flow


def output_lines(path: str) -> collections.Counter[str]:
    with open(path, encoding="utf-8") as f:
        return collections.Counter(f.read().splitlines())


def as_counts(lines: collections.Counter[str]) -> collections.Counter[str]:
    out: collections.Counter[str] = collections.Counter()
    for line in lines.elements():
        w, n = line.split("\t")
        out[w] += int(n)
    return out


# Kill right after these checkpoint completions (counted across attempts); the sources hold
# half-way until the last kill is made, so every kill falls mid-job.
KILLS = (1, 3)


# Two parallelisms and intervals end to end; the protocol at others: the simulation's topologies.
@pytest.mark.parametrize("interval,parallelism", [(0.02, 2), (0.05, 4)])
def test_sigkill_after_checkpoints_gives_identical_output(medium_corpus, tmp_path, parallelism, interval):
    golden_out = str(tmp_path / "golden.tsv")
    wordcount(medium_corpus, golden_out, parallelism).run(mode="none")
    golden = output_lines(golden_out)
    assert as_counts(golden) == batch_word_count(medium_corpus)

    out, gate = str(tmp_path / "killed.tsv"), str(tmp_path / "gate")
    chaos = KillOnCheckpoints(KILLS, seed=parallelism * 100 + int(interval * 100), open_gate=gate)
    res = wordcount(medium_corpus, out, parallelism, gate).run(
        checkpoint_interval=interval, checkpoint_dir=str(tmp_path / "ckpt"), chaos=chaos, restart_delay=0
    )
    assert_each_kill_restored(res, chaos, min_kills=len(chaos.after))  # (all mid-job: held)
    assert output_lines(out) == golden


def test_user_exception_is_retried_from_checkpoint(small_corpus, tmp_path):
    out = str(tmp_path / "out.tsv")
    flow = Dataflow("wc", parallelism=2)
    words = flow.source(TextFileSource(small_corpus, batch_bytes=4096)).flat_map(str.split)
    words.map(fail_at(30_000, kind="raise"), name="flaky").key_by().count_final().sink(FileSink(out), parallelism=1)
    res = flow.run(checkpoint_interval=0.02, restart_delay=0)
    assert res.restarts == 1  # attempt 0 fails; attempt 1 lets every record through
    assert any("injected failure" in f or "flaky" in f for f in res.failures)
    assert as_counts(output_lines(out)) == batch_word_count(small_corpus)


def test_worker_kills_itself_mid_batch(small_corpus, tmp_path):
    out = str(tmp_path / "out.tsv")
    flow = Dataflow("wc", parallelism=1)
    words = flow.source(TextFileSource(small_corpus, batch_bytes=4096)).flat_map(str.split)
    words.map(fail_at(50_000, kind="kill")).key_by().count_final().sink(FileSink(out))
    res = flow.run(checkpoint_interval=0.02, restart_delay=0)
    assert res.restarts == 1
    assert "signal 9" in res.failures[0]
    assert as_counts(output_lines(out)) == batch_word_count(small_corpus)


def test_resume_from_final_checkpoint_commits_again_and_ends(small_corpus, tmp_path):
    """A job restored from its final checkpoint only re-commits (idempotently) and ends."""
    out, ck = str(tmp_path / "out.tsv"), str(tmp_path / "ckpt")
    wordcount(small_corpus, out, 2).run(checkpoint_interval=0.05, checkpoint_dir=ck)
    first = output_lines(out)
    os.truncate(out, os.path.getsize(out))  # unchanged; the sink must not append again
    res = wordcount(small_corpus, out, 2).run(checkpoint_interval=0.05, checkpoint_dir=ck, resume=True)
    assert res.restored_from and res.checkpoints == []
    assert output_lines(out) == first
    assert as_counts(first) == batch_word_count(small_corpus)


@pytest.mark.parametrize("parallelism", [2])
def test_stop_the_world_under_sigkill_gives_identical_output(medium_corpus, tmp_path, parallelism):
    """Stop-the-world must be as correct as ABS: the same golden-output test."""
    golden_out = str(tmp_path / "golden.tsv")
    wordcount(medium_corpus, golden_out, parallelism).run(mode="none")
    out, gate = str(tmp_path / "killed.tsv"), str(tmp_path / "gate")
    chaos = KillOnCheckpoints((1, 2, 3), seed=40 + parallelism, open_gate=gate)
    res = wordcount(medium_corpus, out, parallelism, gate).run(
        mode="stop-the-world", checkpoint_interval=0.1, checkpoint_dir=str(tmp_path / "ckpt"), chaos=chaos,
        restart_delay=0)
    assert_each_kill_restored(res, chaos, min_kills=len(chaos.after))  # (all mid-job: held)
    assert output_lines(out) == output_lines(golden_out)
    assert as_counts(output_lines(out)) == batch_word_count(medium_corpus)
