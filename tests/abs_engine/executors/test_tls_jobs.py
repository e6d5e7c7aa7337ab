"""Jobs with ``tls=True``: word count under SIGKILLs equals the batch oracle, on local
workers and on the Spark executor reading through the (TLS) partition server."""

from __future__ import annotations


import pytest

from abs_engine.testing import KillOnCheckpoints
from tests.chaos_checks import assert_each_kill_restored
from tests.conftest import batch_word_count, batch_word_count_dir
from tests.operators.test_spark import counts_file

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_wordcount_with_tls_survives_sigkills_exactly(medium_corpus, tmp_path):
    # examples.wordcount's shape (test_recovery's word count), its source held half-way until the kills
    from tests.abs_engine.executors.test_recovery import wordcount

    out, gate = str(tmp_path / "counts.tsv"), str(tmp_path / "gate")
    chaos = KillOnCheckpoints([1, 2], seed=3, open_gate=gate)
    res = wordcount(medium_corpus, out, 2, gate).run(
        tls=True, checkpoint_interval=0.1, checkpoint_dir=str(tmp_path / "ck"), chaos=chaos, restart_delay=0)
    assert_each_kill_restored(res, chaos, min_kills=len(chaos.after))  # (all mid-job: held)
    assert counts_file(out) == batch_word_count(medium_corpus)
    # the material never reaches the checkpoint directory
    for path in (tmp_path / "ck").rglob("*"):
        if path.is_file():
            assert b"PRIVATE KEY" not in path.read_bytes(), path


@pytest.mark.spark
def test_wordcount_with_tls_on_the_spark_executor_from_a_spark_source(spark, text_dir, tmp_path):
    from operators import FileSink
    from operators.spark import SparkSource

    from abs_engine import Dataflow

    out = str(tmp_path / "counts.tsv")
    flow = Dataflow("wordcount-tls", parallelism=2)
    flow.source(SparkSource.text(text_dir, spark=spark), name="read").flat_map(str.split, name="split") \
        .key_by().count_final(name="count").sink(FileSink(out), name="write", parallelism=1)
    chaos = KillOnCheckpoints([1], seed=2)
    res = flow.run(tls=True, executor="spark", spark=spark, checkpoint_interval=0.05, chaos=chaos, restart_delay=0)
    assert_each_kill_restored(res, chaos, min_kills=1)
    assert counts_file(out) == batch_word_count_dir(text_dir)
