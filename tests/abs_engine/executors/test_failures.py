"""Bad input gets a clear, typed error naming the problem and the operator, never a hang."""

from __future__ import annotations

import shutil
import time

import pytest

from abs_engine import CheckpointError, Dataflow, InputError, JobFailed
from abs_engine.errors import CheckpointErrorReason
from abs_engine.testing import CapturingSink, TestingSource
from operators import FileSink, Source, TextFileSource
from operators.keyed import CountFinal

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


def test_missing_input_file_fails_before_starting_workers(tmp_path):
    flow = Dataflow("wc")
    flow.source(TextFileSource(tmp_path / "nope.txt")).sink(FileSink(tmp_path / "out"))
    with pytest.raises(InputError, match="nope.txt"):
        flow.run()


def test_output_directory_missing(tmp_path, small_corpus):
    flow = Dataflow("wc")
    flow.source(TextFileSource(small_corpus)).sink(FileSink(tmp_path / "no" / "such" / "out.tsv"))
    with pytest.raises(InputError, match="does not exist"):
        flow.run()


def boom(x):
    if x == 3:
        return 1 // 0
    return x


def test_user_function_that_always_raises_fails_with_its_traceback(tmp_path):
    flow = Dataflow("raises")
    flow.source(TestingSource(range(10))).map(boom, name="divide").sink(CapturingSink(tmp_path / "c"))
    with pytest.raises(JobFailed) as ei:
        flow.run(restart_attempts=2, restart_delay=0)
    err = ei.value
    assert err.operator == "divide"
    assert "ZeroDivisionError" in str(err) and "1 // 0" in str(err)
    # The same record failed the same operator again after a restart: a poison record, so
    # the job stops there instead of using up its restart attempts.
    assert "divide" in str(err) and "poison record" in str(err) and "record: 3" in str(err)


class OpaqueState(CountFinal):
    def snapshot(self, checkpoint_id):
        return {"counts": object()}


@pytest.mark.parametrize("fork", [False, True], ids=["inline", "forked"])
def test_state_msgpack_cannot_encode_fails_at_once_naming_the_operator(tmp_path, fork):
    flow = Dataflow("badstate")
    flow.source(TestingSource(["a", "b", "a"])).key_by().apply_keyed(OpaqueState(), name="opaque").sink(
        CapturingSink(tmp_path / "c")
    )
    with pytest.raises(JobFailed) as ei:
        flow.run(restart_attempts=5, restart_delay=0, snapshot_encoding="fork" if fork else "inline")
    assert ei.value.operator == "opaque"
    assert "cannot be serialised with msgpack" in str(ei.value)
    assert "cannot be retried" in str(ei.value)  # deterministic: no pointless restarts


def test_record_msgpack_cannot_encode_fails_naming_the_producer(tmp_path):
    flow = Dataflow("badrecord", parallelism=1)
    flow.source(TestingSource([1, 2, 3])).map(lambda x: object(), name="make_object").rebalance().map(
        str, parallelism=2
    ).sink(CapturingSink(tmp_path / "c"))
    with pytest.raises(JobFailed) as ei:
        flow.run(restart_attempts=5, restart_delay=0)
    assert ei.value.operator == "make_object"
    assert "a record of operator 'make_object' cannot be serialised" in str(ei.value)


def test_checkpoint_directory_of_another_run_is_refused(tmp_path):
    ck = tmp_path / "ck"
    flow = Dataflow("a")
    flow.source(TestingSource(range(100))).sink(CapturingSink(tmp_path / "c"))
    flow.run(checkpoint_dir=str(ck))
    with pytest.raises(CheckpointError) as ei:
        flow.run(checkpoint_dir=str(ck))
    assert ei.value.reason is CheckpointErrorReason.DIRECTORY_NOT_EMPTY
    assert "resume" in str(ei.value)


def test_resume_into_a_different_plan_is_refused(tmp_path):
    ck = tmp_path / "ck"
    flow = Dataflow("a", parallelism=1)
    flow.source(TestingSource(range(100))).sink(CapturingSink(tmp_path / "c"))
    flow.run(checkpoint_dir=str(ck))
    other = Dataflow("a", parallelism=1)
    other.source(TestingSource(range(100))).map(str, name="added").sink(CapturingSink(tmp_path / "d"))
    with pytest.raises(CheckpointError) as ei:
        other.run(checkpoint_dir=str(ck), resume=True)
    assert ei.value.reason is CheckpointErrorReason.PLAN_MISMATCH
    assert "a change of parallelism alone is rescaled" in str(ei.value)


def test_bad_config_values_are_rejected():
    flow = Dataflow("a")
    flow.source(TestingSource([1])).sink(FileSink("/tmp/x"))
    with pytest.raises(ValueError, match="mode"):
        flow.run(mode="sometimes")
    with pytest.raises(ValueError, match="checkpoint_interval"):
        flow.run(checkpoint_interval=0)
    with pytest.raises(ValueError, match="pass mode='none'"):  # a ValueError naming the fix, not a TypeError
        flow.run(checkpoint_interval=None)
    with pytest.raises(ValueError, match="checkpoint_interval"):
        flow.run(checkpoint_interval="1")


class Endless(Source):
    """Emits nothing and never ends: keeps a job running until ``stop_when`` cancels it."""

    def read_batch(self):
        time.sleep(0.005)  # an idle source polls (as SparkStreamSource does); not synchronisation
        return []

    def snapshot(self, checkpoint_id):
        return 0

    def restore(self, state):
        pass


def file_and_endless(path: str, out) -> Dataflow:
    flow = Dataflow("changed", parallelism=2)
    lines = flow.source(TextFileSource(path, batch_bytes=4096), name="read")
    lines.union(flow.source(Endless(), name="endless")).sink(CapturingSink(out), parallelism=1)
    return flow


def after_a_periodic_checkpoint(result) -> bool:
    return any(not c.final for c in result.checkpoints)


def test_resume_after_the_input_file_changed_fails_at_once_naming_it(tmp_path, small_corpus):
    path, ck = str(tmp_path / "in.txt"), str(tmp_path / "ck")
    shutil.copyfile(small_corpus, path)
    first = file_and_endless(path, tmp_path / "out").run(
        checkpoint_interval=0.02, checkpoint_dir=ck, stop_when=after_a_periodic_checkpoint)
    assert first.cancelled and first.checkpoints  # checkpoints of a run that did not end remain
    # Unchanged input: the resume restores from a checkpoint and goes on.
    again = file_and_endless(path, tmp_path / "out").run(
        checkpoint_interval=0.02, checkpoint_dir=ck, resume=True, stop_when=after_a_periodic_checkpoint)
    assert again.cancelled and again.restored_from and again.restored_from[0] > 0
    assert again.failures == []
    with open(path, "a", encoding="utf-8") as f:
        f.write("a line appended after the checkpoint\n")
    with pytest.raises(JobFailed) as ei:
        file_and_endless(path, tmp_path / "out").run(
            checkpoint_interval=0.02, checkpoint_dir=ck, resume=True, stop_when=after_a_periodic_checkpoint)
    msg = str(ei.value)
    assert ei.value.operator == "read"
    assert "cannot be retried" in msg  # fatal: no pointless restarts
    assert "SourceChangedError" in msg and repr(path) in msg and "changed" in msg
