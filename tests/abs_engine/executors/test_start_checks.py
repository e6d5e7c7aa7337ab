"""What run() refuses before any worker starts: an unusable checkpoint directory, a resume
with nothing to resume, code that cannot be shipped. Each is a typed error naming the fix,
and no worker process is ever launched (a launcher that records its calls proves it)."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from abs_engine import Dataflow
from abs_engine.errors import (AbsEngineError, CheckpointError, CheckpointErrorReason, ConfigError, GraphError,
                               GraphErrorReason)
from abs_engine.executors.config import JobConfig
from abs_engine.executors.local import LocalLauncher
from abs_engine.executors.master import JobMaster
from abs_engine.testing import CapturingSink, TestingSource


class RecordingLauncher(LocalLauncher):
    def __init__(self) -> None:
        super().__init__()
        self.started: list[list[str]] = []

    def start(self, tasks: list[str], *args: Any, **kw: Any) -> Any:
        self.started.append(tasks)
        return super().start(tasks, *args, **kw)


def refused(flow: Dataflow, **config: Any) -> AbsEngineError:
    launcher = RecordingLauncher()
    with pytest.raises(AbsEngineError) as e:
        JobMaster(flow.graph, flow.compile(), JobConfig(**config), launcher).run()
    assert launcher.started == []
    return e.value


def small(out: str, fn: Any = str) -> Dataflow:
    flow = Dataflow("small")
    flow.source(TestingSource(range(100))).map(fn, name="fmt").sink(CapturingSink(out), name="out")
    return flow


def test_the_root_directory_is_refused_and_not_written(tmp_path) -> None:  # type: ignore[no-untyped-def]
    e = refused(small(str(tmp_path / "o")), checkpoint_dir="/")
    assert isinstance(e, CheckpointError) and e.reason is CheckpointErrorReason.BAD_DIRECTORY
    assert not any(os.path.exists(p) for p in ("/_lock", "/_fence", "/_control", "/chk-000001"))


def test_a_file_as_checkpoint_directory_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "ck").write_text("x")
    e = refused(small(str(tmp_path / "o")), checkpoint_dir=str(tmp_path / "ck"))
    assert isinstance(e, CheckpointError) and "not a directory" in str(e)


@pytest.mark.parametrize("exists", [False, True])
def test_resume_without_checkpoints_is_an_error(tmp_path, exists: bool) -> None:  # type: ignore[no-untyped-def]
    ck = tmp_path / "ck"
    if exists:
        ck.mkdir()
    e = refused(small(str(tmp_path / "o")), checkpoint_dir=str(ck), resume=True)
    assert isinstance(e, CheckpointError) and e.reason is CheckpointErrorReason.NOT_FOUND
    assert "resume='if-present'" in str(e)
    assert ck.exists() == exists


def test_code_that_cannot_be_shipped_names_the_operator(tmp_path) -> None:  # type: ignore[no-untyped-def]
    lock = threading.Lock()
    e = refused(small(str(tmp_path / "o"), lambda x: (lock, x)[1]), checkpoint_dir=str(tmp_path / "ck"))
    assert isinstance(e, GraphError) and e.reason is GraphErrorReason.UNSHIPPABLE and e.operator == "fmt"
    assert "closure variable 'lock'" in str(e)


@pytest.mark.slow
def test_resume_if_present_starts_afresh_then_resumes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ck, out = str(tmp_path / "ck"), str(tmp_path / "o")
    first = small(out).run(checkpoint_dir=ck, resume="if-present", checkpoint_interval=0.05)
    assert first.restored_from == [] and first.checkpoints_completed >= 1
    again = small(out).run(checkpoint_dir=ck, resume="if-present", checkpoint_interval=0.05)
    assert again.restored_from and again.job_id == first.job_id
    assert sorted(CapturingSink(out).records()) == sorted(str(i) for i in range(100))


def test_a_loop_spill_dir_that_is_not_there_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    flow = Dataflow("loop")
    loop = flow.feedback()
    step = flow.source(TestingSource(range(10))).union(loop).map(lambda n: n - 1, name="dec")
    loop.connect(step.filter(lambda n: n > 0))
    step.sink(CapturingSink(str(tmp_path / "o")), name="out")
    e = refused(flow, checkpoint_dir=str(tmp_path / "ck"), loop_spill_dir=str(tmp_path / "missing"))
    assert isinstance(e, ConfigError) and e.option == "loop_spill_dir"
