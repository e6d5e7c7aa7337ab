"""The Spark launcher: the same job, unchanged, with its workers inside a Spark barrier
stage (the session-wide embedded local session here), exact under SIGKILLs of worker
processes inside the Spark tasks; too few slots is a clear error within seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

from abs_engine import Dataflow
from abs_engine.executors.spark import SparkLauncherError, _slot_groups, available_slots, package_zip, stage_failure
from abs_engine.testing import KillOnCheckpoints
from tests.abs_engine.executors.test_recovery import as_counts, output_lines, wordcount
from tests.chaos_checks import assert_each_kill_restored
from tests.conftest import batch_word_count, covered_by_the_cluster_test

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.timeout(300)]


def test_slot_sharing_groups_subtask_k_of_every_operator() -> None:
    assert _slot_groups(["src#0", "src#1", "count#1", "count#0", "sink#0"]) == [
        ["src#0", "count#0", "sink#0"], ["src#1", "count#1"]]


def test_the_shipped_zip_is_one_private_file_per_version_and_a_tampered_one_is_replaced(tmp_path, monkeypatch):
    import zipfile

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = package_zip()
    assert path.startswith(str(tmp_path / "abs-engine" / "packages")) and package_zip() == path
    assert os.stat(os.path.dirname(path)).st_mode & 0o077 == 0  # private to this user
    good = open(path, "rb").read()
    with open(path, "r+b") as f:
        f.write(b"PK\x03\x04 not the engine")
    assert package_zip() == path and open(path, "rb").read() == good
    names = zipfile.ZipFile(path).namelist()
    assert "abs_engine/__init__.py" in names and "operators/__init__.py" in names
    assert os.listdir(os.path.dirname(path)) == ["abs_engine_packages.zip"]  # no temporary file left


def test_a_failed_stage_is_told_by_its_reason_not_by_py4js_first_line() -> None:
    call = "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe."
    lost = (f"{call}\n: org.apache.spark.SparkException: Job aborted due to stage failure: Could not recover from "
            "a failed barrier ResultStage.\nExecutorLostFailure (executor 2 exited caused by one of the running "
            "tasks) Reason: Remote RPC client disassociated.\n\tat org.apache.spark.scheduler.DAGScheduler...")
    assert stage_failure(RuntimeError(lost)).startswith("ExecutorLostFailure (executor 2 exited")
    worker = (f"{call}\n: org.apache.spark.SparkException: Job aborted due to stage failure: ...\n"
              "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
              "RuntimeError: abs-engine worker count#1 (pid 14149) exited with status 1")
    assert stage_failure(RuntimeError(worker)) == "RuntimeError: abs-engine worker count#1 (pid 14149) exited with status 1"
    aborted = f"{call}\n: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 failed"
    assert stage_failure(RuntimeError(aborted)) == "Job aborted due to stage failure: Task 0 failed"
    assert stage_failure(RuntimeError("")) == "RuntimeError"


def test_wordcount_on_spark_with_sigkills_inside_spark_tasks_is_exact(spark, medium_corpus, tmp_path):
    assert available_slots(spark.sparkContext) >= 2
    out, gate = str(tmp_path / "out.tsv"), str(tmp_path / "gate")
    chaos = KillOnCheckpoints([2, 5], seed=11, open_gate=gate)
    res = wordcount(medium_corpus, out, 2, gate).run(
        executor="spark", spark=spark, checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / "ck"),
        chaos=chaos, restart_delay=0)
    assert as_counts(output_lines(out)) == batch_word_count(medium_corpus)
    assert_each_kill_restored(res, chaos, min_kills=len(chaos.after))  # (all mid-job: held)


def test_too_few_slots_is_a_clear_error_within_seconds(spark, small_corpus, tmp_path, monkeypatch):
    import abs_engine.executors.spark as launcher

    monkeypatch.setattr(launcher, "SLOT_WAIT", 1.0)  # (no executor joins this session: the wait is only time)
    slots = available_slots(spark.sparkContext)
    flow = wordcount(small_corpus, str(tmp_path / "o.tsv"), slots + 1)
    t0 = time.monotonic()
    with pytest.raises(SparkLauncherError) as info:
        flow.run(executor="spark", spark=spark)
    assert f"needs {slots + 1} Spark task slots" in str(info.value) and f"has {slots}" in str(info.value)
    assert time.monotonic() - t0 < 20


@pytest.fixture(scope="module")
def cluster_runs(medium_corpus: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    """Both jobs of the cluster test, one after the other on one local cluster (its start-up,
    about 15 s, paid once): the directory of their outputs, and what each reported."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    where = str(tmp_path_factory.mktemp("cluster"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "tests.abs_engine.executors.spark_cluster_job", medium_corpus, where,
                           "workers,executor"], cwd=root, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return where, json.loads(proc.stdout.strip().splitlines()[-1])


@covered_by_the_cluster_test
@pytest.mark.timeout(420)
@pytest.mark.parametrize("kill", ["workers", "executor"])
def test_wordcount_on_a_local_cluster_under_kills_is_exact(medium_corpus, cluster_runs, kill):
    """Two executor JVMs (local-cluster[2,1,1024]): SIGKILLs of engine workers inside them,
    or of a whole executor; the output equals the batch count and the job restored from a
    checkpoint. Both run in one driver process of their own (one SparkContext per process)."""
    where, runs = cluster_runs
    res = runs[kill]
    assert as_counts(output_lines(os.path.join(where, f"{kill}.tsv"))) == batch_word_count(medium_corpus)
    mid_job = [c for c in res["killed_after"] if c not in res["finals"]]
    assert res["kills"] >= 1 and mid_job, res
    # A killed worker is noticed at once: the restore is from the checkpoint the kill
    # followed, or (an executor's loss takes a moment to reach the workers) a later one.
    restored = res["restored_from"][: len(mid_job)]
    assert len(restored) == len(mid_job) and all(r >= k for r, k in zip(restored, mid_job)), res


def test_each_pipeline_runs_in_a_barrier_stage_of_its_own(spark, tmp_path):
    """Two pipelines on Spark: a worker of one SIGKILLs itself; only that pipeline's stage
    fails and restarts (the other's workers run on: no restart), both outputs exact."""
    from abs_engine.testing import CapturingSink, fail_at
    from operators.generators import RangeSource

    n = 20_000
    flow = Dataflow("stages", parallelism=1)
    sinks = [CapturingSink(tmp_path / f"out{i}") for i in range(2)]
    for i in range(2):
        stream = flow.source(RangeSource(0, n, batch_size=250), name=f"p{i}")
        if i == 1:
            stream = stream.map(fail_at(n // 2, kind="kill"), name="crash")
        stream.map(lambda x, i=i: (x % 7 + 10 * i, 1), name=f"pair{i}").key_by(lambda kv: kv[0]) \
            .count(name=f"count{i}").sink(sinks[i], name=f"sink{i}")
    res = flow.run(executor="spark", spark=spark, checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / "ck"),
                   restart_delay=0)
    assert [p.restarts for p in res.pipelines] == [0, 1]
    for i in range(2):
        seen: dict[int, int] = {}
        want = []
        for x in range(n):
            k = x % 7 + 10 * i
            seen[k] = seen.get(k, 0) + 1
            want.append((k, seen[k]))
        assert sorted(tuple(r) for r in sinks[i].records()) == sorted(want)
