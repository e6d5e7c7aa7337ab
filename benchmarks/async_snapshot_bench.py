"""Asynchronous snapshots by fork against encoding on the task thread, side by side in one run.

    python3 benchmarks/async_snapshot_bench.py                 # full: keys up to 5M, pipeline 4M records
    python3 benchmarks/async_snapshot_bench.py --quick         # a check: keys up to 100k, pipeline 400k

1. The task thread's share of one snapshot of a keyed state of 1k, 100k, 1M and 5M keys
   (str -> int, as a count holds): ``snapshot_encoding.start`` forking (the default for
   large states) against inline encoding (what every snapshot did before), and the
   asynchronous part (the child's encoding, collected by the writer). Median of --repeat.
2. The paper-like pipeline (benchmarks/workloads.py: 2M-key state in its first stage at the
   full size): runtime with no checkpoints, and with ABS at 1 s and 0.1 s, snapshots
   encoded inline, forked, or "auto" (the default: fork only with a core to spare); rounds
   interleaved, medians; overhead against no checkpoints.
Writes benchmarks/results/async_snapshots.{json,md} and plots/snapshot_sync_time.png.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from abs_engine.runtime import snapshot_encoding  # noqa: E402
from benchmarks import plots, workloads  # noqa: E402


def sync_times(keys: int, repeat: int) -> dict[str, float]:
    state = {f"w{i}": i for i in range(keys)}
    out: dict[str, list[float]] = {"inline_ms": [], "fork_sync_ms": [], "fork_async_ms": []}
    for _ in range(repeat):
        t0 = time.perf_counter()
        snapshot_encoding.start({"count": state}, mode="inline").result()
        out["inline_ms"].append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        enc = snapshot_encoding.start({"count": state}, mode="fork")
        t1 = time.perf_counter()
        enc.result()
        out["fork_sync_ms"].append((t1 - t0) * 1000)
        out["fork_async_ms"].append((time.perf_counter() - t1) * 1000)
    return {k: statistics.median(v) for k, v in out.items()}


def pipeline_run(records: int, mode: str, interval: float, encoding: str, tmp: str) -> float:
    out = os.path.join(tmp, "gaps.json")
    workloads.cleanup(out)
    flow = workloads.pipeline(records, out, 2)
    t0 = time.perf_counter()
    flow.run(mode=mode, checkpoint_interval=interval, snapshot_encoding=encoding)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    key_sizes = [1_000, 10_000, 100_000] if args.quick else [1_000, 100_000, 1_000_000, 5_000_000]
    records = 400_000 if args.quick else 4_000_000
    micro = {}
    for k in key_sizes:
        micro[k] = sync_times(k, args.repeat)
        print(f"{k:>9,} keys: {micro[k]}", file=sys.stderr)

    tmp = tempfile.mkdtemp(prefix="abs-async-bench-")
    variants = [("none", 1.0, "inline")] + [("aligned", iv, enc) for iv in (1.0, 0.1)
                                            for enc in ("inline", "fork", "auto")]

    def label(v: tuple[str, float, str]) -> str:
        return "none" if v[0] == "none" else f"ABS {v[1]:g}s, {v[2]}"

    times: dict[str, list[float]] = {label(v): [] for v in variants}
    for r in range(args.rounds):
        for v in (variants if r % 2 == 0 else list(reversed(variants))):
            times[label(v)].append(pipeline_run(records, v[0], v[1], v[2], tmp))
            print(f"round {r}: {label(v)} {times[label(v)][-1]:.2f}s", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in times.items()}
    overhead = {k: med[k] / med["none"] - 1 for k in med if k != "none"}

    summary = {"keys": {str(k): v for k, v in micro.items()}, "pipeline_records": records, "seconds": times,
               "median_s": med, "overhead": overhead, "rounds": args.rounds, "repeat": args.repeat}
    os.makedirs(os.path.join(args.out, "plots"), exist_ok=True)
    with open(os.path.join(args.out, "async_snapshots.json"), "w") as f:
        json.dump(summary, f, indent=2)
    cmd = "python3 benchmarks/async_snapshot_bench.py" + (" --quick" if args.quick else "")
    lines = ["# Asynchronous snapshots (fork) vs encoding on the task thread", "",
             f"`{cmd}` (repeat {args.repeat}, rounds {args.rounds}, 2-core machine).", "",
             "## The task thread's share of one snapshot (str -> int state, median ms)", "",
             "| keys | inline (before) | forked: task thread | forked: async (child encodes) |", "|---|---|---|---|"]
    for k, m in micro.items():
        lines.append(f"| {k:,} | {m['inline_ms']:.1f} | {m['fork_sync_ms']:.1f} | {m['fork_async_ms']:.1f} |")
    lines += ["", f"## The pipeline ({records:,} records, 2 keyed shuffles; medians, overhead vs none)", "",
              "| variant | median s | overhead | runs |", "|---|---|---|---|"]
    for k, v in times.items():
        ov = "" if k == "none" else f"{overhead[k] * 100:+.1f}%"
        lines.append(f"| {k} | {med[k]:.2f} | {ov} | {', '.join(f'{x:.2f}' for x in v)} |")
    lines += ["", "![task-thread time of a snapshot](plots/snapshot_sync_time.png)"]
    with open(os.path.join(args.out, "async_snapshots.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    ks = list(micro)
    plots.loglog(os.path.join(args.out, "plots", "snapshot_sync_time.png"), ks,
                 [("inline (task thread encodes)", [micro[k]["inline_ms"] for k in ks], "o-"),
                  ("forked: task thread", [micro[k]["fork_sync_ms"] for k in ks], "s-"),
                  ("forked: async (child)", [micro[k]["fork_async_ms"] for k in ks], "^--")],
                 "keys in the state", "ms per snapshot", (10, "10 ms"))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
