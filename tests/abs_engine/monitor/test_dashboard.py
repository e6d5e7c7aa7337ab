"""The dashboard's JSON API and /metrics against a real job with known checkpoints and
failures: an expired checkpoint (a function stalls once), a SIGKILLed worker and its
restore. What the API says is compared with the JobResult at the same moment (``stop_when``
runs on the driver's thread, so nothing changes while it reads), and what is stored beside
the checkpoints with the final result. Every route needs the job's token: a Bearer header,
the cookie a ``?token=`` link sets, or ``?token=`` itself."""

from __future__ import annotations

import http.client
import http.cookiejar
import json
import os
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from abs_engine import Dataflow, JobResult, cli
from abs_engine.monitor import store
from abs_engine.monitor.dashboard import Dashboard, DashboardError, cookie_name
from abs_engine.monitor.model import CheckpointStatus
from abs_engine.monitor.tracker import JobTracker
from abs_engine.testing import CapturingSink, GatedSource, KillOnCheckpoints, TestingSource
from tests.abs_engine.monitor.test_tracker import Clock, plan


#: A fixed token (JobConfig.dashboard_token) for the job test; others use the random one.
TOKEN = "fixed-token-for-the-dashboard-test"


def split(url: str) -> tuple[str, str]:
    """The printed address ``http://HOST:PORT/?token=T`` as its base (``http://HOST:PORT/``) and T."""
    parts = urllib.parse.urlsplit(url)
    [token] = urllib.parse.parse_qs(parts.query)["token"]
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/", "", "")), token


def get(url: str, token: str) -> Any:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        body = r.read().decode()
    return json.loads(body) if "/api/" in url else body


def raw(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, http.client.HTTPMessage, str]:
    """One GET, redirects not followed: status, headers, body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.headers, r.read().decode()
    finally:
        conn.close()


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
    # Each source subtask holds after 100k words (the gate never opens): the job cannot end
    # before the restart and the checkpoints after it, however slowly it runs (it once did:
    # under load most checkpoints expired and the input ran out first).
    source = GatedSource(TestingSource(words), tmp_path / "gate", after=100_000)
    (flow.source(source, "read", parallelism=2).map(stalls_once(str(tmp_path / "stalled")), "slow")
     .key_by(lambda w: w[-1]).count("count", parallelism=2).sink(CapturingSink(str(tmp_path / "out")), "out"))
    seen: dict[str, Any] = {}

    def stop_when(res: JobResult) -> bool:
        done_after_restart = [s for s in res.checkpoints if s.attempt == 1]
        failed = [s for s in res.failed_checkpoints if s.status is CheckpointStatus.FAILED]
        if not (res.restarts == 1 and failed and len(done_after_restart) >= 2):
            return False
        url, token = split(res.dashboard_url)
        last = res.checkpoints[-1]
        seen.update(job=get(url + "api/job", token), cps=get(url + "api/checkpoints", token),
                    detail=get(url + f"api/checkpoints/{last.checkpoint_id}", token),
                    metrics=metrics(get(url + "metrics", token)), printed=res.dashboard_url,
                    result=(res.checkpoints_completed, list(res.checkpoints), list(res.failed_checkpoints),
                            list(res.recoveries), list(res.restored_from), list(res.failures)))
        with pytest.raises(urllib.error.HTTPError) as e:
            get(url + "api/checkpoints/999999", token)
        seen["missing"] = (e.value.code, json.loads(e.value.read())["error"])
        return True

    chaos = KillOnCheckpoints([4], seed=3)
    res = flow.run(checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_interval=0.1, checkpoint_timeout=0.5,
                   tolerable_failed_checkpoints=None, channel_buffer=16384, dashboard=0, dashboard_token=TOKEN,
                   stop_when=stop_when, chaos=chaos)
    assert res.cancelled and seen, "the job ended before it had a restart, a failed checkpoint and a restore"
    assert seen["printed"].endswith(f"/?token={TOKEN}")  # the user's token, not a random one
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
    # latency: the sinks' marker ages, in the API, the metrics and the result
    lat = job["latency"]
    assert lat["run"]["samples"] >= 1 and lat["run"]["p50_ms"] <= lat["run"]["p99_ms"] <= lat["run"]["max_ms"]
    assert m[("abs_engine_latency_markers_total", ())] >= lat["run"]["samples"]
    if lat["recent"] is not None:
        assert m[("abs_engine_latency_seconds", (("quantile", "0.99"),))] >= 0
    assert res.latency is not None and res.latency.samples >= lat["run"]["samples"]

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
        url, token = split(board.url)
        port = urllib.parse.urlsplit(url).port or 0
        # DNS rebinding: refused on its Host, even with the token
        assert raw(port, "/api/job", {"Host": "attacker.example", "Authorization": f"Bearer {token}"})[0] == 400
        assert get(url + "api/job", token)["name"] == "t"


#: Every route the dashboard serves: the page, the API, the metrics, the page's files.
ROUTES = ["/", "/api/job", "/api/checkpoints", "/api/checkpoints/1", "/metrics", "/static/app.js",
          "/static/vendor/uPlot.iife.min.js"]


def test_every_route_needs_the_token(tmp_path) -> None:  # type: ignore[no-untyped-def]
    tr = JobTracker(plan(tmp_path), "aligned", 1.0, Clock())
    with Dashboard(tr, "127.0.0.1", 0) as board, Dashboard(tr, "127.0.0.1", 0) as other:
        url, token = split(board.url)
        port = urllib.parse.urlsplit(url).port or 0
        assert len(token) >= 32 and token != split(other.url)[1]  # token_urlsafe(24): random per dashboard
        cookie = cookie_name(port)
        wrong = split(other.url)[1]  # a real token, of another job
        refused = {
            "none": {},
            "wrong bearer": {"Authorization": f"Bearer {wrong}"},
            "basic, not bearer": {"Authorization": f"Basic {token}"},
            "wrong cookie": {"Cookie": f"{cookie}={wrong}"},
            "another port's cookie": {"Cookie": f"{cookie_name(port + 1)}={token}"},
        }
        for path in ROUTES:
            for why, headers in refused.items():
                status, head, body = raw(port, path, headers)
                assert status == 401, (path, why, status)
                assert "open the address the job printed" in body and token not in body and wrong not in body
                assert head["WWW-Authenticate"].startswith("Bearer") and "Set-Cookie" not in head
            sep = "&" if "?" in path else "?"
            for bad in (wrong, "", "%C3%A9%FF"):  # another's, empty, not even ASCII: 401, never a 500
                assert raw(port, f"{path}{sep}token={bad}")[0] == 401, (path, bad)

        # Bearer (scripts, Prometheus) on every route
        bearer = {"Authorization": f"Bearer {token}"}
        for path in ROUTES:
            assert raw(port, path, bearer)[0] == (404 if path == "/api/checkpoints/1" else 200), path
        assert "abs_engine_checkpoints_in_progress" in get(url + "metrics", token)
        assert raw(port, "/api/job", {"Authorization": f"bearer  {token} "})[0] == 200  # the scheme is any case

        # the printed address: 303 to the same place without the token, setting the cookie
        assert board.url == f"{url}?token={token}"
        status, head, body = raw(port, "/?token=" + token)
        assert status == 303 and head["Location"] == "/" and token not in head["Location"]
        set_cookie = head["Set-Cookie"]
        assert set_cookie.startswith(f"{cookie}={token};")
        assert {"httponly", "path=/", "samesite=strict"} <= {a.strip().lower() for a in set_cookie.split(";")}
        status, head, _ = raw(port, f"/static/app.css?v=2&token={token}&x=%2F")  # other parameters stay
        assert status == 303 and head["Location"] == "/static/app.css?v=2&x=%2F"
        status, head, _ = raw(port, f"//elsewhere.example/?token={token}")
        assert status == 303 and head["Location"] == "/elsewhere.example/"  # never a //host redirect

        # the cookie then works on every route; the page is the page
        jar = {"Cookie": f"other=1; {cookie}={token}"}
        status, _, page = raw(port, "/", jar)
        assert status == 200 and "<title>abs-engine job</title>" in page
        assert json.loads(raw(port, "/api/job", jar)[2])["name"] == "t"
        assert all(raw(port, path, jar)[0] in (200, 404) for path in ROUTES)
        # scripts may put it in the query: the API answers, no redirect
        status, _, body = raw(port, "/api/job?token=" + token)
        assert status == 200 and json.loads(body)["name"] == "t"
        assert raw(port, "/metrics?token=" + token)[0] == 200


def test_the_printed_address_opens_like_a_page(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A client with a cookie jar, as a browser: it opens the printed address, lands on the
    page without the token, and with the cookie alone loads the page's files and the API."""
    tr = JobTracker(plan(tmp_path), "aligned", 1.0, Clock())
    with Dashboard(tr, "127.0.0.1", 0) as board:
        url, token = split(board.url)
        jar = http.cookiejar.CookieJar()
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        with browser.open(board.url, timeout=10) as r:
            assert r.url == url and "<title>abs-engine job</title>" in (page := r.read().decode())
        assert [(c.name, c.value) for c in jar] == [(cookie_name(board.sock.getsockname()[1]), token)]
        files = re.findall(r'(?:href|src)="(static/[^"]+)"', page)
        assert "static/app.js" in files and "static/vendor/uPlot.iife.min.js" in files
        for path in files + ["api/job", "api/checkpoints"]:  # what the page loads and polls, relative to it
            with browser.open(url + path, timeout=10) as r:
                assert r.status == 200 and "token" not in r.url, path


def test_a_fixed_token(tmp_path) -> None:  # type: ignore[no-untyped-def]
    tr = JobTracker(plan(tmp_path), "aligned", 1.0, Clock())
    with Dashboard(tr, "127.0.0.1", 0, token=TOKEN) as board:
        url, token = split(board.url)
        assert token == TOKEN
        assert get(url + "api/job", TOKEN)["name"] == "t"
        with pytest.raises(urllib.error.HTTPError) as e:
            get(url + "api/job", TOKEN + "x")  # a longer one is wrong too
        assert e.value.code == 401


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
    # Its reason names the task, the operator and the exception's type; the exception's
    # message (it may hold a record's data) stays in the driver's log and JobResult.failures.
    assert aborted and "operator 'f'" in aborted[0].failure and "RuntimeError" in aborted[0].failure
    assert "failing once" not in aborted[0].failure and "failing once" in res.failures[0]
    assert aborted[0].attempt == 0
    after = [s.checkpoint_id for s in res.checkpoints if s.attempt == 1]
    assert after and min(after) > max(s.checkpoint_id for s in aborted)
    ids = [s.checkpoint_id for s in res.checkpoints + res.failed_checkpoints]
    assert len(ids) == len(set(ids))
