"""What a task's heartbeat says of its health (runtime/task_health.py), through the tracker
to the dashboard's API and /metrics, against a real event-time job held in a known state:
its watermark, one late record, one skipped record, the keys and timers of its open
windows, and its process's CPU time and memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from abs_engine import Dataflow, JobResult
from abs_engine.runtime import task_health
from abs_engine.testing import CapturingSink, GatedSource, TestingSource
from operators import RangeSource, TumblingWindows, ascending
from operators.progress import SourceProgress

from .test_dashboard import TOKEN, get, metrics, split


class _Time:
    source = None
    sent = None
    watermark = 41.0


class _Timers:
    def __len__(self) -> int:
        return 7


class _Window:
    state_layout = {"keys": "keyed"}
    late_records = 2
    timers = _Timers()

    def keyed_state(self) -> dict[str, Any]:
        return {"a": {}, "b": {}, "c": {}}


class _Chain:
    names = ["win", "map"]
    ops = [_Window(), object()]


class _Task:
    time = _Time()
    chain = _Chain()


def test_measure_reads_the_task_without_changing_it() -> None:
    watermark, cpu, rss, keys, timers, late, *progress = task_health.measure(_Task())
    assert (watermark, keys, timers, late) == (41.0, 3, 7, {"win": 2})  # by operator: none for the map
    assert cpu > 0 and rss > 1 << 20
    assert progress == [-1, -1, "", ""]  # not a source


class _Reading:
    def __init__(self, answer: Any):
        self.answer = answer

    def progress(self) -> SourceProgress | None:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer  # type: ignore[no-any-return]


def test_a_sources_progress_travels_unbounded_as_minus_one_and_a_read_that_raises_is_left_out() -> None:
    task = _Task()
    task.source = _Reading(SourceProgress(3, 10, "partitions", "partition 7, row 5"))  # type: ignore[attr-defined]
    assert task_health.progress_of(task) == (3, 10, "partitions", "partition 7, row 5")
    task.source = _Reading(SourceProgress(None, None, "changes", "LSN 0/1"))  # type: ignore[attr-defined]
    assert task_health.progress_of(task) == (-1, -1, "changes", "LSN 0/1")
    task.source = _Reading(IndexError("list index out of range"))  # type: ignore[attr-defined]
    assert task_health.progress_of(task) == (-1, -1, "", "")  # the watchdog lives on


class _Resized:
    def __len__(self) -> int:
        raise RuntimeError("dictionary changed size during iteration")


def test_a_count_read_while_it_changes_is_unknown_not_wrong() -> None:
    """One operator's timers resized under the watchdog: the task's timers are -1
    (unknown), never the others' sum."""
    resized = _Window()
    resized.timers = _Resized()  # type: ignore[assignment]

    class Chain:
        names = ["first", "second"]
        ops = [resized, _Window()]

    task = _Task()
    task.chain = Chain()  # type: ignore[assignment]
    assert task_health.held(task) == (6, -1, {"first": 2, "second": 2})


def run_held(flow: Dataflow, tmp_path: Path, ready: Any) -> tuple[JobResult, dict[str, Any], Any]:
    """Run ``flow`` (held by its gate) with a dashboard until ``ready(its /api/job)``, then
    cancel it: its result, that document and ``/metrics`` then."""
    seen: dict[str, Any] = {}

    def stop_when(res: JobResult) -> bool:
        if not res.dashboard_url:
            return False
        url, token = split(res.dashboard_url)
        job = get(url + "api/job", token)
        if not ready(job):
            return False
        seen.update(job=job, metrics=metrics(get(url + "metrics", token)))
        return True

    res = flow.run(checkpoint_dir=str(tmp_path / "ck"), checkpoint_interval=0.2, heartbeat_interval=0.1,
                   dashboard=0, dashboard_token=TOKEN, stop_when=stop_when)
    assert res.cancelled and seen, "the job never reached the state the test holds it in"
    return res, seen["job"], seen["metrics"]


def _skip_seven(r: tuple[str, int]) -> tuple[str, int]:
    if r == ("k7", 7):
        raise ValueError("seven is skipped")
    return r


@pytest.mark.slow
def test_the_api_and_metrics_show_watermarks_late_and_skipped_records_keys_timers_cpu_and_memory(
        tmp_path: Path) -> None:
    # ts 0..99, key k(ts % 10); then one record behind the watermark: late. The gate never
    # opens: the job holds with the windows [90, 100) open, one per key.
    items = [(f"k{ts % 10}", ts) for ts in range(100)] + [("k0", 5)]
    flow = Dataflow("health")
    windows = (flow.source(GatedSource(TestingSource(items, batch_size=10), tmp_path / "never", after=len(items)),
                           "read", timestamps=lambda r: r[1], watermarks=ascending())
               .map(_skip_seven, "check", on_error="skip")
               .key_by(lambda r: r[0]).window(TumblingWindows(10), lambda r: r[1])
               .aggregate(lambda: 0, lambda a, r: a + 1, name="win"))
    windows.sink(CapturingSink(tmp_path / "out"), "out")
    windows.late.sink(CapturingSink(tmp_path / "late"), "late")

    def ready(job: dict[str, Any]) -> bool:
        win = [t for t in job["tasks"] if t["vertex"] == "win"]
        return bool(win and win[0]["late_records"] == 1 and win[0]["watermark"] == 98.0
                    and sum(t["skipped_records"] for t in job["tasks"]) == 1
                    and all(t["cpu_seconds"] > 0 for t in job["tasks"]))  # (every task has said it once)

    res, job, m = run_held(flow, tmp_path, ready)
    # JobResult keeps what the task table showed (the job was held: nothing changed since)
    for t in job["tasks"]:
        kept = res.tasks[t["id"]]
        assert (kept.vertex, kept.late_records, kept.skipped_records, kept.keys, kept.timers, kept.watermark) == (
            t["vertex"], t["late_records"], t["skipped_records"], t["keys"], t["timers"], t["watermark"]), t["id"]
    assert res.tasks["win#0"].late_records == 1 and sum(s.skipped_records for s in res.tasks.values()) == 1
    # by operator: the skip was the map's, chained behind the source; the late record the windows'
    assert (res.tasks["read#0"].skipped_by_operator, res.tasks["win#0"].late_by_operator) == ({"check": 1}, {"win": 1})
    assert {t["id"]: (t["late_by_operator"], t["skipped_by_operator"]) for t in job["tasks"]} == {
        k: (s.late_by_operator, s.skipped_by_operator) for k, s in res.tasks.items()}
    assert [(o["name"], o["vertex"], o["late_records"], o["skipped_records"]) for o in job["operators"]] == [
        ("read", "read", 0, 0), ("check", "read", 0, 1), ("win", "win", 1, 0), ("out", "out", 0, 0),
        ("win_late", "win_late", 0, 0), ("late", "win_late", 0, 0)]  # (the side output's own vertex)
    [win] = [t for t in job["tasks"] if t["vertex"] == "win"]
    assert (win["keys"], win["timers"]) == (10, 10)  # the windows [90, 100), one per key, each with its timer
    assert res.skipped_records == 1
    assert job["watermarks"]["job"] == 98.0 and job["watermarks"]["vertices"]["win"] == 98.0
    assert job["watermarks"]["lag"] == 0.0  # every vertex has caught up with the source
    assert all(t["cpu_seconds"] > 0 and t["rss_bytes"] > 1 << 20 for t in job["tasks"])
    labels = (("task", win["id"]), ("vertex", "win"))
    assert m[("abs_engine_task_watermark", labels)] == 98.0
    assert m[("abs_engine_task_late_records_total", labels)] == 1
    assert m[("abs_engine_task_keys", labels)] == 10 and m[("abs_engine_task_timers", labels)] == 10
    assert sum(v for (name, _), v in m.items() if name == "abs_engine_task_skipped_records_total") == 1
    assert {(name, dict(ls)["operator"]): v for (name, ls), v in m.items() if name.startswith("abs_engine_operator_")} \
        == {("abs_engine_operator_late_records_total", "win"): 1, ("abs_engine_operator_skipped_records_total", "check"): 1}
    assert m[("abs_engine_task_resident_bytes", labels)] > 1 << 20


@pytest.mark.slow
def test_the_api_and_metrics_show_each_sources_progress_exactly(tmp_path: Path) -> None:
    # Two subtasks of range(1000), each held after 200 of its 500 records: 600 left.
    flow = Dataflow("progress")
    (flow.source(GatedSource(RangeSource(0, 1000, batch_size=10), tmp_path / "never", after=200), "read",
                 parallelism=2)
     .map(lambda n: n * 2, "double").sink(CapturingSink(tmp_path / "out"), "out"))
    res, job, m = run_held(flow, tmp_path, lambda job: (job["sources"]["read"] or {}).get("done") == 400)
    assert [(res.tasks[f"read#{i}"].left, res.tasks[f"read#{i}"].total, res.tasks[f"read#{i}"].unit)
            for i in range(2)] == [(300, 1000, "records")] * 2
    assert job["sources"] == {"read": {"unit": "records", "left": 600, "total": 1000, "done": 400,
                                       "fraction": 0.4}}
    reads = sorted((t for t in job["tasks"] if t["vertex"] == "read"), key=lambda t: t["subtask"])
    assert [t["progress"] for t in reads] == [
        {"left": 300, "total": 1000, "unit": "records", "position": f"index {400 + i}"} for i in range(2)]
    assert all(t["progress"] is None for t in job["tasks"] if t["vertex"] != "read")
    for t in reads:
        labels = (("task", t["id"]), ("unit", "records"), ("vertex", "read"))
        assert m[("abs_engine_source_left", labels)] == 300 and m[("abs_engine_source_total", labels)] == 1000


@pytest.mark.slow
def test_a_job_that_ends_keeps_its_sources_read_to_the_end(tmp_path: Path) -> None:
    """A job that ends before its sources' next heartbeat (or their first) keeps them read
    whole: Finished carries the source's last progress (it used to keep the last heartbeat's,
    and a report of a finished job said 99 % read, or nothing)."""
    from abs_engine.monitor.store import read_stats

    flow = Dataflow("ends")
    flow.source(RangeSource(0, 200_000, batch_size=1_000), "read", parallelism=2) \
        .sink(CapturingSink(tmp_path / "out"), "out")
    res = flow.run(checkpoint_dir=str(tmp_path / "ck"), checkpoint_interval=0.2, heartbeat_interval=30.0)
    assert [(res.tasks[f"read#{i}"].left, res.tasks[f"read#{i}"].total, res.tasks[f"read#{i}"].position)
            for i in range(2)] == [(0, 200_000, "end")] * 2
    stored = read_stats(str(tmp_path / "ck"))["job"]["sources"]
    assert stored == {"read": {"unit": "records", "left": 0, "total": 200_000, "done": 200_000, "fraction": 1.0}}


def test_a_job_that_ends_keeps_its_late_records_by_operator_without_a_heartbeat(tmp_path: Path) -> None:
    """The in-process executor sends no heartbeat: the late records come with each task's
    Finished, the skipped ones with their own reports, each under its operator's name."""
    items = [(f"k{ts % 10}", ts) for ts in range(60)] + [("k0", 5)]  # then one far behind: late
    flow = Dataflow("ends-late")
    windows = (flow.source(TestingSource(items, batch_size=10), "read", timestamps=lambda r: r[1],
                           watermarks=ascending())
               .map(_skip_seven, "check", on_error="skip")
               .key_by(lambda r: r[0]).window(TumblingWindows(10), lambda r: r[1])
               .aggregate(lambda: 0, lambda a, r: a + 1, name="win"))
    windows.sink(CapturingSink(tmp_path / "out"), "out")
    windows.late.sink(CapturingSink(tmp_path / "late"), "late")
    res = flow.run(executor="inprocess", checkpoint_dir=str(tmp_path / "ck"), checkpoint_interval=0.1)
    assert {k: (s.late_by_operator, s.skipped_by_operator) for k, s in res.tasks.items() if s.late_records
            or s.skipped_records} == {"read#0": ({}, {"check": 1}), "win#0": ({"win": 1}, {})}
    assert [tuple(r) for r in CapturingSink(tmp_path / "late").records()] == [("k0", 5)]
