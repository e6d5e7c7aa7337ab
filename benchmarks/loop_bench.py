"""Back-edge logging overhead on an iterative job: Collatz step counts (examples/collatz.py).

    python benchmarks/loop_bench.py                     # 20,000 numbers, 3 rounds

Runs the job without checkpoints, with ABS every 1 s and every 0.1 s, interleaved round by
round, and reports the time ratios and, for every checkpoint, how many bytes were operator
state and how many were back-edge logs (records in flight round the loop at the cut).
Results: benchmarks/results/loops.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from abs_engine import codec  # noqa: E402
from abs_engine.checkpoint.storage import CheckpointStorage  # noqa: E402
from examples import collatz  # noqa: E402


def snapshot_sizes(ckdir: str) -> list[dict[str, int]]:
    storage = CheckpointStorage(ckdir)
    out = []
    for cid in storage.completed_ids():
        meta = storage.verify(cid)
        state_b = log_b = logged = 0
        for entry in meta.tasks.values():
            with open(os.path.join(storage.dir_of(cid), entry.file), "rb") as f:
                doc = codec.unpack(f.read())
            state_b += sum(len(v) for v in doc["operators"].values())
            log_b += sum(len(v) for v in doc.get("logs", {}).values())
            logged += sum(len(codec.unpack(v)) for v in doc.get("logs", {}).values())
        out.append({"checkpoint": cid, "final": meta.final, "state_bytes": state_b, "log_bytes": log_b,
                    "logged_records": logged})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--numbers", type=int, default=20_000)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    expected = collatz.oracle(args.numbers)
    trips = sum(expected.values())
    variants = {"none": ("none", 1.0), "aligned_1s": ("aligned", 1.0), "aligned_0.1s": ("aligned", 0.1)}
    runs: dict[str, list[dict]] = {k: [] for k in variants}
    tmp = tempfile.mkdtemp(prefix="abs-engine-loop-bench-")
    try:
        for r in range(args.rounds):
            for name, (mode, interval) in variants.items():
                out, ck = os.path.join(tmp, "out.tsv"), os.path.join(tmp, f"ck-{name}-{r}")
                flow = collatz.build_flow(args.numbers, out, args.parallelism)
                t0 = time.perf_counter()
                res = flow.run(mode=mode, checkpoint_interval=interval, checkpoint_dir=ck,
                               retained_checkpoints=100_000)
                secs = time.perf_counter() - t0
                if collatz.read_output(out) != expected:
                    raise SystemExit(f"{name}: wrong output")
                sizes = snapshot_sizes(ck)
                runs[name].append({"seconds": secs, "trips_per_s": trips / secs, "checkpoints": len(res.checkpoints),
                                   "snapshots": sizes})
                print(f"round {r + 1} {name:13} {secs:6.2f}s {trips / secs / 1e6:5.2f} M trips/s "
                      f"{len(res.checkpoints)} checkpoints", file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def ratio(name: str) -> list[float]:
        return [a["seconds"] / n["seconds"] - 1 for a, n in zip(runs[name], runs["none"])]

    periodic = [s for name in ("aligned_1s", "aligned_0.1s") for run in runs[name] for s in run["snapshots"]
                if not s["final"]]
    with_logs = [s for s in periodic if s["logged_records"]]
    summary = {
        "command": "python benchmarks/loop_bench.py " + " ".join(sys.argv[1:]),
        "numbers": args.numbers, "trips": trips, "parallelism": args.parallelism, "rounds": args.rounds,
        "median_seconds": {k: statistics.median(x["seconds"] for x in v) for k, v in runs.items()},
        "overhead_vs_none": {k: ratio(k) for k in ("aligned_1s", "aligned_0.1s")},
        "periodic_snapshots": len(periodic),
        "median_state_bytes": statistics.median(s["state_bytes"] for s in periodic) if periodic else 0,
        "median_log_bytes": statistics.median(s["log_bytes"] for s in periodic) if periodic else 0,
        "median_logged_records": statistics.median(s["logged_records"] for s in periodic) if periodic else 0,
        "snapshots_with_logs": len(with_logs),
        "runs": runs,
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "loops.json"), "w") as f:
        json.dump(summary, f, indent=2)
    lines = [
        "# Loop (back-edge logging) benchmark",
        "",
        f"Command: `{summary['command']}`  ",
        f"Collatz step counts for 1..{args.numbers:,} ({trips:,} trips round the loop), parallelism "
        f"{args.parallelism}, {args.rounds} interleaved rounds; {summary['when']}.",
        "",
        "| variant | median s | M trips/s | overhead vs none (per round) |",
        "|---|---|---|---|",
    ]
    for k in runs:
        med = summary["median_seconds"][k]
        ov = ", ".join(f"{o:+.1%}" for o in ratio(k)) if k != "none" else "-"
        lines.append(f"| {k} | {med:.2f} | {trips / med / 1e6:.2f} | {ov} |")
    lines += [
        "",
        f"Snapshot size over the {len(periodic)} periodic checkpoints of the ABS runs (medians): operator state "
        f"{summary['median_state_bytes']:,.0f} bytes, back-edge logs {summary['median_log_bytes']:,.0f} bytes "
        f"({summary['median_logged_records']:,.0f} records in flight); {len(with_logs)} of them held logged records.",
        "",
        "Mode `none` takes no periodic checkpoints, but once the sources have finished it still takes one "
        "every 0.1 s to detect that the loop has drained (that is how a loop ends); it took "
        f"{statistics.median(x['checkpoints'] for x in runs['none']):.0f} per run (median).",
    ]
    with open(os.path.join(args.out, "loops.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
