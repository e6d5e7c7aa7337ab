"""The driver of one attempt (executors/attempt_driver.py) on its own, without a JobMaster:
its collaborators are handed to it, and a scripted attempt plays the tasks. It starts the
coordinator only once every task runs, takes a savepoint asked for with a stop (written
before the tasks are told, the request answered, the tasks let go), and fails the attempt
when tasks do not start in time or too many checkpoints expire in a row."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from abs_engine import Dataflow, codec, messages
from abs_engine.checkpoint import snapshot_file
from abs_engine.checkpoint.coordinator import CheckpointCoordinator
from abs_engine.checkpoint.storage import CheckpointStorage
from abs_engine.executors.attempt_driver import AttemptDriver
from abs_engine.executors.chaos import Chaos
from abs_engine.executors.config import JobConfig, JobResult
from abs_engine.executors.failures import WorkerFailure
from abs_engine.lifecycle import Lifecycle, Phase
from abs_engine.executors.requests import SavepointRequests
from abs_engine.executors.signals import Signals
from abs_engine.executors.source_records import SourceRecords
from abs_engine.monitor.tracker import JobTracker
from abs_engine.plan import Plan
from abs_engine.testing import CapturingSink, TestingSource


class ScriptedAttempt:
    """Tasks that report Running (if ``start``), acknowledge every checkpoint triggered (if
    ``ack``) and commit what they are told to."""

    def __init__(self, storage: CheckpointStorage, tasks: list[str], start: bool = True, ack: bool = True):
        self.storage, self.tasks, self.ack = storage, tasks, ack
        self.inbox: list[tuple[str, messages.Message]] = [(t, messages.Running(t)) for t in tasks] if start else []
        self.sent: list[tuple[str, messages.Message]] = []
        self.committed: set[str] = set()
        self.acked: set[int] = set()
        self.finished = False

    def receive(self, timeout: float) -> list[tuple[str, messages.Message]]:
        out, self.inbox = self.inbox, []
        return out

    def send(self, task: str, msg: messages.Message) -> None:
        self.sent.append((task, msg))
        if isinstance(msg, messages.Trigger) and self.ack and msg.checkpoint_id not in self.acked:
            self.acked.add(msg.checkpoint_id)  # the barrier reaches every task: each acknowledges
            self.inbox += [(t, self._ack(msg.checkpoint_id, t)) for t in self.tasks]
        if isinstance(msg, messages.NotifyComplete) and (msg.stop or msg.final):
            self.committed.add(task)

    def _ack(self, cid: int, task: str) -> messages.Ack:
        blob = snapshot_file.encode(task, cid, codec.pack({}), {}, False)
        os.makedirs(self.storage.dir_of(cid), exist_ok=True)
        with open(os.path.join(self.storage.dir_of(cid), f"{task}.state"), "wb") as f:
            f.write(blob)
        return messages.Ack(cid, task, f"{task}.state", len(blob), hashlib.sha256(blob).hexdigest(), 0.0, 0, False)

    def check(self, now: float, task_timeout: float) -> None:
        return None

    def root_cause(self, exclude: str, suspect: str | None) -> None:
        return None

    def live_pids(self) -> dict[str, int]:
        return {}

    def finish(self) -> None:
        self.finished = True

    def close(self) -> None:
        return None


def plan() -> Plan:
    flow = Dataflow("driven", parallelism=2)
    flow.source(TestingSource(range(10)), name="src").sink(CapturingSink("/nonexistent"), name="sink")
    return flow.compile()


def drive(tmp_path: Path, requests: SavepointRequests | None = None, **config: Any) -> tuple[AttemptDriver, ScriptedAttempt]:
    p = plan()
    cfg = JobConfig(checkpoint_dir=str(tmp_path / "ck"), savepoint_dir=str(tmp_path / "sp"), **config)
    storage = CheckpointStorage(str(tmp_path / "ck"), retain=3)
    tasks = [t.id for t in p.tasks]
    sources = [t.id for t in p.tasks if p.chain(t.chain).is_source]
    coord = CheckpointCoordinator(p.job, p.fingerprint(), tasks, sources, storage, cfg.checkpoint_interval,
                                  cfg.checkpoint_timeout, cfg.max_concurrent_checkpoints, 1)
    attempt = ScriptedAttempt(storage, tasks)
    result, lifecycle = JobResult(job=p.job), Lifecycle()
    lifecycle.to(Phase.SCHEDULING)
    log: list[str] = []
    driver = AttemptDriver(
        attempt, coord, config=cfg, generation=0, final_restore=False, started=0.0,
        tracker=JobTracker(p, cfg.mode, cfg.checkpoint_interval, history=result.history), result=result, lifecycle=lifecycle,
        requests=requests or SavepointRequests(), signals=Signals(log.append), sources=SourceRecords(result),
        chaos=Chaos(None, 0.0, result, log.append), stats_writer=None, log=log.append)
    return driver, attempt


def test_a_stop_asked_for_takes_a_savepoint_answers_the_request_and_lets_the_tasks_go(tmp_path: Path) -> None:
    requests = SavepointRequests()
    asked = requests.submit(stop=True)
    driver, attempt = drive(tmp_path, requests, checkpoint_interval=3600.0)
    driver.run()
    res = driver.result
    assert res.stopped_with_savepoint and res.savepoint.startswith(str(tmp_path / "sp"))
    assert asked.result(timeout=0) == res.savepoint and os.path.isdir(res.savepoint)
    assert driver.lifecycle.history[-2:] == [Phase.RUNNING, Phase.STOPPING]
    kinds = [type(m).__name__ for _, m in attempt.sent]
    # Triggered once every task ran; told to stop after the savepoint; then let go, every task.
    assert kinds[0] == "Trigger" and "NotifyComplete" in kinds and attempt.finished
    assert {t for t, m in attempt.sent if isinstance(m, messages.Shutdown)} == set(attempt.tasks)
    assert all(m.stop for _, m in attempt.sent if isinstance(m, messages.NotifyComplete))
    assert res.checkpoints_completed == 1 and driver.coord.stopping


def test_tasks_that_do_not_start_in_time_fail_the_attempt(tmp_path: Path) -> None:
    driver, attempt = drive(tmp_path, startup_timeout=0.2)
    attempt.inbox = []  # nobody reports Running
    with pytest.raises(WorkerFailure, match="did not restore and start within startup_timeout=0.2s"):
        driver.run()
    assert attempt.sent == [] and driver.coord.next_trigger_at is None  # the coordinator never started


def test_too_many_expired_checkpoints_in_a_row_fail_the_attempt(tmp_path: Path) -> None:
    driver, attempt = drive(tmp_path, checkpoint_interval=0.01, checkpoint_timeout=0.05,
                            tolerable_failed_checkpoints=1)
    attempt.ack = False
    with pytest.raises(WorkerFailure, match="2 checkpoints in a row expired"):
        driver.run()
    assert driver.result.checkpoints_expired == 2
    assert [s.status.value for s in driver.result.failed_checkpoints] == ["FAILED", "FAILED"]
