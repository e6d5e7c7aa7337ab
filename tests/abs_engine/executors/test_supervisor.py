"""Driver high availability (executors/supervisor.py): the supervised driver SIGKILLed
three times and the job exact against its batch oracle; a supervisor that gives up says so;
the directory stays locked between drivers; results and errors cross back as data."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import textwrap
import threading
from typing import Any

import pytest

from abs_engine import CheckpointError, Dataflow, JobFailed, JobInterrupted
from abs_engine.checkpoint.remote import open_storage
from abs_engine.errors import CheckpointErrorReason, ConfigError, InputError
from abs_engine.executors import result_data, supervisor
from abs_engine.testing import CapturingSink, GatedSource
from operators.generators import RangeSource

from .procs import gone, run_in_thread, wait_for

N = 40_000
MODULE = b"abs_engine.executors.supervised"


def drivers(parent: int | None = None) -> list[int]:
    """The live supervised drivers this process (or ``parent``) started."""
    parent = os.getpid() if parent is None else parent
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if int(ppid) == parent and state != "Z" and MODULE in cmd:
            out.append(int(name))
    return out


def counting(sink: CapturingSink, gate: str) -> Dataflow:
    flow = Dataflow("supervised", parallelism=2)
    flow.source(GatedSource(RangeSource(0, N, batch_size=500), gate, after=N // 8), name="numbers") \
        .map(lambda x: (x % 7, 1), name="pair").key_by(lambda kv: kv[0]).count(name="count").sink(sink)
    return flow


def oracle() -> list[Any]:
    seen: collections.Counter[int] = collections.Counter()
    out = []
    for x in range(N):
        seen[x % 7] += 1
        out.append((x % 7, seen[x % 7]))
    return sorted(out)


def kill_drivers(ck: str, times: int) -> list[int]:
    """SIGKILL the supervised driver ``times`` times, each once it has completed a
    checkpoint newer than any before its kill (the job held by its gate meanwhile)."""
    killed: list[int] = []
    newest = 0
    for _ in range(times):
        pid = wait_for(lambda: [p for p in drivers() if p not in killed], 60, "a driver")[0]
        wait_for(lambda: max(open_storage(ck).completed_ids(), default=0) > newest, 60, "a newer checkpoint")
        newest = max(open_storage(ck).completed_ids())
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)
    return killed


def supervised(tmp_path, **options: Any) -> tuple[str, str, CapturingSink, threading.Thread, dict[str, Any]]:  # type: ignore[no-untyped-def]
    """The counting job run under a supervisor on a thread, held by its gate: (gate, its
    checkpoint directory, its sink, the thread, the box its result or error lands in)."""
    gate, ck = str(tmp_path / "gate"), str(tmp_path / "ck")
    sink = CapturingSink(tmp_path / "out")
    t, box = run_in_thread(lambda: counting(sink, gate).run(
        supervise=True, checkpoint_dir=ck, checkpoint_interval=0.05, **options))
    return gate, ck, sink, t, box


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_supervised_driver_killed_three_times_and_the_job_is_exact(tmp_path):
    gate, ck, sink, t, box = supervised(tmp_path, restart_delay=0.5, driver_restarts=3)
    try:
        killed = kill_drivers(ck, 3)
        # between two drivers, and while one runs, the directory is the supervisor's
        intruder = Dataflow("intruder")
        intruder.source(RangeSource(0, 10)).sink(CapturingSink(tmp_path / "x"))
        with pytest.raises(CheckpointError) as locked:
            intruder.run(checkpoint_dir=ck, resume=True)
        assert locked.value.reason is CheckpointErrorReason.LOCKED
        wait_for(lambda: [p for p in drivers() if p not in killed], 60, "the fourth driver")
    finally:
        open(gate, "w").close()
        t.join(120)
    assert not t.is_alive()
    assert "error" not in box, box.get("error")
    res = box["result"]
    assert res.restored_from and res.checkpoints_completed >= 1  # the last driver's own run, resumed
    assert res.driver_crashes == ["killed by signal 9"] * 3
    assert sorted(sink.records()) == oracle()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_supervisor_that_gives_up_says_so_and_frees_the_directory(tmp_path):
    gate, ck, sink, t, box = supervised(tmp_path, restart_delay=0, driver_restarts=1)
    try:
        kill_drivers(ck, 2)
        t.join(60)
    finally:
        open(gate, "w").close()
        t.join(60)
    err = box.get("error")
    assert isinstance(err, JobFailed), box
    text = str(err)
    assert "crashed 2 times" in text and "killed by signal 9" in text and "driver_restarts=1" in text
    assert ck in text and "resume=True" in text
    # the checkpoints are intact and the directory free: a plain resume finishes the job exactly
    res = counting(sink, gate).run(checkpoint_dir=ck, checkpoint_interval=0.05, resume=True)
    assert res.restored_from
    assert sorted(sink.records()) == oracle()


def test_supervise_needs_checkpoints_to_resume_from() -> None:
    flow = Dataflow("f")
    flow.source(RangeSource(0, 3)).sink(CapturingSink("/nonexistent/never-written"))
    with pytest.raises(ConfigError) as e:
        flow.run(supervise=True)
    assert e.value.option == "supervise" and "checkpoint_dir" in str(e.value)
    with pytest.raises(ConfigError):
        flow.run(supervise=True, checkpoint_dir="/tmp/x", mode="none")


def test_a_result_and_the_engines_errors_cross_back_as_data(tmp_path) -> None:
    sink = CapturingSink(tmp_path / "o")
    flow = Dataflow("small", parallelism=2)
    flow.source(RangeSource(0, 1000, batch_size=100)).map(lambda x: (x % 3, 1)).key_by(lambda kv: kv[0]).count() \
        .sink(sink)
    res = flow.run(executor="inprocess", checkpoint_interval=0.01, checkpoint_dir=str(tmp_path / "ck"))
    back = result_data.decode(result_data.encode(res))
    assert back == res and back.history == res.history and back.checkpoints == res.checkpoints
    locked = CheckpointError(CheckpointErrorReason.LOCKED, "in use")
    again = result_data.error_from_data(result_data.error_to_data(locked))
    assert isinstance(again, CheckpointError) and again.reason is CheckpointErrorReason.LOCKED
    assert str(again) == "in use"
    other = result_data.error_from_data(result_data.error_to_data(ZeroDivisionError("x")))
    assert isinstance(other, JobFailed) and "ZeroDivisionError: x" in str(other)
    with pytest.raises(ValueError):
        result_data.from_data(result_data.JobResult, {"job": 3})


def test_a_driver_that_ends_by_itself_is_not_restarted_and_its_word_must_be_readable() -> None:
    with pytest.raises(JobFailed, match="exited with status 3 without saying how the job ended"):
        supervisor._outcome(b"", 3, False, "/ck", [])
    with pytest.raises(JobFailed, match="last word is unreadable"):
        supervisor._outcome(supervisor.RESULT + b"\xc1", 0, False, "/ck", [])
    with pytest.raises(JobFailed, match="last word is unreadable"):
        supervisor._outcome(supervisor.RESULT, 0, False, "/ck", [])
    with pytest.raises(JobInterrupted):  # a stop passed on, then no word: interrupted, not crashed
        supervisor._outcome(b"", -15, True, "/ck", [])


def test_a_job_that_cannot_be_pickled_is_a_config_error_naming_it(tmp_path) -> None:
    lock = threading.Lock()
    flow = Dataflow("f")
    flow.source(RangeSource(0, 3)).sink(CapturingSink(tmp_path / "o"))
    with pytest.raises(ConfigError, match="cannot be pickled") as e:
        flow.run(supervise=True, checkpoint_dir=str(tmp_path / "ck"), stop_when=lambda r: lock.locked())
    assert e.value.option == "supervise"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sigterm_to_the_supervisor_stops_the_job_with_a_savepoint_and_restarts_nothing(tmp_path):
    """The driver runs in a session of its own: the supervisor passes SIGTERM on, the
    driver takes a savepoint and stops, and the supervisor returns that, restarting nothing."""
    gate, ck, out = str(tmp_path / "gate"), str(tmp_path / "ck"), tmp_path / "out"
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        from tests.abs_engine.executors.test_supervisor import counting
        from abs_engine.testing import CapturingSink
        res = counting(CapturingSink({str(out)!r}), {gate!r}).run(
            supervise=True, checkpoint_dir={ck!r}, checkpoint_interval=0.05)
        print("stopped", res.stopped_with_savepoint, bool(res.savepoint), res.driver_crashes, flush=True)
    """))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env, cwd=root)
    try:
        wait_for(lambda: os.path.isdir(ck) and open_storage(ck).completed_ids(), 60, "a checkpoint")
        mine = drivers(parent=proc.pid)
        proc.send_signal(signal.SIGTERM)
        said, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, said
    assert said.strip() == "stopped True True []"
    assert len(mine) == 1 and all(gone(pid) for pid in mine)  # the driver ended with it



@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(300)
def test_a_supervised_driver_reads_its_spark_source_again_and_a_driver_kill_loses_nothing(tmp_path, spark):
    """The supervised driver is never handed a DataFrame (it runs in a process of its own):
    SparkSource.text reads its files in the driver, with the driver's own session, after a
    SIGKILL too (it used to fail: 'NoneType' object has no attribute 'sparkSession'), and
    the caller starts no Spark for it."""
    from operators.spark import SparkSource

    path = tmp_path / "words.txt"
    lines = [" ".join(f"w{(i * 7 + j) % 97}" for j in range(5)) for i in range(20_000)]
    path.write_text("\n".join(lines) + "\n")
    gate, ck = str(tmp_path / "gate"), str(tmp_path / "ck")
    sink = CapturingSink(tmp_path / "out")
    flow = Dataflow("spark-supervised", parallelism=2)
    src = SparkSource.text(path)
    (flow.source(GatedSource(src, gate, after=2_000), name="read")
     .flat_map(str.split, name="split").key_by().count_final(name="count").sink(sink, name="out", parallelism=1))
    t, box = run_in_thread(lambda: flow.run(supervise=True, checkpoint_dir=ck, checkpoint_interval=0.1,
                                            restart_delay=0, driver_restarts=2))
    try:
        kill_drivers(ck, 1)
        wait_for(lambda: len(drivers()) == 1, 60, "the second driver")
    finally:
        open(gate, "w").close()
        t.join(240)
    assert "error" not in box, box.get("error")
    assert box["result"].driver_crashes == ["killed by signal 9"]
    assert src._df is None  # the caller (the supervisor) never read the input: no Spark of its own
    assert dict(sink.records()) == collections.Counter(w for line in lines for w in line.split())


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(120)
def test_a_dataframe_of_ones_own_session_cannot_go_to_a_supervised_driver(tmp_path, spark):
    from operators.spark import SparkSource

    flow = Dataflow("own-df")
    flow.source(SparkSource(spark.range(0, 10)), name="read").sink(CapturingSink(tmp_path / "out"), name="out")
    with pytest.raises(InputError) as failed:  # (a typed error that names the fix, not a Python one)
        flow.run(supervise=True, checkpoint_dir=str(tmp_path / "ck"))
    assert "supervised driver" in str(failed.value) and "SparkSource.text/csv/parquet" in str(failed.value)
