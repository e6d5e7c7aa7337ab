"""Failures are classified: a poison record fails the job at once naming operator, exception
and record; on_error="skip" drops it and goes on, exactly; a key function's failure names
key_by; a user function that blocks is stopped by task_timeout with its stack; an expired
checkpoint names the tasks it waited for."""

from __future__ import annotations

import time

import pytest

from abs_engine import Dataflow, JobFailed
from abs_engine.testing import CapturingSink, TestingSource

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


def poison(x):
    if x == 1234:
        raise ValueError(f"cannot handle {x}")
    return x * 2


def test_poison_record_fails_the_job_after_one_restart_naming_the_record(tmp_path):
    flow = Dataflow("poison", parallelism=2)
    flow.source(TestingSource(range(5000))).map(poison, name="double").sink(CapturingSink(tmp_path / "c"))
    with pytest.raises(JobFailed) as ei:
        flow.run(restart_attempts=10, restart_delay=0)
    text = str(ei.value)
    assert ei.value.operator == "double"
    assert "poison record" in text and "ValueError: cannot handle 1234" in text and "record: 1234" in text
    # two failures (the original and the repeat), not eleven
    assert text.count("restarting") == 0


def test_on_error_skip_drops_only_the_failing_records_and_reports_them(tmp_path):
    sink = CapturingSink(tmp_path / "c")
    flow = Dataflow("skip", parallelism=2)
    flow.source(TestingSource(range(5000))).map(poison, name="double", on_error="skip").sink(sink)
    res = flow.run(checkpoint_interval=0.05, restart_delay=0)
    assert res.restarts == 0 and res.skipped_records == 1
    assert sorted(sink.records()) == sorted(x * 2 for x in range(5000) if x != 1234)


def bad_sum(acc, x):
    if x == 77:
        raise ArithmeticError("no 77")
    return acc + x


def test_reduce_skip_leaves_the_key_state_unchanged(tmp_path):
    sink = CapturingSink(tmp_path / "c")
    flow = Dataflow("rskip", parallelism=2)
    flow.source(TestingSource(range(200))).key_by(lambda x: x % 3).reduce_final(bad_sum, on_error="skip") \
        .sink(sink, parallelism=1)
    res = flow.run(restart_delay=0)
    expected = {k: sum(x for x in range(200) if x % 3 == k and x != 77) for k in range(3)}
    assert dict(sink.records()) == expected and res.skipped_records == 1


def listy_key(x):
    return [x % 5]


def test_unhashable_key_blames_key_by_and_is_not_retried(tmp_path):
    flow = Dataflow("unhashable", parallelism=2)
    flow.source(TestingSource(range(100))).map(lambda x: x, name="before").key_by(listy_key).count_final(
        name="cnt").sink(CapturingSink(tmp_path / "c"))
    with pytest.raises(JobFailed) as ei:
        flow.run(restart_attempts=10, restart_delay=0)
    text = str(ei.value)
    assert "key_by(listy_key)" in text and "unhashable" in text and "cannot be retried" in text
    assert ei.value.operator != "before"


def blocks_on_7(x):
    if x == 7:
        time.sleep(3600)  # the user function that never returns (the workload under test)
    return x


def test_a_blocking_user_function_fails_with_its_name_and_stack_instead_of_hanging(tmp_path):
    flow = Dataflow("blocks")
    flow.source(TestingSource(range(20))).map(blocks_on_7, name="stuck").sink(CapturingSink(tmp_path / "c"))
    t0 = time.monotonic()
    with pytest.raises(JobFailed) as ei:
        flow.run(task_timeout=2.0, heartbeat_interval=0.25, restart_delay=0)
    text = str(ei.value)
    assert ei.value.operator == "stuck"
    assert "task_timeout=2s" in text and "blocks_on_7" in text and "time.sleep(3600)" in text
    assert "stuck again" in text  # the repeat after a restart is not retried ten times
    assert time.monotonic() - t0 < 30


def slow(x):
    time.sleep(0.02)  # a slow operator: barriers wait behind its input (the workload)
    return x


def test_expired_checkpoints_name_the_tasks_and_fail_over_after_the_tolerable_number(tmp_path, capsys):
    flow = Dataflow("expire")
    flow.source(TestingSource(range(400), batch_size=1)).rebalance().map(slow, name="slow").sink(
        CapturingSink(tmp_path / "c"))
    with pytest.raises(JobFailed) as ei:
        flow.run(checkpoint_interval=0.05, checkpoint_timeout=0.06, tolerable_failed_checkpoints=1,
                 restart_attempts=0, progress=True)
    text = str(ei.value)
    assert "checkpoints in a row expired" in text and "tolerable_failed_checkpoints=1" in text
    err = capsys.readouterr().err
    assert "expired after checkpoint_timeout=0.06s; not acknowledged by:" in err


def flaky_backend(x):
    import os

    if x == 300 and int(os.environ.get("ABS_ENGINE_ATTEMPT", "0")) < 2:
        raise ConnectionError("backend unavailable")  # an outage that lasts two attempts
    return x


def test_a_transient_io_error_on_the_same_record_is_retried_not_called_poison(tmp_path):
    sink = CapturingSink(tmp_path / "c")
    flow = Dataflow("flaky")
    flow.source(TestingSource(range(1000))).map(flaky_backend, name="call").sink(sink)
    res = flow.run(restart_attempts=5, restart_delay=0)
    assert res.restarts == 2
    assert sorted(sink.records()) == list(range(1000))
