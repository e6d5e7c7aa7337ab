"""A JobResult prints as a short summary (``print(flow.run())``), whatever the job went
through; every field is one call away (``details()``)."""

from __future__ import annotations

from abs_engine.executors.result import JobResult
from abs_engine.monitor.latency import LatencySummary
from abs_engine.monitor.model import RecoveryEvent


def long_job() -> JobResult:
    res = JobResult("sessions", duration_s=812.34, running_after_s=0.61, restarts=40, source_records=12_345_678,
                    restored_from=[3, 7], skipped_records=2, checkpoint_dir="/data/ck",
                    latency=LatencySummary(1.25, 9.5, 20.0, 300),
                    failures=["task count#1 was killed by signal 9"] * 40,
                    recoveries=[RecoveryEvent(1.0, i, "count#1", "killed by signal 9 " * 5, i, 0.4)
                                for i in range(40)])
    res.pipelines = [JobResult("sessions", pipeline=f"p{i}") for i in range(3)]
    return res


def test_a_result_prints_as_a_summary_and_keeps_every_field_one_call_away() -> None:
    res = long_job()
    text = str(res)
    assert len(text) < 500, text
    for part in ("job 'sessions' ended after 812.3 s", "12,345,678 source records", "40 restart(s)",
                 "restored from [3, 7]", "2 record(s) skipped", "p99 9.5 ms", "3 pipelines", "/data/ck",
                 ".details()"):
        assert part in text, (part, text)
    assert repr(res) == f"<JobResult {text}>"
    full = res.details()
    assert len(full) > 5_000 and full.count("killed by signal 9") >= 80 and "pipeline='p2'" in full


def test_a_cancelled_pipeline_says_so() -> None:
    text = str(JobResult("j", pipeline="read", cancelled=True))
    assert text.startswith("pipeline 'read' of job 'j' cancelled after") and "latency" not in text
