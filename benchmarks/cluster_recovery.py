"""Recovery on a multi-host Spark cluster (examples/netns_cluster.py: hosts as network
namespaces, checkpoints and output on an S3 store): how long after a lost host and after a
network partition the job notices and runs again.

    python3 benchmarks/cluster_recovery.py --rounds 3

Each round runs examples/cluster_wordcount.py's jobs in one Spark application: ``none``
(the baseline), ``host`` (every process of a worker host running the job SIGKILLed right
after the second checkpoint; its worker daemon started again after the job), and
``partition`` (that host's link down for ``--partition-seconds``; the next round waits for
the heal). Reported per fault: seconds from the fault to the driver seeing the failure and
to every task of the new attempt running, and the job's wall time; every output is
compared with its batch oracle. Results: benchmarks/results/cluster_recovery.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from examples.netns_cluster import NetnsCluster, namespaces_allowed  # noqa: E402


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--words", type=int, default=3_000_000)
    ap.add_argument("--heartbeat-timeout", type=float, default=6.0)
    ap.add_argument("--partition-seconds", type=float, default=30.0)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    why = namespaces_allowed()
    if why:
        print(f"cluster_recovery: {why}", file=sys.stderr)
        return 2
    faults = ",".join(["none", "host", "partition"] * args.rounds)
    with NetnsCluster(workers=3, cores=1) as cluster:
        p = cluster.popen("driver", [sys.executable, os.path.join(ROOT, "examples", "cluster_wordcount.py"),
                                     "--fault", faults, "--words", str(args.words),
                                     "--heartbeat-timeout", str(args.heartbeat_timeout),
                                     "--partition-seconds", str(args.partition_seconds)],
                          env=cluster.env(), output=subprocess.PIPE, cwd=ROOT)
        out, _ = p.communicate()
    text = out.decode(errors="replace")
    lines = [ln for ln in text.splitlines() if ln.startswith("[{")]
    if not lines:
        print(text[-4000:], file=sys.stderr)
        return 1
    runs: list[dict[str, Any]] = json.loads(lines[-1])
    summary: dict[str, dict[str, Any]] = {}
    for fault in ("none", "host", "partition"):
        mine = [r for r in runs if r["fault"] == fault]

        def p50(key: str, rows: list[dict[str, Any]] = mine) -> float | None:
            values = [r[key] for r in rows if r.get(key) is not None]
            return round(statistics.median(values), 2) if values else None

        summary[fault] = {"runs": len(mine), "exact": all(r["exact"] for r in mine),
                          "ok": all(r["ok"] for r in mine), "job_s_p50": p50("seconds"),
                          "seen_after_s_p50": p50("failure_seen_after_s"),
                          "running_again_after_s_p50": p50("running_again_after_s"),
                          "old_workers_gone_after_s_p50": p50("old_workers_gone_after_s")}
    cmd = "python3 benchmarks/cluster_recovery.py " + " ".join(argv)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cluster_recovery.json"), "w") as f:
        json.dump({"command": cmd, "args": vars(args), "runs": runs, "summary": summary, "cpus": os.cpu_count()},
                  f, indent=1)
    rows = ["| fault | runs | exact | failure seen after (p50) | running again after (p50) | "
            "cut-off workers gone after (p50) | job wall time (p50) |", "|---|---|---|---|---|---|---|"]
    for fault, s in summary.items():
        def cell(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f} s"

        rows.append(f"| {fault} | {s['runs']} | {s['exact']} | {cell(s['seen_after_s_p50'])} | "
                    f"{cell(s['running_again_after_s_p50'])} | {cell(s['old_workers_gone_after_s_p50'])} | "
                    f"{cell(s['job_s_p50'])} |")
    md = [f"# Recovery on a multi-host cluster ({args.rounds} rounds)", "",
          f"`{cmd}` on {os.cpu_count()} cores: 3 worker hosts of one slot, word count of {args.words:,} "
          f"words at parallelism 2, checkpoints every 0.5 s on the S3 store, heartbeat_timeout "
          f"{args.heartbeat_timeout:g} s, a {args.partition_seconds:g} s partition. Times count from the "
          "fault (right after the job's second checkpoint).", "", *rows, ""]
    with open(os.path.join(args.out, "cluster_recovery.md"), "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))
    return 0 if all(s["ok"] for s in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
