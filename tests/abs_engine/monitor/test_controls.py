"""The dashboard's controls against a real job (monitor/controls.py): a savepoint taken from
the dashboard while the job runs, a stop with a savepoint, and a job started from that
savepoint ends exactly once; a cancel stops a job at once; every control needs the token,
a POST and JSON, and an unknown one is refused."""

from __future__ import annotations

import collections
import json
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from abs_engine import JobResult
from abs_engine.checkpoint.remote import open_storage
from abs_engine.testing import CapturingSink
from tests.abs_engine.executors.test_rescaling import pipeline, pipeline_oracle

from .test_dashboard import TOKEN, split

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
N = 200_000
HOLD = N // 4  #: each source subtask holds there until its gate opens: the job cannot end first


def post(url: str, op: str, token: str | None = TOKEN, content_type: str = "application/json",
         method: str = "POST") -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": content_type}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url + f"api/controls/{op}", data=b"{}" if method == "POST" else None,
                                 headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            return e.code, json.loads(body)
        except ValueError:
            return e.code, {"text": body.decode(errors="replace")}


def with_controls(act: Any) -> tuple[Any, dict[str, Any]]:
    """A stop_when hook that hands the dashboard's address to ``act``, on a thread of its own
    (a control waits for the job, whose loop runs stop_when), once a checkpoint completed."""
    box: dict[str, Any] = {}

    def hook(res: JobResult) -> bool:
        if res.dashboard_url and res.checkpoints and "thread" not in box:
            url, _ = split(res.dashboard_url)
            box["thread"] = threading.Thread(target=lambda: box.update(answers=act(url)))
            box["thread"].start()
        return False

    return hook, box


def test_a_savepoint_and_a_stop_from_the_dashboard_and_a_restore_from_it_is_exact(tmp_path: Path) -> None:
    sink_dir, gate = tmp_path / "out", tmp_path / "gate"

    def act(url: str) -> dict[str, Any]:
        return {"no token": post(url, "savepoint", token=None), "a GET": post(url, "savepoint", method="GET"),
                "a form": post(url, "savepoint", content_type="application/x-www-form-urlencoded"),
                "unknown": post(url, "reboot"), "savepoint": post(url, "savepoint"), "stop": post(url, "stop")}

    hook, box = with_controls(act)
    res = pipeline(N, CapturingSink(sink_dir), 2, gate, HOLD).run(
        checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / "ck"), savepoint_dir=str(tmp_path / "sp"),
        dashboard=0, dashboard_token=TOKEN, stop_when=hook)
    box["thread"].join(60)
    answers = box["answers"]
    assert answers["no token"][0] == 401 and answers["a GET"][0] == 405
    assert answers["a form"][0] == 415 and answers["unknown"][0] == 404 and "savepoint, stop or cancel" in \
        answers["unknown"][1]["error"]
    status, taken = answers["savepoint"]
    assert status == 200 and taken["stopping"] is False and taken["savepoint"].startswith(str(tmp_path / "sp"))
    status, stopped = answers["stop"]
    assert status == 200 and stopped["stopping"] is True and stopped["savepoint"] != taken["savepoint"]
    assert res.stopped_with_savepoint and res.savepoint == stopped["savepoint"] and not res.cancelled
    for where in (taken["savepoint"], stopped["savepoint"]):  # both whole
        storage = open_storage(where)
        assert storage.verify(storage.completed_ids()[0])
    gate.touch()
    again = pipeline(N, CapturingSink(sink_dir), 2, gate, HOLD).run(
        checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / "ck2"), restore_from=res.savepoint)
    assert again.restored_from[0] == open_storage(res.savepoint).completed_ids()[0]
    assert collections.Counter(tuple(r) for r in CapturingSink(sink_dir).records()) == pipeline_oracle(N)


def test_cancel_from_the_dashboard_stops_the_job_at_once(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    hook, box = with_controls(lambda url: {"cancel": post(url, "cancel")})
    res = pipeline(N, CapturingSink(tmp_path / "out"), 2, tmp_path / "gate", HOLD).run(
        checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / "ck"), dashboard=0, dashboard_token=TOKEN,
        stop_when=hook)
    box["thread"].join(60)
    assert box["answers"]["cancel"] == (200, {"cancelled": True})
    assert res.cancelled and not res.stopped_with_savepoint and res.restarts == 0
    err = capfd.readouterr().err
    assert "cancel asked from the dashboard (client 127.0.0.1)" in err
