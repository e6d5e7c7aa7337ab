"""Aligned (ABS) vs unaligned (Chandy-Lamport) vs aligned-with-timeout checkpoints, side by
side in one run, under backpressure and without it.

    python benchmarks/unaligned_bench.py            # about 3 minutes on 2 cores
    python benchmarks/unaligned_bench.py --tiny     # seconds: the smoke test's size

1. **Backpressure**: a source of Zipf-skewed keys (s = 1.1 over 1,000 keys) into a keyed
   running count followed by a slow stage (``--cost`` seconds of work per record, in the
   keyed task), parallelism 2, checkpoints every second. The hot key's subtask cannot keep
   up, so its input channels stay full: an aligned barrier queues behind that data. Per
   mode: checkpoint duration p50/p99 (trigger to last acknowledgement), time the barrier
   spent queued (the longest start delay of a checkpoint's tasks), alignment time,
   in-flight records and bytes persisted per checkpoint, and throughput.
2. **No backpressure**: the suite's pipeline workload (two keyed shuffles, parallelism 2)
   with no checkpoints, aligned and unaligned at 1 s and 0.1 s: runtime overhead, and the
   extra CPU of all workers (RUSAGE_CHILDREN) and wall time per checkpoint taken (at a
   short interval the faster mode takes more checkpoints: totals alone mislead).
Writes benchmarks/results/unaligned.json, unaligned.md and plots/unaligned_checkpoints.png.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from abs_engine import Dataflow  # noqa: E402
from benchmarks import workloads  # noqa: E402
from operators import Operator, RangeSource  # noqa: E402

VARIANTS = {  # name -> run() options
    "aligned": {"mode": "aligned"},
    "unaligned": {"mode": "unaligned"},
    "aligned, timeout 0.1 s": {"mode": "aligned", "aligned_timeout": 0.1},
}


class ZipfKey:
    """Record i -> (a key drawn from a Zipf law over ``keys`` keys, 1), deterministically."""

    def __init__(self, keys: int, s: float = 1.1):
        weights = [1 / (k + 1) ** s for k in range(keys)]
        total = sum(weights)
        self.cdf: list[float] = []
        acc = 0.0
        for w in weights:
            acc += w / total
            self.cdf.append(acc)

    def __call__(self, i: int) -> Any:
        import bisect

        u = random.Random(i).random()
        return (min(bisect.bisect_left(self.cdf, u), len(self.cdf) - 1), 1)


class SlowStage(Operator):
    """``cost`` seconds of work per record (a sleep per batch: the core stays free for the
    other tasks, as an I/O-bound or remote call would leave it)."""

    def __init__(self, cost: float):
        self.cost = cost

    def process(self, batch: list[Any]) -> list[Any]:
        time.sleep(self.cost * len(batch))
        return batch


def first(kv: Any) -> Any:
    return kv[0]


def backpressured(records: int, cost: float, out: str) -> Dataflow:
    flow = Dataflow("backpressure", parallelism=2)
    keyed = flow.source(RangeSource(records, batch_size=500), name="source").map(ZipfKey(1_000), name="zipf")
    counts = keyed.key_by(first).count(name="count").apply(SlowStage(cost), name="slow")
    counts.sink(workloads.GapSink(out), name="sink", parallelism=1)
    return flow


def pct(xs: list[float], q: float) -> float:
    """The nearest-rank percentile (p50 of two values is the lower one)."""
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[max(0, min(len(xs) - 1, math.ceil(q * len(xs)) - 1))]


def run_backpressure(name: str, records: int, cost: float, tmp: str) -> dict[str, Any]:
    out = os.path.join(tmp, "bp.json")
    t0 = time.perf_counter()
    res = backpressured(records, cost, out).run(checkpoint_interval=1.0, **VARIANTS[name])
    secs = time.perf_counter() - t0
    with open(out) as f:
        if json.load(f)["records"] != records:
            raise SystemExit(f"{name}: wrong number of records at the sink")
    cps = [c for c in res.checkpoints if not c.final]
    return {"variant": name, "seconds": secs, "records_per_s": records / secs,
            "checkpoints": [{"ms": c.duration_ms, "alignment_ms": c.max_alignment_ms, "mode": c.mode,
                             "unaligned_tasks": c.unaligned_tasks, "inflight_records": c.inflight_records,
                             "inflight_bytes": c.inflight_bytes, "start_delay_ms": c.max_start_delay_ms}
                            for c in cps],
            "expired": res.checkpoints_expired}


def run_overhead(mode: str, interval: float, records: int, tmp: str) -> dict[str, Any]:
    out = os.path.join(tmp, "pipe.out")
    workloads.cleanup(out)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = workloads.pipeline(records, out, 2).run(mode=mode, checkpoint_interval=interval)
    secs = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the workers, reaped by the run
    if workloads.read_gap(out)["records"] != records:
        raise SystemExit(f"pipeline {mode} {interval}: wrong number of records at the sink")
    periodic = [c for c in res.checkpoints if not c.final]
    return {"mode": mode, "interval": interval, "seconds": secs,
            "cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
            "checkpoints": len(periodic), "inflight_bytes": sum(c.inflight_bytes for c in periodic),
            "checkpoint_bytes": sum(c.bytes for c in periodic)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="tiny inputs (the smoke test)")
    ap.add_argument("--repeat", type=int, default=3, help="repetitions of the no-backpressure runs")
    ap.add_argument("--cost", type=float, default=40e-6, help="seconds of slow-stage work per record")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--pipeline-records", type=int, default=4_000_000,
                    help="records of the no-backpressure runs (longer runs: less noise)")
    args = ap.parse_args(argv)
    bp_records = 20_000 if args.tiny else 400_000
    pipe_records = 20_000 if args.tiny else args.pipeline_records
    repeat = 1 if args.tiny else args.repeat
    tmp = tempfile.mkdtemp(prefix="abs-engine-unaligned-")
    started = time.perf_counter()
    bp = []
    for name in VARIANTS:
        row = run_backpressure(name, bp_records, args.cost, tmp)
        bp.append(row)
        ms = [c["ms"] for c in row["checkpoints"]]
        print(f"[{time.perf_counter() - started:6.1f}s] backpressure {name}: {row['seconds']:.1f}s, "
              f"{len(ms)} checkpoints, p50 {pct(ms, 0.5):.0f} ms, p99 {pct(ms, 0.99):.0f} ms", file=sys.stderr)
    variants = [("none", 1.0)] + [(m, iv) for m in ("aligned", "unaligned") for iv in (1.0, 0.1)]
    rng = random.Random(76)
    overhead: list[dict[str, Any]] = []
    run_overhead("none", 1.0, pipe_records, tmp)  # warm-up, unmeasured
    for rep in range(repeat):
        order = list(variants)
        rng.shuffle(order)
        for mode, iv in order:
            row = run_overhead(mode, iv, pipe_records, tmp)
            row["repetition"] = rep
            overhead.append(row)
            print(f"[{time.perf_counter() - started:6.1f}s] pipeline {mode} {iv}s: {row['seconds']:.2f}s, "
                  f"{row['checkpoints']} checkpoints", file=sys.stderr)
    summary = summarise(bp, overhead, variants)
    doc = {"command": "python benchmarks/unaligned_bench.py" + (" --tiny" if args.tiny else ""),
           "cost_per_record_s": args.cost, "backpressure_records": bp_records, "pipeline_records": pipe_records,
           "summary": summary, "backpressure": bp, "overhead": overhead}
    os.makedirs(os.path.join(args.out, "plots"), exist_ok=True)
    with open(os.path.join(args.out, "unaligned.json"), "w") as f:
        json.dump(doc, f, indent=2)
    plot(bp, os.path.join(args.out, "plots", "unaligned_checkpoints.png"))
    md = markdown(doc)
    with open(os.path.join(args.out, "unaligned.md"), "w") as f:
        f.write(md)
    print(md)
    return 0


def summarise(bp: list[dict[str, Any]], overhead: list[dict[str, Any]],
              variants: list[tuple[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {"backpressure": {}, "overhead_pct": {}}
    for row in bp:
        cps = row["checkpoints"]
        ms = [c["ms"] for c in cps]
        out["backpressure"][row["variant"]] = {
            "checkpoints": len(cps), "p50_ms": pct(ms, 0.5), "p99_ms": pct(ms, 0.99),
            "alignment_p50_ms": pct([c["alignment_ms"] for c in cps], 0.5),
            "queued_p50_ms": pct([c["start_delay_ms"] for c in cps], 0.5),
            "queued_p99_ms": pct([c["start_delay_ms"] for c in cps], 0.99),
            "inflight_records_p50": pct([c["inflight_records"] for c in cps], 0.5),
            "inflight_bytes_p50": pct([c["inflight_bytes"] for c in cps], 0.5),
            "inflight_bytes_max": max((c["inflight_bytes"] for c in cps), default=0),
            "unaligned_share": (sum(1 for c in cps if c["unaligned_tasks"]) / len(cps)) if cps else 0.0,
            "records_per_s": row["records_per_s"], "expired": row["expired"]}
    base = statistics.median(r["seconds"] for r in overhead if r["mode"] == "none")
    base_cpu = statistics.median(r["cpu_s"] for r in overhead if r["mode"] == "none")
    for mode, iv in variants:
        if mode == "none":
            continue
        rows = [r for r in overhead if r["mode"] == mode and r["interval"] == iv]
        secs = [r["seconds"] for r in rows]
        n = statistics.median(r["checkpoints"] for r in rows)
        # What one checkpoint costs: a faster mode takes more checkpoints at a short interval
        # (the next is triggered when the previous completes), so totals alone mislead.
        out["overhead_pct"][f"{mode} {iv}s"] = {
            "median": 100 * (statistics.median(secs) / base - 1),
            "min": 100 * (min(secs) / base - 1), "max": 100 * (max(secs) / base - 1),
            "checkpoints": n,
            "cpu_ms_per_checkpoint": 1000 * statistics.median(
                (r["cpu_s"] - base_cpu) / r["checkpoints"] for r in rows if r["checkpoints"]) if n else 0.0,
            "wall_ms_per_checkpoint": 1000 * statistics.median(
                (r["seconds"] - base) / r["checkpoints"] for r in rows if r["checkpoints"]) if n else 0.0,
            "inflight_kb_per_checkpoint": statistics.median(
                r["inflight_bytes"] / r["checkpoints"] / 1e3 for r in rows if r["checkpoints"]) if n else 0.0,
            "state_mb_per_checkpoint": statistics.median(
                r["checkpoint_bytes"] / r["checkpoints"] / 1e6 for r in rows if r["checkpoints"]) if n else 0.0}
    return out


def plot(bp: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for row in bp:
        ms = [c["ms"] for c in row["checkpoints"]]
        ax.plot(range(1, len(ms) + 1), ms, marker="o", label=row["variant"])
    ax.set_yscale("log")
    ax.set_xlabel("checkpoint")
    ax.set_ylabel("duration, trigger to complete (ms, log)")
    ax.set_title("Checkpoint duration under backpressure (slow keyed stage, Zipf keys)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(doc: dict[str, Any]) -> str:
    s = doc["summary"]
    lines = [
        "# Aligned vs unaligned checkpoints",
        "",
        f"Made by `{doc['command']}` (2 cores; one run, variants side by side).",
        "",
        f"## Under backpressure ({doc['backpressure_records']:,} records, Zipf keys, "
        f"{doc['cost_per_record_s'] * 1e6:.0f} µs per record in the keyed stage, checkpoints every 1 s)",
        "",
        "Barrier queued: the longest start delay of a checkpoint's tasks (trigger to the first barrier, or "
        "the trigger, reaching the task), p50 / p99.",
        "",
        "| variant | checkpoints | p50 | p99 | barrier queued | alignment p50 | in flight p50 (records / bytes) | "
        "in flight max | turned unaligned | throughput |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, v in s["backpressure"].items():
        lines.append(f"| {name} | {v['checkpoints']} | {v['p50_ms']:.0f} ms | {v['p99_ms']:.0f} ms | "
                     f"{v['queued_p50_ms']:.0f} / {v['queued_p99_ms']:.0f} ms | {v['alignment_p50_ms']:.0f} ms | {v['inflight_records_p50']:,.0f} / "
                     f"{v['inflight_bytes_p50']:,.0f} B | {v['inflight_bytes_max']:,} B | "
                     f"{100 * v['unaligned_share']:.0f}% | {v['records_per_s']:,.0f} rec/s |")
    lines += ["", "![checkpoint durations](plots/unaligned_checkpoints.png)", "",
              f"## Without backpressure: overhead against no checkpoints ({doc['pipeline_records']:,} records, "
              "the suite's pipeline; median, min-max)", "",
              "Per checkpoint: the extra CPU (all workers, user + system) and wall time against the "
              "median run without checkpoints, divided by the checkpoints taken. At an interval shorter "
              "than a checkpoint takes, the next one is triggered when the previous completes, so the "
              "faster mode takes more of them.", "",
              "| variant | overhead | checkpoints | CPU per checkpoint | wall per checkpoint | in flight per "
              "checkpoint | written per checkpoint |", "|---|---|---|---|---|---|---|"]
    for name, o in s["overhead_pct"].items():
        lines.append(f"| {name} | {o['median']:+.1f}% ({o['min']:+.1f} .. {o['max']:+.1f}) | "
                     f"{o['checkpoints']:.0f} | {o['cpu_ms_per_checkpoint']:.0f} ms | "
                     f"{o['wall_ms_per_checkpoint']:.0f} ms | {o['inflight_kb_per_checkpoint']:,.0f} kB | "
                     f"{o['state_mb_per_checkpoint']:.1f} MB |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
