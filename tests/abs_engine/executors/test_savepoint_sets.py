"""The savepoint of a job of several pipelines (executors/savepoint_sets.py): each pipeline
restores its own newest savepoint; a savepoint of the job run as one, or one without a
pipeline, is refused by name."""

from __future__ import annotations

import os

import pytest

from abs_engine.errors import CheckpointError, CheckpointErrorReason
from abs_engine.executors.config import JobConfig
from abs_engine.executors.savepoint_sets import pipeline_savepoint, set_location
from abs_engine.pipelines import Pipeline


def pipeline(name: str) -> Pipeline:
    return Pipeline(0, (name,), (f"{name}#0",), ((f"{name}#0",),), name)


def savepoint(where, name: str, cid: int, complete: bool = True) -> None:  # type: ignore[no-untyped-def]
    """A savepoint directory as write_savepoint lays it out; without its metadata (a copy cut
    short) unless ``complete``."""
    chk = where / name / f"chk-{cid:06d}"
    os.makedirs(chk)
    if complete:
        (chk / "_metadata").write_bytes(b"")


def test_each_pipeline_restores_its_newest_savepoint(tmp_path) -> None:  # type: ignore[no-untyped-def]
    for name, cid in (("savepoint-job-000003-20261126T100000Z", 3), ("savepoint-job-000012-20261126T090000Z", 12),
                      ("savepoint-job-000012-20261126T080000Z", 12), ("not-a-savepoint", 99)):
        savepoint(tmp_path / "pipeline-a", name, cid)
    savepoint(tmp_path / "pipeline-a", "savepoint-job-000020-20261126T110000Z", 20, complete=False)
    got = pipeline_savepoint(str(tmp_path), pipeline("a"), False)
    # (the newest complete one: one whose copy was cut short, without metadata, does not exist)
    assert got == str(tmp_path / "pipeline-a" / "savepoint-job-000012-20261126T090000Z")
    assert pipeline_savepoint(None, pipeline("a"), False) is None


def test_a_pipeline_without_a_savepoint_is_named_or_starts_empty(tmp_path) -> None:  # type: ignore[no-untyped-def]
    savepoint(tmp_path / "pipeline-a", "savepoint-job-000003-20261126T100000Z", 3)
    with pytest.raises(CheckpointError) as e:
        pipeline_savepoint(str(tmp_path), pipeline("b"), False)
    assert e.value.reason is CheckpointErrorReason.NOT_FOUND and "pipeline 'b'" in str(e.value)
    assert "allow_non_restored_state" in str(e.value)
    assert pipeline_savepoint(str(tmp_path), pipeline("b"), True) is None


def test_a_savepoint_of_the_job_run_as_one_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    os.makedirs(tmp_path / "chk-000004")
    with pytest.raises(CheckpointError) as e:
        pipeline_savepoint(str(tmp_path), pipeline("a"), False)
    assert e.value.reason is CheckpointErrorReason.PLAN_MISMATCH and "failover='job'" in str(e.value)


def test_a_run_puts_its_savepoints_in_one_directory(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ck = str(tmp_path / "ck")
    where = set_location(JobConfig(checkpoint_dir=ck), ck, "my job")
    assert os.path.dirname(where) == os.path.join(ck, "savepoints")
    assert os.path.basename(where).startswith("savepoint-my_job-pipelines-")
    assert os.path.dirname(set_location(JobConfig(savepoint_dir=str(tmp_path / "sp")), ck, "j")) == \
        str(tmp_path / "sp")
