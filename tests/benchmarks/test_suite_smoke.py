"""The benchmark code runs end to end on tiny inputs, so it cannot rot unnoticed."""

from __future__ import annotations

import json
import os

import pytest

from benchmarks import suite

pytestmark = pytest.mark.slow


def test_suite_quick_on_tiny_inputs_writes_results_plots_and_summary(tmp_path):
    out = tmp_path / "results"
    assert suite.main(["--quick", "--words", "200000", "--records", "20000", "--out", str(out)]) == 0
    doc = json.loads((out / "suite.json").read_text())
    modes = {r["mode"] for r in doc["runs"]}
    assert modes == {"none", "aligned", "unaligned", "stop-the-world"}
    assert {r["parallelism"] for r in doc["runs"]} == {1, 2, 4}
    assert all(r["seconds"] > 0 for r in doc["runs"])
    assert set(doc["summary"]["overhead"]["pipeline"]["stop-the-world"]) == {"0.1", "0.5", "2.0"}
    for png in ("overhead_vs_interval", "scalability", "checkpoint_latency", "output_stall"):
        data = (out / "plots" / f"{png}.png").read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 5_000
    md = (out / "suite.md").read_text()
    assert "stop-the-world" in md and "unaligned" in md and "plots/overhead_vs_interval.png" in md


def test_incremental_bench_runs_on_tiny_inputs(tmp_path):
    from benchmarks import incremental_bench

    out = tmp_path / "results"
    assert incremental_bench.main(["--tiny", "--rounds", "1", "--repeat", "1", "--out", str(out)]) == 0
    doc = json.loads((out / "incremental.json").read_text())
    assert doc["bytes"]["incremental"]["100"] < doc["bytes"]["full"]["100"] / 10
    assert set(doc["median_s"]) >= {"none", "ABS 1s, incremental", "ABS 0.1s, full"}
    for png in ("incremental_bytes", "incremental_sync_time"):
        assert (out / "plots" / f"{png}.png").read_bytes().startswith(b"\x89PNG")


def test_unaligned_bench_runs_on_tiny_inputs(tmp_path):
    from benchmarks import unaligned_bench

    out = tmp_path / "results"
    assert unaligned_bench.main(["--tiny", "--out", str(out)]) == 0
    doc = json.loads((out / "unaligned.json").read_text())
    assert set(doc["summary"]["backpressure"]) == set(unaligned_bench.VARIANTS)
    modes = {c["mode"] for row in doc["backpressure"] for c in row["checkpoints"]}
    assert modes <= {"aligned", "unaligned"}
    assert set(doc["summary"]["overhead_pct"]) == {"aligned 1.0s", "aligned 0.1s", "unaligned 1.0s",
                                                   "unaligned 0.1s"}
    assert (out / "plots" / "unaligned_checkpoints.png").read_bytes().startswith(b"\x89PNG")
    assert "Under backpressure" in (out / "unaligned.md").read_text()


def test_dashboard_bench_runs_on_tiny_inputs(tmp_path):
    from benchmarks import dashboard_bench

    out = tmp_path / "results"
    assert dashboard_bench.main(["--words", "300000", "--rounds", "1", "--out", str(out)]) == 0
    doc = json.loads((out / "dashboard.json").read_text())
    assert set(doc["runs"]) == {"off", "on, not polled", "on, polled 1/s + /metrics"}
    assert set(doc["overhead_median"]) == {"on, not polled", "on, polled 1/s + /metrics"}
    assert "overhead vs off" in (out / "dashboard.md").read_text()


def test_nexmark_bench_runs_on_tiny_inputs(tmp_path):
    """Without Bytewax (CI does not install it): the plain loop and the engine's variants of
    two queries (a stateless one and a windowed one), and their oracle checks (a wrong
    answer or row count would exit non-zero)."""
    from benchmarks import nexmark_bench

    out = tmp_path / "results"
    assert nexmark_bench.main(["--events", "20000", "--repeat", "1", "--interval", "0.2", "--no-bytewax",
                               "--queries", "q2,q7", "--out", str(out)]) == 0
    doc = json.loads((out / "nexmark.json").read_text())
    assert set(doc["queries"]) == {"q2", "q7"}
    for q in doc["queries"].values():
        assert set(q["events_per_s"]) == {"plain", "p1 none", "p1 abs", "p2 none", "p2 abs"}
        assert all(v > 0 for v in q["events_per_s_per_core"].values())
    text = (out / "nexmark.md").read_text()
    assert "| q7 |" in text and "Flink 1.13" in text


def test_the_micro_benchmarks_run_once_each():
    """benchmarks/micro is outside the test paths: run once here, each benchmark a single
    round (--benchmark-disable), so an API change that breaks one fails the suite (the
    channel benchmark once went without its connection's secret unnoticed)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                           "--benchmark-disable", str(root / "benchmarks" / "micro")],
                          cwd=root, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout.splitlines()[-1]
