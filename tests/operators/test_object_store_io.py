"""Sinks and staging on an object store (the S3-compatible server the tests start on
loopback): the streaming source stages its micro-batches there and the Parquet sink
publishes its parts there, under SIGKILLs, with checkpoints on the same store; the output,
read back from S3, equals the batch oracle."""

from __future__ import annotations

import pytest

from abs_engine.errors import InputError
from abs_engine.testing import GatedSource, KillOnCheckpoints
from operators import FileSink
from operators.parquet import ParquetSink
from operators.spark_stream import SparkStreamSource
from tests.chaos_checks import assert_each_kill_restored
from tests.conftest import batch_word_count_dir
from tests.operators.test_spark import counts_file, lines_in, wordcount

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.timeout(240)]


def read_parquet_from_s3(uri: str) -> list[tuple[str, int]]:
    import pyarrow.parquet as pq

    from abs_engine import fs

    store = fs.Store(uri)
    names = [n for n in store.list() if n.startswith("part-")]
    rows: list[tuple[str, int]] = []
    for n in names:
        table = pq.read_table(store.path(n), filesystem=store.fs)
        rows += zip(table.column("word").to_pylist(), table.column("count").to_pylist())
    assert not [n for n in store.list() if n.startswith(".tmp-")]  # nothing half-written is left
    return sorted(rows)


def test_streaming_staging_and_parquet_output_on_s3_under_kills_are_exact(spark, s3_server, text_dir, tmp_path):
    sdf = spark.readStream.option("maxFilesPerTrigger", 1).text(text_dir)
    src = SparkStreamSource(sdf, s3_server("stream-staging"), available_now=True,
                            spark_checkpoint=str(tmp_path / "spark-progress"))
    out, gate = s3_server("parquet-out"), tmp_path / "gate"
    # Bounded (available_now): each source subtask holds half-way through its lines until the
    # chaos has made its kills.
    held = GatedSource(src, gate, after=lines_in(text_dir) // 2 // 2)
    chaos = KillOnCheckpoints([1, 2], seed=4, open_gate=gate)
    res = wordcount(held, ParquetSink(out, columns=["word", "count"])).run(
        checkpoint_interval=0.05, checkpoint_dir=s3_server("stream-ck"), chaos=chaos, restart_delay=0)
    assert_each_kill_restored(res, chaos, min_kills=len(chaos.after))  # (all mid-job: held)
    assert read_parquet_from_s3(out) == sorted(batch_word_count_dir(text_dir).items())


def test_remote_staging_needs_a_place_for_sparks_own_progress(spark, s3_server, text_dir, tmp_path):
    sdf = spark.readStream.text(text_dir)
    with pytest.raises(InputError, match="spark_checkpoint="):
        SparkStreamSource(sdf, s3_server("nowhere"))
    src = SparkStreamSource(sdf, f"file://{tmp_path}/staging", available_now=True)
    out = str(tmp_path / "out.tsv")
    wordcount(src, FileSink(out)).run(checkpoint_interval=0.05)
    assert counts_file(out) == batch_word_count_dir(text_dir)
