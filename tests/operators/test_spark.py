"""PySpark sources and sinks against a real local Spark (one session for the whole run)."""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import sys
from typing import Any

import cloudpickle
import pytest

from abs_engine import Dataflow, InputError, JobFailed
from abs_engine.testing import GatedSource, KillOnCheckpoints, fastest_run
from operators import FileSink
from operators.base import OperatorContext
from operators.parquet import ParquetSink
from operators.spark import SourceChangedError, SparkSource
from operators.spark_stream import SparkStreamSource
from tests.chaos_checks import assert_each_kill_restored
from tests.conftest import batch_word_count_dir

pytestmark = [pytest.mark.slow, pytest.mark.spark]


def counts_file(path: str) -> collections.Counter[str]:
    out: collections.Counter[str] = collections.Counter()
    with open(path, encoding="utf-8") as f:
        for line in f:
            w, n = line.rstrip("\n").split("\t")
            assert w not in out
            out[w] = int(n)
    return out


def warm_golden(build) -> float:
    """The fastest of two uninterrupted runs (the first warms Spark's JVM)."""
    return fastest_run(lambda: build().run(mode="none"))


def lines_in(path: str) -> int:
    """The lines of the text files in the directory ``path`` (the records SparkSource.text reads)."""
    return sum(1 for n in os.listdir(path) for _ in open(os.path.join(path, n), "rb"))


def wordcount(source, sink, parallelism=2) -> Dataflow:
    flow = Dataflow("wc", parallelism=parallelism)
    flow.source(source).flat_map(str.split).key_by().count_final().sink(sink, parallelism=1)
    return flow


@pytest.mark.parametrize("parallelism", [2])  # (parallelism 1: the offset tests below read one subtask's share)
def test_wordcount_through_spark_with_sigkills_is_exact(spark, text_dir, tmp_path, parallelism):
    golden = str(tmp_path / "golden.tsv")
    warm_golden(lambda: wordcount(SparkSource.text(text_dir, spark=spark), FileSink(golden), parallelism))
    expected = batch_word_count_dir(text_dir)
    assert counts_file(golden) == expected
    out, gate = str(tmp_path / "killed.tsv"), tmp_path / "gate"
    src = SparkSource.text(text_dir, spark=spark)
    # Each source subtask holds half-way through its lines until the chaos has made its kills.
    held = GatedSource(src, gate, after=lines_in(text_dir) // parallelism // 2)
    chaos = KillOnCheckpoints([1, 2, 3], seed=parallelism, open_gate=gate)
    res = wordcount(held, FileSink(out), parallelism).run(checkpoint_interval=0.05, chaos=chaos, restart_delay=0)
    assert_each_kill_restored(res, chaos, min_kills=len(chaos.after))  # (all mid-job: held)
    assert counts_file(out) == expected
    assert src.delivered_rows() >= sum(1 for n in os.listdir(text_dir) for _ in open(os.path.join(text_dir, n)))


def split_words(batch):
    import pyarrow as pa
    import pyarrow.compute as pc

    words = pc.list_flatten(pc.utf8_split_whitespace(batch.column("value")))
    return pa.record_batch([words.filter(pc.not_equal(words, ""))], names=["word"])


def test_spark_hands_its_arrow_batches_on_whole_and_exactly_once_under_sigkills(spark, text_dir, tmp_path):
    out, gate = str(tmp_path / "vectorized.tsv"), tmp_path / "gate"
    flow = Dataflow("vwc", parallelism=2)
    # A record is an Arrow batch: one a file (a partition each, under Spark's 10,000 rows a
    # batch), 3 a subtask; each subtask holds after 1 until the chaos has made its kills.
    source = GatedSource(SparkSource.text(text_dir, spark=spark, batches=True), gate,
                         after=len(os.listdir(text_dir)) // 2 // 2)
    flow.source(source, name="lines").map_batches(
        split_words).aggregate_batches("word").sink(FileSink(out), parallelism=1)
    chaos = KillOnCheckpoints([1, 2], seed=5, open_gate=gate)
    res = flow.run(checkpoint_interval=0.05, chaos=chaos, restart_delay=0)
    assert_each_kill_restored(res, chaos, min_kills=len(chaos.after))  # (all mid-job: held)
    assert counts_file(out) == batch_word_count_dir(text_dir)


def test_resume_from_a_middle_offset_reads_only_what_it_must(spark, text_dir):
    src = SparkSource.text(text_dir, spark=spark)
    src.check()
    src.driver_start()
    try:
        assert src.num_partitions >= 4
        rows_by_partition = [r for r in src._served.rdd.glom().map(len).collect()]
        all_rows = [r[0] for r in src._served.collect()]  # partition order, as Spark numbers them
        worker = cloudpickle.loads(cloudpickle.dumps(src))  # what a subtask gets: no DataFrame
        assert worker._df is None
        worker.open(OperatorContext("read", 0, 1, 0, True))
        start_partition, start_row = 3, 500
        worker.restore({"fingerprint": src.fingerprint, "partitions": src.num_partitions,
                        "next": start_partition, "rows": start_row})
        before = src.delivered_rows()
        got = []
        while (b := worker.read_batch()) is not None:
            got += b
        worker.close()
        offset = sum(rows_by_partition[:start_partition]) + start_row
        assert got == all_rows[offset:]
        assert src.delivered_rows() - before == len(all_rows) - offset  # nothing before it delivered
    finally:
        src.driver_stop()


@pytest.mark.parametrize("before,after", [(2, 3), (3, 1), (1, 4)])
def test_rescaled_offsets_read_every_row_exactly_once(spark, text_dir, before, after):
    """Old subtasks read different amounts, snapshot; their partitions left (one part-read
    each) are dealt out to the new subtasks, which together read every other row once."""
    src = SparkSource.text(text_dir, spark=spark)
    src.check()
    src.driver_start()
    try:
        all_rows = [r[0] for r in src._served.collect()]
        read: list[str] = []
        old = []
        for i in range(before):
            w = cloudpickle.loads(cloudpickle.dumps(src))
            w.open(OperatorContext("read", i, before, 0, False))
            for _ in range(1):  # a batch: part of a partition, or all of its first
                b = w.read_batch()
                if b is None:
                    break
                read += b
            old.append(w.snapshot(1))
            w.close()
        assert 0 < len(read) < len(all_rows)
        for i in range(after):
            w = cloudpickle.loads(cloudpickle.dumps(src))
            w.open(OperatorContext("read", i, after, 1, True))
            w.restore(w.rescale_state(old, i, after, lambda k: True))
            again = w.snapshot(2)  # a snapshot of a rescaled subtask restores to where it was
            w2 = cloudpickle.loads(cloudpickle.dumps(src))
            w2.open(OperatorContext("read", i, after, 2, True))
            w2.restore(again)
            while (b := w2.read_batch()) is not None:
                read += b
            w.close()
            w2.close()
        assert collections.Counter(read) == collections.Counter(all_rows)
    finally:
        src.driver_stop()


def test_restore_into_changed_input_is_refused(spark, text_dir, tmp_path):
    src = SparkSource.text(text_dir, spark=spark)
    src.driver_start()
    src.driver_stop()
    worker = cloudpickle.loads(cloudpickle.dumps(src))
    worker.open(OperatorContext("read", 0, 1, 0, True))
    with pytest.raises(SourceChangedError, match="no longer matches"):
        worker.restore({"fingerprint": "0" * 16, "partitions": src.num_partitions + 1, "next": 0, "rows": 0})


def test_resume_after_input_files_changed_fails_clearly(spark, text_dir, tmp_path):
    d = tmp_path / "in"
    shutil.copytree(text_dir, d)
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out.tsv")
    def held() -> GatedSource[str]:  # the first run is stopped mid-job, always
        return GatedSource(SparkSource.text(str(d), spark=spark), tmp_path / "gate", after=1)

    res = wordcount(held(), FileSink(out)).run(
        checkpoint_interval=0.05, checkpoint_dir=ck, stop_when=lambda r: len(r.checkpoints) >= 2)
    assert res.cancelled
    (tmp_path / "gate").touch()
    with open(d / "part-0.txt", "a") as f:
        f.write("an extra line\n")
    with pytest.raises(JobFailed, match="no longer matches the DataFrame"):
        wordcount(held(), FileSink(out)).run(checkpoint_interval=0.05, checkpoint_dir=ck, resume=True)


def test_streaming_source_counts_each_batch_once_under_kills(spark, text_dir, tmp_path):
    sdf = spark.readStream.option("maxFilesPerTrigger", 1).text(text_dir)
    src = SparkStreamSource(sdf, tmp_path / "staging", available_now=True)
    out, gate = str(tmp_path / "out.tsv"), tmp_path / "gate"
    # Bounded (available_now): each source subtask holds half-way through its lines until the
    # chaos has made its kills.
    held = GatedSource(src, gate, after=lines_in(text_dir) // 2 // 2)
    chaos = KillOnCheckpoints([1, 2], seed=1, open_gate=gate)
    res = wordcount(held, FileSink(out)).run(checkpoint_interval=0.05, chaos=chaos, restart_delay=0)
    assert_each_kill_restored(res, chaos, min_kills=len(chaos.after))  # (all mid-job: held)
    assert counts_file(out) == batch_word_count_dir(text_dir)


def test_streaming_redelivery_after_a_driver_crash_is_not_counted_twice(spark, text_dir, tmp_path):
    """Run until some batches are delivered and checkpointed, stop the whole job (as a driver
    crash would), let Spark re-deliver what it had not committed, resume the engine."""
    staging, ck, out = tmp_path / "staging", str(tmp_path / "ck"), str(tmp_path / "out.tsv")

    def source() -> SparkStreamSource:
        sdf = spark.readStream.option("maxFilesPerTrigger", 1).text(text_dir)
        return SparkStreamSource(sdf, staging, available_now=True)

    first = source()
    res = wordcount(first, FileSink(out)).run(
        checkpoint_interval=0.05, checkpoint_dir=ck,
        stop_when=lambda r: len(r.checkpoints) >= 3 and len(os.listdir(staging)) >= 3)
    assert res.cancelled
    again = source()
    # Spark's own redelivery of a batch is the same batch id: staging it again is harmless.
    staged = sorted(n for n in os.listdir(staging) if n.startswith("batch-"))
    assert staged
    wordcount(again, FileSink(out)).run(checkpoint_interval=0.05, checkpoint_dir=ck, resume=True)
    assert counts_file(out) == batch_word_count_dir(text_dir)


def test_parquet_sink_after_crashes_equals_uninterrupted_output(spark, text_dir, tmp_path):
    def flow(path, gate=None):
        """With ``gate``: each source subtask holds half-way through its lines until the file exists."""
        f = Dataflow("wc", parallelism=2)
        source: Any = SparkSource.text(text_dir, spark=spark)
        if gate is not None:
            source = GatedSource(source, gate, after=lines_in(text_dir) // 2 // 2)
        f.source(source).flat_map(str.split).key_by().count_final().sink(
            ParquetSink(path, columns=["word", "count"]), parallelism=2)
        return f

    flow(str(tmp_path / "golden")).run(mode="none")
    gate = tmp_path / "gate"
    chaos = KillOnCheckpoints([1, 2, 3], seed=5, open_gate=gate)
    res = flow(str(tmp_path / "killed"), gate).run(checkpoint_interval=0.05, chaos=chaos, restart_delay=0)
    assert_each_kill_restored(res, chaos, min_kills=len(chaos.after))  # (all mid-job: held)

    def read(p):
        return sorted(tuple(r) for r in spark.read.parquet(p).collect())

    golden = read(str(tmp_path / "golden"))
    assert golden == sorted(batch_word_count_dir(text_dir).items())
    assert read(str(tmp_path / "killed")) == golden


# ---- bad input ---------------------------------------------------------------------------


def test_missing_path(spark, tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        SparkSource.text(tmp_path / "nope", spark=spark)


def test_empty_dataframe(spark, tmp_path):
    empty = spark.createDataFrame([], "value string")
    flow = wordcount(SparkSource(empty), FileSink(str(tmp_path / "o.tsv")))
    with pytest.raises(InputError, match="empty"):
        flow.run()


def test_non_text_column(spark, tmp_path):
    df = spark.range(10).withColumnRenamed("id", "value")
    flow = wordcount(SparkSource(df, expect=str), FileSink(str(tmp_path / "o.tsv")))
    with pytest.raises(InputError, match="not string"):
        flow.run()


def test_corrupt_parquet(spark, tmp_path):
    d = tmp_path / "pq"
    spark.createDataFrame([("a",), ("b",)], "value string").write.parquet(str(d))
    victim = next(p for p in sorted(d.iterdir()) if p.suffix == ".parquet")
    victim.write_bytes(b"PAR1 this is not a parquet file PAR1")
    with pytest.raises((InputError, JobFailed)) as ei:
        wordcount(SparkSource.parquet(d, spark=spark, column="value"), FileSink(str(tmp_path / "o.tsv"))).run(
            restart_attempts=3, restart_delay=0)
    msg = str(ei.value)
    if isinstance(ei.value, JobFailed):
        # isEmpty() stopped at a good file; a worker then hit the corrupt one: no retries.
        assert "Spark failed reading partition" in msg and "cannot be retried" in msg, msg
    else:
        assert "Spark cannot read" in msg, msg


def test_spark_without_java_fails_clearly(tmp_path, small_corpus):
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "SPARK_HOME")}
    env["JAVA_HOME"] = str(tmp_path / "no-java")
    env["PATH"] = "/usr/bin/nonexistent"
    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "wordcount.py")
    p = subprocess.run([sys.executable, example, "--input", small_corpus, "--output", str(tmp_path / "o.tsv")],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    assert "Spark could not start" in p.stderr and "Java" in p.stderr


def test_a_dataframe_of_a_stopped_session_is_a_clear_error_not_a_java_npe() -> None:
    """Starting a session on another master stops the embedded one: a DataFrame made on it
    before would fail deep in Spark (a NullPointerException); the source says what happened."""
    from types import SimpleNamespace

    stopped = SimpleNamespace(isStopped=lambda: True)
    df = SimpleNamespace(sparkSession=SimpleNamespace(sparkContext=SimpleNamespace(
        _jsc=SimpleNamespace(sc=lambda: stopped))))
    with pytest.raises(InputError, match="SparkSession that has been stopped since"):
        SparkSource(df).driver_start()


def test_a_stopped_streaming_query_is_not_taken_for_the_end_of_the_stream(tmp_path):
    """driver_stop (a cancelled or stopped job) ends the query; the thread waiting on it must
    not write the end marker then: the next run would stop reading before the stream's end
    (it once lost half a corpus when that thread ran after the next run had started)."""
    import threading as _threading

    from operators.spark_stream import END

    class Query:
        def __init__(self) -> None:
            self.done = _threading.Event()

        def awaitTermination(self) -> None:
            self.done.wait()

        def stop(self) -> None:
            self.done.set()

        def exception(self) -> None:
            return None

    for finished in (False, True):
        src = object.__new__(SparkStreamSource)
        src.staging, src._dir, src.available_now = str(tmp_path / f"s{finished}"), None, True
        src._staged().make_root()
        src._query = q = Query()
        waiter = _threading.Thread(target=src._await_end)
        waiter.start()
        if finished:
            q.stop()  # the query processed what was there and stopped by itself
        else:
            src.driver_stop()
        waiter.join(10)
        assert src._staged().exists(END) is finished
