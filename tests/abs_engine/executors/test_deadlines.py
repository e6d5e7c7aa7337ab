"""No silent waits: an attempt whose workers never connect, or connect but never reach
RUNNING (a blocked ``open()``), fails within ``startup_timeout`` with an error that names
the tasks and the setting, instead of hanging."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from abs_engine import Dataflow
from abs_engine.errors import JobFailed
from abs_engine.executors.config import JobConfig
from abs_engine.executors.local import LocalLauncher, LocalProcess
from abs_engine.executors.master import JobMaster
from abs_engine.testing import TestingSource
from operators import FileSink

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


class SilentLauncher(LocalLauncher):
    """Starts processes that live but never connect (a worker stuck before its Hello)."""

    def start(self, tasks: list[str], driver: tuple[str, int], generation: int, secret: bytes,
              material: Any = None, env: Any = None) -> dict[str, LocalProcess]:
        return {t: LocalProcess(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                                 stdin=subprocess.DEVNULL)) for t in tasks}


def _flow(out: str, source: Any = None) -> Dataflow:
    flow = Dataflow("deadlines", parallelism=1)
    flow.source(source or TestingSource(range(10))).sink(FileSink(out))
    return flow


def test_workers_that_never_connect_fail_the_job_within_startup_timeout(tmp_path):
    flow = _flow(str(tmp_path / "out.txt"))
    launcher = SilentLauncher()
    cfg = JobConfig(startup_timeout=1.5, restart_attempts=0)
    master = JobMaster(flow.graph, flow.compile(), cfg, launcher)
    t0 = time.monotonic()
    with pytest.raises(JobFailed, match=r"did not connect within 1.5s"):
        master.run()
    assert time.monotonic() - t0 < 30


class BlockedOpen(TestingSource):
    """A source whose open() blocks for ever (a hung connection to an external system)."""

    def open(self, ctx: Any) -> None:
        threading.Event().wait()


def test_a_worker_that_never_reaches_running_fails_the_job_naming_it(tmp_path):
    flow = _flow(str(tmp_path / "out.txt"), BlockedOpen(range(10)))
    t0 = time.monotonic()
    with pytest.raises(JobFailed) as info:
        flow.run(startup_timeout=2.0, restart_attempts=0, task_timeout=0)
    assert "did not restore and start within startup_timeout=2.0s" in str(info.value)
    assert "deadlines#0" in str(info.value) or "tasks [" in str(info.value)
    assert time.monotonic() - t0 < 30
