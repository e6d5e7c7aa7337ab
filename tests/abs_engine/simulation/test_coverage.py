"""The simulation runs the production task: measured, not claimed. Line coverage of the
runtime's protocol modules (the task, its barrier handler and snapshots, barrier alignment,
the operator chain, channel-state logging, snapshot encoding) while seeds of every topology
run, in a fresh interpreter so that every line of those modules is counted from their
import on.

The same figure by hand: ``python3 -m coverage run --include='abs_engine/runtime/*' -m
abs_engine.simulation --seeds 45 && python3 -m coverage report``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import abs_engine.runtime as runtime_pkg

#: The modules whose code the simulation must run, and the share of their lines it must reach.
MODULES = ("task.py", "barriers.py", "snapshots.py", "alignment.py", "chain.py", "channel_state.py",
           "snapshot_encoding.py")
AT_LEAST = 0.60


def test_the_simulation_runs_most_of_the_production_task_code(tmp_path: Path) -> None:
    root = os.path.dirname(os.path.abspath(runtime_pkg.__file__))
    paths = [os.path.join(root, m) for m in MODULES]
    data = tmp_path / ".coverage"
    env = {**os.environ, "COVERAGE_FILE": str(data)}
    for mode in ("aligned", "unaligned", "timeout"):
        subprocess.run([sys.executable, "-m", "coverage", "run", "--append", f"--include={','.join(paths)}",
                        "-m", "abs_engine.simulation", "--seeds", "15", "--mode", mode, "--progress-every", "15"],
                       env=env, check=True, capture_output=True, timeout=300)
    report = tmp_path / "coverage.json"
    subprocess.run([sys.executable, "-m", "coverage", "json", "-o", str(report)], env=env, check=True,
                   capture_output=True, timeout=120)
    files = json.loads(report.read_text())["files"]
    per = {os.path.basename(f): d["summary"] for f, d in files.items()}
    assert set(per) == set(MODULES), per
    statements = sum(s["num_statements"] for s in per.values())
    covered = sum(s["covered_lines"] for s in per.values())
    shares = {m: round(s["covered_lines"] / s["num_statements"], 2) for m, s in per.items()}
    assert covered / statements >= AT_LEAST, f"{covered / statements:.0%} of the protocol lines ran: {shares}"
    # The task itself, not only its helpers.
    assert shares["task.py"] >= AT_LEAST, shares
