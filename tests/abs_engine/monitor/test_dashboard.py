"""The dashboard's JSON API and /metrics against a real job with known checkpoints and
failures: an expired checkpoint (a function stalls once), a SIGKILLed worker and its
restore. What the API says is compared with the JobResult at the same moment (``stop_when``
runs on the driver's thread, so nothing changes while it reads), and what is stored beside
the checkpoints with the final result."""

from __future__ import annotations

import http.client
import json
import os
import socket
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from abs_engine import Dataflow, JobResult, cli
from abs_engine.monitor import store
from abs_engine.monitor.dashboard import Dashboard, DashboardError
from abs_engine.monitor.model import CheckpointStatus
from abs_engine.monitor.tracker import JobTracker
from abs_engine.testing import CapturingSink, KillOnCheckpoints, TestingSource
from tests.abs_engine.monitor.test_tracker import Clock, plan


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        body = r.read().decode()
    return json.loads(body) if "/api/" in url else body


def metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "job"))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def stalls_once(marker: str):  # type: ignore[no-untyped-def]
    def fn(w: str) -> str:
        if w == "stall" and not os.path.exists(marker):
            open(marker, "w").close()
            time.sleep(2.0)  # the workload: a call that takes long once, so a checkpoint expires
        elif w.endswith("00"):
            time.sleep(0.001)  # the workload: paced, so the job outlives the kill and the restore
        return w
    return fn


@pytest.mark.slow
def test_api_and_metrics_agree_with_the_job(tmp_path) -> None:  # type: ignore[no-untyped-def]
    words = [f"w{i}" for i in range(400_000)]
    words[3000] = "stall"
    flow = Dataflow("dash")
    (flow.source(TestingSource(words), "read", parallelism=2).map(stalls_once(str(tmp_path / "stalled")), "slow")
     .key_by(lambda w: w[-1]).count("count", parallelism=2).sink(CapturingSink(str(tmp_path / "out")), "out"))
    seen: dict[str, Any] = {}

    def stop_when(res: JobResult) -> bool:
        done_after_restart = [s for s in res.checkpoints if s.attempt == 1]
        failed = [s for s in res.failed_checkpoints if s.status is CheckpointStatus.FAILED]
        if not (res.restarts == 1 and failed and len(done_after_restart) >= 2):
            return False
        url = res.dashboard_url
        last = res.checkpoints[-1]
        seen.update(job=get(url + "api/job"), cps=get(url + "api/checkpoints"),
                    detail=get(url + f"api/checkpoints/{last.checkpoint_id}"), metrics=metrics(get(url + "metrics")),
                    result=(res.checkpoints_completed, list(res.checkpoints), list(res.failed_checkpoints),
                            list(res.recoveries), list(res.restored_from), list(res.failures)))
        with pytest.raises(urllib.error.HTTPError) as e:
            get(url + "api/checkpoints/999999")
        seen["missing"] = (e.value.code, json.loads(e.value.read())["error"])
        return True

    chaos = KillOnCheckpoints([4], seed=3)
    res = flow.run(checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_interval=0.1, checkpoint_timeout=0.5,
                   tolerable_failed_checkpoints=None, channel_buffer=16384, dashboard=0, stop_when=stop_when,
                   chaos=chaos)
    assert res.cancelled and seen, "the job ended before it had a restart, a failed checkpoint and a restore"
    completed, checkpoints, failed, recoveries, restored_from, failures = seen["result"]
    job, cps = seen["job"], seen["cps"]

    # checkpoints: the counts, and every listed entry's status, as the result has them
    n_failed = sum(s.status is CheckpointStatus.FAILED for s in failed)
    assert cps["counts"]["completed"] == completed and cps["counts"]["failed"] == len(failed) and n_failed >= 1
    assert cps["counts"]["restored"] == 1 == len(restored_from)
    ids = [s.checkpoint_id for s in checkpoints + failed]
    assert len(ids) == len(set(ids))  # an id names one checkpoint: one aborted by the failover is not reused
    status = {s.checkpoint_id: s.status.value for s in checkpoints + failed}
    assert cps["history"] and all(status[h["id"]] == h["status"] for h in cps["history"] if h["status"] != "IN_PROGRESS")
    expired = [h for h in cps["history"] if h["status"] == "FAILED"]
    assert expired and all("expired after checkpoint_timeout=0.5s" in h["failure_message"] for h in expired)
    assert cps["latest"]["completed"]["id"] == checkpoints[-1].checkpoint_id
    assert cps["latest"]["restored"]["id"] == restored_from[-1]
    # one checkpoint's subtasks, as the result has them
    detail, last = seen["detail"], checkpoints[-1]
    assert detail["num_acknowledged_subtasks"] == detail["num_subtasks"] == len(last.subtasks)
    assert [(d["task"], d["state_size"]) for d in detail["subtasks"]] == [(s.task, s.state_size) for s in last.subtasks]
    assert seen["missing"][0] == 404 and "999999" in seen["missing"][1]
    # the job: one recovery, from the task the chaos killed, restored from the checkpoint the result says
    assert job["restarts"] == 1 and job["state"] == "RUNNING" and job["attempt"] == 1
    [rec] = job["recoveries"]
    assert rec["failed_task"] == chaos.killed[0] and rec["restored_from"] == restored_from[-1]
    assert rec["running_after_ms"] is not None and rec["running_after_ms"] > 0 and chaos.killed[0] in failures[0]
    assert {t["status"] for t in job["tasks"]} == {"RUNNING"} and all(t["pid"] for t in job["tasks"])
    assert [v["id"] for v in job["vertices"]][0] == "read" and not any(e["back_edge"] for e in job["edges"])
    # metrics: the same counts
    m = seen["metrics"]
    assert m[("abs_engine_checkpoints_total", (("status", "completed"),))] == completed
    assert m[("abs_engine_checkpoints_total", (("status", "failed"),))] == n_failed
    assert m[("abs_engine_checkpoints_total", (("status", "aborted"),))] == len(failed) - n_failed
    assert m[("abs_engine_job_restarts_total", ())] == 1
    assert m[("abs_engine_checkpoint_duration_seconds_count", ())] == completed
    assert m[("abs_engine_checkpoint_last_id", ())] == last.checkpoint_id
    read = sum(v for (name, labels), v in m.items() if name == "abs_engine_task_records_in_total"
               and dict(labels)["vertex"] == "read")
    assert read > 3000  # the sources read past the stall, in both attempts

    # stored beside the checkpoints: the final state, and a report of it
    doc = store.read_stats(str(tmp_path / "ckpt"))
    assert doc["job"]["state"] == "CANCELED" and doc["checkpoints"]["counts"]["completed"] == res.checkpoints_completed
    assert doc["checkpoints"]["counts"]["failed"] == len(res.failed_checkpoints)
    assert set(doc["details"]) >= {str(s.checkpoint_id) for s in res.checkpoints[-3:]}
    out = tmp_path / "report.html"
    assert cli.main(["report", str(tmp_path / "ckpt"), "-o", str(out)]) == 0
    assert res.job_id in out.read_text()


def test_port_in_use_and_foreign_hosts_are_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    tr = JobTracker(plan(tmp_path), "aligned", 1.0, Clock())
    with socket.create_server(("127.0.0.1", 0)) as taken:
        with pytest.raises(DashboardError, match="pass another port, or 0"):
            Dashboard(tr, "127.0.0.1", taken.getsockname()[1])
    with Dashboard(tr, "127.0.0.1", 0) as board:
        port = int(board.url.rsplit(":", 1)[1].strip("/"))
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/api/job", headers={"Host": "attacker.example"})  # DNS rebinding
        assert conn.getresponse().status == 400
        conn.close()
        assert get(board.url + "api/job")["name"] == "t"
        assert "abs_engine_checkpoints_in_progress" in get(board.url + "metrics")


def stalls_then_fails_once(marker: str):  # type: ignore[no-untyped-def]
    def fn(w: str) -> str:
        if w == "fail" and not os.path.exists(marker):
            open(marker, "w").close()
            time.sleep(1.0)  # the workload: a slow call holds the barrier, so a checkpoint is pending
            raise RuntimeError("failing once, with a checkpoint pending")
        return w
    return fn


@pytest.mark.slow
def test_a_checkpoint_aborted_by_a_failover_keeps_its_id(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A failover with a checkpoint pending aborts it, with its reason; the next attempt's
    checkpoints take ids above it, so every id names one checkpoint."""
    words = [f"w{i}" for i in range(50_000)]
    words[20_000] = "fail"
    flow = Dataflow("ids")
    (flow.source(TestingSource(words), "read", parallelism=1).map(stalls_then_fails_once(str(tmp_path / "m")), "f")
     .key_by().count("count").sink(CapturingSink(str(tmp_path / "out")), "out"))
    res = flow.run(checkpoint_dir=str(tmp_path / "ck"), checkpoint_interval=0.05, restart_delay=0)
    assert res.restarts == 1
    aborted = [s for s in res.failed_checkpoints if s.failure.startswith("job failover")]
    assert aborted and "failing once" in aborted[0].failure and aborted[0].attempt == 0
    after = [s.checkpoint_id for s in res.checkpoints if s.attempt == 1]
    assert after and min(after) > max(s.checkpoint_id for s in aborted)
    ids = [s.checkpoint_id for s in res.checkpoints + res.failed_checkpoints]
    assert len(ids) == len(set(ids))
