"""One dashboard for a job of several pipelines (executors/pipelined.py), a view each: a
real job of two pipelines whose p1 worker is SIGKILLed shows p1 restarted alone, each
pipeline's tasks, progress and checkpoints under ``?pipeline=``, ``/metrics`` labelled by
pipeline, and the controls acting on the whole job (a savepoint set of both, a cancel of
both)."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from abs_engine import Dataflow, JobResult
from abs_engine.testing import CapturingSink, GatedSource
from operators import RangeSource

from .test_controls import post
from .test_dashboard import TOKEN, get, metrics, split

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def get_status(url: str) -> int:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def test_each_pipeline_has_its_own_view_and_the_controls_act_on_the_job(tmp_path: Path) -> None:
    flow = Dataflow("two")
    for i in range(2):  # two pipelines, each read to 500 of 2,000 and held there
        (flow.source(GatedSource(RangeSource(0, 2000, batch_size=100), tmp_path / "never", after=500), f"p{i}")
         .map(lambda n: n + 1, f"inc{i}").sink(CapturingSink(tmp_path / f"out{i}"), f"out{i}"))
    box: dict[str, Any] = {}

    def stop_when(res: JobResult) -> bool:
        if not res.dashboard_url:
            return False
        url, _ = split(res.dashboard_url)
        views = {p["name"]: p for p in get(url + "api/pipelines", TOKEN)["pipelines"]}
        if "killed" not in box:
            if all(p["checkpoints"]["completed"] >= 1 for p in views.values()):
                [p1] = get(url + "api/job?pipeline=p1", TOKEN)["tasks"]  # (its operators chained in one task)
                if p1["pid"]:
                    os.kill(p1["pid"], signal.SIGKILL)
                    box["killed"] = p1["pid"]
            return False
        if "saved" not in box:  # p1 is back (restored) and both have read to their gates
            jobs = {n: get(url + f"api/job?pipeline={n}", TOKEN) for n in views}
            if not (views["p1"]["restarts"] == 1 and views["p1"]["state"] == "RUNNING"
                    and all((j["sources"][f"p{i}"] or {}).get("done") == 500 for i, j in enumerate(jobs.values()))):
                return False
            box.update(views=views, jobs=jobs, cps={n: get(url + f"api/checkpoints?pipeline={n}", TOKEN) for n in views},
                       first=get(url + "api/job", TOKEN), unknown=get_status(url + "api/job?pipeline=p9"),
                       metrics=metrics(get(url + "metrics", TOKEN)),
                       families=[f.name for f in text_string_to_metric_families(get(url + "metrics", TOKEN))])
            # A control waits for the job, whose loop runs this hook: from a thread of its own.
            box["saved"] = threading.Thread(target=lambda: box.update(savepoint=post(url, "savepoint")))
            box["saved"].start()
            return False
        if "savepoint" in box and "cancel" not in box:
            box["cancel"] = post(url, "cancel")
        return False

    res = flow.run(checkpoint_dir=str(tmp_path / "ck"), checkpoint_interval=0.2, heartbeat_interval=0.1,
                   dashboard=0, dashboard_token=TOKEN, stop_when=stop_when)
    assert res.cancelled and "cancel" in box, "the job did not get as far as its cancel"
    views, jobs = box["views"], box["jobs"]
    assert list(views) == ["p0", "p1"]
    assert (views["p0"]["restarts"], views["p1"]["restarts"]) == (0, 1)  # p1 restarted alone
    assert [p.restarts for p in res.pipelines] == [0, 1]
    assert views["p0"]["vertices"] == ["p0"] and views["p1"]["tasks"] == 1
    for name, job in jobs.items():
        assert [t["id"] for t in job["tasks"]] == [f"{name}#0"]  # its own tasks only
        assert job["sources"] == {name: {"unit": "records", "left": 1500, "total": 2000, "done": 500,
                                         "fraction": 0.25}}
    assert box["first"]["vertices"] == jobs["p0"]["vertices"]  # no ?pipeline=: the first
    assert box["unknown"] == 404
    assert box["cps"]["p1"]["counts"]["restored"] == 1 and box["cps"]["p0"]["counts"]["restored"] == 0
    m = box["metrics"]
    assert m[("abs_engine_job_restarts_total", (("pipeline", "p1"),))] == 1
    assert m[("abs_engine_job_restarts_total", (("pipeline", "p0"),))] == 0
    assert len(box["families"]) == len(set(box["families"]))  # one family per name, every pipeline in it
    status, answer = box["savepoint"]
    assert status == 200, answer
    assert sorted(n for n in os.listdir(answer["savepoint"]) if n.startswith("pipeline-")) == ["pipeline-p0",
                                                                                             "pipeline-p1"]
    assert box["cancel"] == (200, {"cancelled": True})
    # each pipeline's stored statistics say its place in the plan (the report's tab order)
    from abs_engine.monitor.store import read_stats

    assert [read_stats(str(tmp_path / "ck" / f"pipeline-{n}"))["pipeline_id"] for n in ("p0", "p1")] == [0, 1]

