"""Nexmark q5 and q7 (event-time windows) on abs-engine, with ABS checkpoints and without,
side by side with Bytewax 0.21 on the very same events, in one run.

    python benchmarks/nexmark_bench.py                    # 2,000,000 events, 3 repetitions
    python benchmarks/nexmark_bench.py --events 200000 --repeat 1 --no-bytewax   # a quick check

What is timed, and why it is fair: Bytewax's script (bytewax_nexmark.py) generates the events
before it starts its clock and times ``run_main`` alone. Here each source subtask generates
its share of the events in ``open()`` (before the worker reports running, in parallel on the
cores) and the time is the job's duration after every worker ran (``duration_s -
running_after_s``): the dataflow, its checkpoints and the final commit, not the start of
the worker processes. Both outputs are checked against batch oracles (here: windowed.py's;
Bytewax's: its script's); a wrong answer fails the run.

abs-engine runs at parallelism 2 (the machine's cores); Bytewax as one worker (its
``run_main``) with every bid on one key (see its script: per-auction keys would hold windows
open). Variants are interleaved, repetition by repetition; the median is reported. Writes
benchmarks/results/nexmark.json and benchmarks/results/nexmark.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from abs_engine.testing import CapturingSink  # noqa: E402
from examples.nexmark.queries import canonical  # noqa: E402
from examples.nexmark.windowed import build_q5, build_q7, oracle_q5, oracle_q7  # noqa: E402
from operators.base import OperatorContext  # noqa: E402
from operators.generators import IndexSource  # noqa: E402
from operators.nexmark import event  # noqa: E402

QUERIES = {"q5": (build_q5, oracle_q5), "q7": (build_q7, oracle_q7)}
VARIANTS = ("none", "abs")


class PregeneratedNexmark(IndexSource[list[Any]]):
    """NexmarkSource's events, each subtask's share generated in ``open()``: the job then
    reads them from memory, as Bytewax's TestingSource reads its list."""

    def __init__(self, count: int, seed: int = 0, batch_size: int = 1000):
        self.count, self.seed, self.batch_size = count, seed, batch_size

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        k, p = ctx.subtask_index, ctx.parallelism
        self.cache = {n: event(n, self.seed) for n in range(k, self.count, p)}

    def records(self, indices: Sequence[int]) -> list[list[Any]]:
        cache = self.cache
        return [cache[n] for n in indices]


@functools.lru_cache(maxsize=None)
def expected(query: str, events: int) -> list[str]:
    """The batch oracle's rows (computed once a query: it generates every event again)."""
    return canonical(QUERIES[query][1](events, 0))


def run_engine(query: str, variant: str, events: int, interval: float, parallelism: int) -> dict[str, Any]:
    build = QUERIES[query][0]
    with tempfile.TemporaryDirectory(prefix="nexmark-bench-") as tmp:
        sink = CapturingSink(os.path.join(tmp, "out"))
        flow = build(events, sink, parallelism, 0, source=PregeneratedNexmark(events))
        res = flow.run(checkpoint_dir=os.path.join(tmp, "ck"), checkpoint_interval=interval,
                       mode="none" if variant == "none" else "aligned", startup_timeout=600.0)
        ok = canonical(sink.records()) == expected(query, events)
    if not ok:
        raise SystemExit(f"abs-engine {query} ({variant}): WRONG ANSWER (output differs from the batch oracle)")
    seconds = res.duration_s - res.running_after_s
    periodic = [c for c in res.checkpoints if not c.final]
    return {"seconds": seconds, "events_per_s": events / seconds, "checkpoints": len(periodic),
            "checkpoint_ms": [round(c.duration_ms, 1) for c in periodic]}


def run_bytewax(events: int, repeat: int, out: str) -> dict[str, Any]:
    cmd = [sys.executable, os.path.join(HERE, "bytewax_nexmark.py"), "--events", str(events), "--query", "all",
           "--repeat", str(repeat), "--json", out]
    proc = subprocess.run(cmd, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"bytewax run failed (exit {proc.returncode}): {' '.join(cmd)}")
    with open(out, encoding="utf-8") as f:
        report: dict[str, Any] = json.load(f)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=2_000_000, help="Nexmark events (all kinds; default %(default)s)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--interval", type=float, default=1.0, help="ABS checkpoint interval, s (default %(default)s)")
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--no-bytewax", action="store_true", help="skip the Bytewax comparison")
    ap.add_argument("--out", default=os.path.join(HERE, "results"), help="directory for nexmark.json/.md")
    args = ap.parse_args(argv)
    if args.events < 1 or args.repeat < 1 or not args.interval > 0 or args.parallelism < 1:
        ap.error("--events, --repeat and --parallelism must be >= 1 and --interval > 0")

    runs: dict[str, dict[str, list[dict[str, Any]]]] = {q: {v: [] for v in VARIANTS} for q in QUERIES}
    for rep in range(args.repeat):
        for query in QUERIES:
            for variant in (VARIANTS if rep % 2 == 0 else VARIANTS[::-1]):  # interleaved, order alternating
                r = run_engine(query, variant, args.events, args.interval, args.parallelism)
                runs[query][variant].append(r)
                print(f"[{rep + 1}/{args.repeat}] abs-engine {query} {variant:>4}: {r['events_per_s']:>10,.0f} "
                      f"events/s ({r['seconds']:.2f} s, {r['checkpoints']} checkpoints)", flush=True)
    bytewax: dict[str, Any] = {}
    if not args.no_bytewax:
        os.makedirs(args.out, exist_ok=True)
        bytewax = run_bytewax(args.events, args.repeat, os.path.join(tempfile.gettempdir(), "nexmark-bytewax.json"))

    summary: dict[str, Any] = {}
    for query in QUERIES:
        med = {v: statistics.median(r["events_per_s"] for r in runs[query][v]) for v in VARIANTS}
        entry: dict[str, Any] = {"events_per_s": med, "abs_overhead": med["none"] / med["abs"] - 1,
                                 "runs": runs[query]}
        if query in bytewax:
            entry["bytewax_events_per_s"] = bytewax[query]["events_per_s"]
            entry["abs_vs_bytewax"] = med["abs"] / bytewax[query]["events_per_s"]
        summary[query] = entry

    command = "python benchmarks/nexmark_bench.py " + " ".join(argv if argv is not None else sys.argv[1:])
    meta = {"command": command.strip(), "events": args.events, "repeat": args.repeat, "interval_s": args.interval,
            "parallelism": args.parallelism, "cores": os.cpu_count(), "python": platform.python_version(),
            "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "nexmark.json"), "w", encoding="utf-8") as f:
        json.dump({"meta": meta, "queries": summary, "bytewax": bytewax}, f, indent=2)
        f.write("\n")
    lines = [
        "# Nexmark q5 and q7: abs-engine (ABS, no checkpoints) vs Bytewax",
        "",
        f"Command: `{meta['command']}`  ",
        f"Machine: {meta['cores']} cores, Python {meta['python']}; {meta['when']}; {args.events:,} events "
        f"(persons, auctions, bids), {args.repeat} repetition(s), variants interleaved; abs-engine at parallelism "
        f"{args.parallelism}, ABS every {args.interval:g} s; Bytewax {bytewax.get('q5', {}).get('bytewax', '-')} "
        "as one worker. Events are generated before the clock starts, in both.",
        "",
        "| query | abs-engine, no checkpoints | abs-engine, ABS | ABS overhead | Bytewax | ABS / Bytewax |",
        "|---|---|---|---|---|---|",
    ]
    for query, e in summary.items():
        bw = e.get("bytewax_events_per_s")
        lines.append(f"| {query} | {e['events_per_s']['none']:,.0f} events/s | {e['events_per_s']['abs']:,.0f} events/s "
                     f"| {e['abs_overhead']:+.1%} | " + (f"{bw:,.0f} events/s | {e['abs_vs_bytewax']:.2f}x |" if bw
                                                      else "- | - |"))
    lines += ["", "Medians; every run's output equals a batch oracle. Per-run numbers are in nexmark.json."]
    with open(os.path.join(args.out, "nexmark.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
