"""The dashboard in a real browser (Debian's chromium, headless, driven by Playwright): it
opens the address the job printed (its token is exchanged for a cookie and leaves the
address bar), sees completed checkpoints rise, sees the restart that follows a SIGKILL of a
worker, and logs no error to the console; the report of the finished job opens from disk
without errors too.

Skipped when /usr/bin/chromium is missing, unless ABS_ENGINE_REQUIRE_BROWSER is set (CI
installs chromium and sets it, so there the test cannot quietly not run). Set
ABS_ENGINE_SCREENSHOT=PATH to keep a screenshot of the dashboard (the README's).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from abs_engine import cli
from tests.abs_engine.executors.procs import wait_for
from tests.abs_engine.monitor import dashboard_job

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
JOB = Path(__file__).with_name("dashboard_job.py")
ROOT = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.slow, pytest.mark.browser]


@pytest.fixture
def browser():  # type: ignore[no-untyped-def]
    if not os.path.exists(CHROMIUM):
        if os.environ.get("ABS_ENGINE_REQUIRE_BROWSER"):
            pytest.fail(f"{CHROMIUM} is missing (apt-get install chromium): the browser test must run here")
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield b
        finally:
            b.close()


def dashboard_url(proc: subprocess.Popen[str], timeout: float = 60.0) -> str:
    """The address the job prints on stderr (read with a deadline: a job that fails to start
    fails the test instead of hanging it)."""
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    seen = []
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stderr, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                break
            line = proc.stderr.readline()
            if not line:
                break
            seen.append(line)
            if "dashboard: " in line:
                return line.split("dashboard: ", 1)[1].strip()
    raise AssertionError(f"the job printed no dashboard address: {''.join(seen)[-2000:]}")


def api(printed: str, path: str) -> Any:
    """``path`` of the dashboard at the printed address, with its token as a Bearer header."""
    parts = urllib.parse.urlsplit(printed)
    [token] = urllib.parse.parse_qs(parts.query)["token"]
    req = urllib.request.Request(urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", "")),
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def number(page: Any, selector: str) -> int:
    return int(page.text_content(selector).replace(",", ""))


def watch_errors(page: Any) -> list[str]:
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    return errors


def test_dashboard_of_a_running_job_and_its_report(browser, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(JOB), str(tmp_path)], stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = dashboard_url(proc)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors = watch_errors(page)
        page.goto(url)
        # the token became an HttpOnly cookie and left the address bar
        assert "token" not in page.url and page.url == url.split("?", 1)[0]
        [cookie] = page.context.cookies()
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["value"] in url
        page.wait_for_function("() => document.querySelector('#job-state').textContent === 'RUNNING'",
                               timeout=60_000)
        page.wait_for_function("() => Number(document.querySelector('#completed-count').textContent"
                               ".replace(/,/g, '')) >= 2", timeout=60_000)
        assert page.locator("#job-graph").count() == 1 and number(page, "#restart-count") == 0
        # event time and health: the windows' watermark moves, the late record and the skipped
        # one show in the task table as the API has them, and the watermark-lag chart is drawn.
        # The sources hold before the late record until every windows task's watermark has
        # passed its window (dashboard_job's docstring): then it is late whatever the timing.
        def held_watermarks() -> list[float] | None:
            wms = [t["watermark"] for t in api(url, "/api/job")["tasks"] if t["vertex"] == "windows"]
            return wms if len(wms) == 2 and all(w is not None and w >= dashboard_job.WINDOW for w in wms) else None

        held = wait_for(held_watermarks, 60, "the windows' watermarks to pass the late record's window")
        assert max(held) < dashboard_job.LATE_AT
        watermark = "() => [...document.querySelectorAll('#task-table tbody tr')].filter(r => " \
                    "r.children[1].textContent === 'windows').map(r => r.querySelector('.task-watermark').textContent)"
        page.wait_for_function(f"() => ({watermark})().every(w => w !== '\u2014')", timeout=60_000)
        first = page.evaluate(watermark)
        (tmp_path / "gate").touch()
        page.wait_for_function(f"() => ({watermark})().join() !== {json.dumps(','.join(first))} && "
                               f"({watermark})().every(w => w !== '\u2014')", timeout=60_000)
        page.wait_for_function("() => [...document.querySelectorAll('#task-table .task-late')]"
                               ".some(c => c.textContent === '1')", timeout=60_000)
        page.wait_for_function("() => [...document.querySelectorAll('#task-table .task-skipped')]"
                               ".some(c => c.textContent === '1')", timeout=60_000)
        job = api(url, "/api/job")
        assert sum(t["skipped_records"] for t in job["tasks"]) >= 1 and job["watermarks"]["job"] is not None
        # by operator: the skip was the map "checked", chained into the source's task
        titles = "() => [...document.querySelectorAll('#task-table .task-skipped, #task-table .task-late')]" \
                 ".map(c => c.title).filter(t => t).sort()"
        page.wait_for_function(f"() => ({titles})().join('|') === 'checked: 1 skipped|windows: 1 late'", timeout=30_000)
        assert {(o["name"], o["late_records"], o["skipped_records"]) for o in job["operators"]} >= {
            ("checked", 0, 1), ("windows", 1, 0)}
        assert page.locator("#chart-wm canvas").count() >= 1
        assert all(c != "\u2014" for c in page.locator("#task-table .task-cpu").all_text_contents())
        # the sources' progress: the job's "input read" and each source task's records left
        page.wait_for_function("() => document.querySelector('#input-read').textContent.startsWith('read ')",
                               timeout=30_000)
        lefts = "() => [...document.querySelectorAll('#task-table tbody tr')].filter(r => " \
                "r.children[1].textContent === 'read').map(r => r.querySelector('.task-left').textContent)"
        page.wait_for_function(f"() => ({lefts})().length === 2 && ({lefts})().every(c => c.endsWith(' records'))",
                               timeout=30_000)
        # a tab per pipeline: the other pipeline's view holds its own tasks, state and restarts
        assert page.locator("#pipelines").is_visible()
        assert page.locator(".pipeline-tab").all_text_contents()[0].startswith("read")
        # by keyboard: the tab keeps the focus across a poll (the page redraws every second)
        page.focus(".pipeline-tab[data-pipeline='ticks']")
        uptime = page.text_content("#job-duration")
        page.wait_for_function(f"() => document.querySelector('#job-duration').textContent !== {json.dumps(uptime)}",
                               timeout=30_000)
        assert page.evaluate("() => document.activeElement.getAttribute('data-pipeline')") == "ticks"
        page.keyboard.press("Enter")
        page.wait_for_function("() => [...document.querySelectorAll('#task-table tbody tr')]"
                               ".map(r => r.children[1].textContent).join() === 'ticks'", timeout=30_000)
        assert page.url.endswith("#pipeline=ticks") and number(page, "#restart-count") == 0
        page.click(".pipeline-tab[data-pipeline='read']")
        page.wait_for_function("() => document.querySelectorAll('#task-table tbody tr').length > 1", timeout=30_000)
        # the savepoint button: confirmed in a dialog, answered with the savepoint's location
        dialogs: list[str] = []

        def accept(d: Any) -> None:
            dialogs.append(d.message)
            d.accept()

        page.once("dialog", accept)
        page.click("#control-savepoint")
        page.wait_for_function("() => document.querySelector('#control-status').textContent"
                               ".startsWith('savepoint: ')", timeout=60_000)
        where = page.text_content("#control-status").removeprefix("savepoint: ")
        assert len(dialogs) == 1 and "savepoint" in dialogs[0].lower()
        from abs_engine.checkpoint.remote import open_storage

        # one savepoint set, a whole savepoint of each pipeline in it, where the page says
        assert sorted(n for n in os.listdir(where) if n.startswith("pipeline-")) == ["pipeline-read",
                                                                                     "pipeline-ticks"]
        for name in ("read", "ticks"):
            [one] = os.listdir(os.path.join(where, f"pipeline-{name}"))
            saved = open_storage(os.path.join(where, f"pipeline-{name}", one))
            assert saved.verify(saved.completed_ids()[0])
        # SIGKILL a worker that is not a source: the dashboard shows the restart and its recovery
        victim = next(t for t in api(url, "/api/job")["tasks"] if t["vertex"] == "count" and t["pid"])
        os.kill(victim["pid"], signal.SIGKILL)
        page.wait_for_function("() => document.querySelector('#restart-count').textContent === '1'", timeout=60_000)
        page.wait_for_function("() => document.querySelectorAll('#recovery-table tbody tr').length === 1",
                               timeout=60_000)
        assert victim["id"] in page.text_content("#recovery-table")
        before = number(page, "#completed-count")
        page.wait_for_function(f"() => Number(document.querySelector('#completed-count').textContent"
                               f".replace(/,/g, '')) >= {before + 2}", timeout=60_000)
        page.wait_for_function("() => document.querySelector('#job-state').textContent === 'RUNNING'",
                               timeout=60_000)
        # a checkpoint's subtask timeline (the page fetches the selected one's details)
        page.wait_for_function("() => document.querySelectorAll('#timeline .timeline-row').length > 0",
                               timeout=30_000)
        # rates again after the recovery (two heartbeats of the new attempt): the sources read on
        page.wait_for_function("() => [...document.querySelectorAll('#task-table tbody tr')].filter(r => "
                               "r.children[1].textContent === 'read').some(r => r.querySelector('.task-in-rate').textContent !== '0')",
                               timeout=30_000)
        if os.environ.get("ABS_ENGINE_SCREENSHOT"):
            page.screenshot(path=os.environ["ABS_ENGINE_SCREENSHOT"], full_page=True)
        assert errors == []
        page.close()
    finally:
        proc.send_signal(signal.SIGTERM)  # stop with a savepoint, its sinks committed
        try:
            _, log = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, log = proc.communicate()
    assert proc.returncode == 0, f"the job did not stop cleanly on SIGTERM; its log ends:\n{log[-4000:]}"

    out = tmp_path / "report.html"
    assert cli.main(["report", str(tmp_path / "ckpt"), "-o", str(out)]) == 0
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = watch_errors(page)
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(out.as_uri())
    page.wait_for_function("() => document.querySelectorAll('#checkpoint-table tbody tr').length > 0",
                           timeout=30_000)
    assert "report" in page.text_content("#conn-status")
    assert number(page, "#restart-count") == 1 and page.locator("#recovery-table tbody tr").count() == 1
    assert page.text_content("#job-state") == "FINISHED"  # stopped with a savepoint: it ended cleanly
    page.click(".pipeline-tab[data-pipeline='ticks']")  # the report keeps a tab per pipeline too
    page.wait_for_function("() => [...document.querySelectorAll('#task-table tbody tr')]"
                           ".map(r => r.children[1].textContent).join() === 'ticks'", timeout=30_000)
    assert number(page, "#restart-count") == 0 and page.text_content("#job-state") == "FINISHED"
    assert [r for r in requests if not r.startswith("file:")] == []  # self-contained: fetches nothing
    assert errors == []
