"""This tree against a git revision, side by side: did a change cost speed?

    python benchmarks/ab_bench.py --base HEAD            # the uncommitted change vs HEAD
    python benchmarks/ab_bench.py --base 278b4ca --rounds 7

Checks ``--base`` out into a temporary git worktree and runs the same workloads from both
trees, interleaved (base, this; base, this; ...) so that machine noise hits them alike:
word count (a text file, a hash shuffle into a final count), the ABS paper's pipeline of
three keyed stages behind hash shuffles, and Collatz round a loop; each at parallelism 2
with aligned checkpoints every second. Each run is a fresh Python process that imports the
engine from its tree and times ``flow.run()`` alone (inputs are made before the clock
starts). The report gives the median wall time of each side and their ratio with its
spread over the rounds. Results: benchmarks/results/ab.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

#: Runs one workload from the tree on sys.path[0] and prints its run() time in seconds.
#: Only APIs that every revision since the benchmark workloads exist has.
RUNNER = r"""
import json, os, resource, sys, tempfile, time
kind, size, work = sys.argv[1], int(sys.argv[2]), sys.argv[3]
from abs_engine.testing import write_zipf_corpus
from benchmarks import workloads
from examples import collatz
if kind == "wordcount":
    corpus = os.path.join(work, "corpus.txt")
    if not os.path.exists(corpus):
        write_zipf_corpus(corpus, size, seed=7)
    flow = workloads.wordcount(corpus, os.path.join(work, f"out-{os.getpid()}.tsv"), 2)
elif kind == "pipeline":
    flow = workloads.pipeline(size, os.path.join(work, f"gaps-{os.getpid()}.json"), 2)
else:
    flow = collatz.build_flow(size, os.path.join(work, f"collatz-{os.getpid()}.tsv"), 2)
def cpu():
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))
with tempfile.TemporaryDirectory() as ck:
    began, cpu0 = time.perf_counter(), cpu()
    res = flow.run(checkpoint_interval=1.0, checkpoint_dir=os.path.join(ck, "ck"))
    took, used = time.perf_counter() - began, cpu() - cpu0
print(json.dumps({"seconds": took, "cpu": used, "restarts": res.restarts, "checkpoints": res.checkpoints_completed}))
"""

WORKLOADS = {"wordcount": 10_000_000, "pipeline": 2_000_000, "collatz": 20_000}


def run(tree: str, kind: str, size: int, work: str) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=tree)
    out = subprocess.run([sys.executable, "-c", RUNNER, kind, str(size), work], cwd=tree, env=env,
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"{kind} in {tree} failed:\n{out.stderr[-3000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    if result["restarts"]:
        raise SystemExit(f"{kind} in {tree} restarted: not a measurement")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="HEAD", help="the git revision to compare with (default HEAD)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every workload's size (0.1: a quick look)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "ab"))
    ap.add_argument("--only", nargs="+", choices=sorted(WORKLOADS), help="run these workloads only")
    args = ap.parse_args(argv)
    chosen = {k: v for k, v in WORKLOADS.items() if not args.only or k in args.only}
    rev = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="abs-ab-") as tmp:
        base = os.path.join(tmp, "base")
        subprocess.run(["git", "worktree", "add", "--detach", base, rev], cwd=ROOT, check=True, capture_output=True)
        try:
            times: dict[str, dict[str, list[float]]] = {k: {"base": [], "this": []} for k in chosen}
            cpus: dict[str, dict[str, list[float]]] = {k: {"base": [], "this": []} for k in chosen}
            for r in range(args.rounds):
                for kind, size in chosen.items():
                    n = max(1, int(size * args.scale))
                    work = os.path.join(tmp, kind)
                    os.makedirs(work, exist_ok=True)
                    for side, tree in (("base", base), ("this", ROOT)):
                        got = run(tree, kind, n, work)
                        times[kind][side].append(got["seconds"])
                        cpus[kind][side].append(got["cpu"])
                        print(f"round {r + 1}/{args.rounds} {kind:9s} {side}: {got['seconds']:6.2f} s wall, "
                              f"{got['cpu']:6.2f} s CPU", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", base], cwd=ROOT, capture_output=True)
    report(times, cpus, rev, args)
    return 0


def _ratios(sides: dict[str, list[float]]) -> list[float]:
    return sorted(t / b for b, t in zip(sides["base"], sides["this"]))


def report(times: dict[str, dict[str, list[float]]], cpus: dict[str, dict[str, list[float]]], rev: str,
           args: argparse.Namespace) -> None:
    rows = []
    for kind, sides in times.items():
        ratios, cpu_ratios = _ratios(sides), _ratios(cpus[kind])
        rows.append({"workload": kind, "size": int(WORKLOADS[kind] * args.scale),
                     "base_median_s": statistics.median(sides["base"]), "this_median_s": statistics.median(sides["this"]),
                     "ratio_median": statistics.median(ratios), "ratio_min": ratios[0], "ratio_max": ratios[-1],
                     "cpu_ratio_median": statistics.median(cpu_ratios), "cpu_ratio_min": cpu_ratios[0],
                     "cpu_ratio_max": cpu_ratios[-1], "base_s": sides["base"], "this_s": sides["this"],
                     "base_cpu_s": cpus[kind]["base"], "this_cpu_s": cpus[kind]["this"]})
    cmd = "python3 benchmarks/ab_bench.py " + " ".join(a for a in sys.argv[1:])
    doc = {"base": rev, "rounds": args.rounds, "machine": f"{platform.machine()}, {os.cpu_count()} cores",
           "python": platform.python_version(), "command": cmd, "rows": rows}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(doc, f, indent=2)
    lines = [f"# This tree against {rev}", "", f"`{cmd}` ({args.rounds} interleaved rounds; {doc['machine']}; "
             f"Python {doc['python']}). Each run: parallelism 2, aligned checkpoints every second; wall time of "
             "`flow.run()`, and CPU seconds of the driver and its workers over it (both vary on a shared "
             "machine: read the ranges). Ratio: this / base per round (below 1: faster).", "",
             "| workload | size | base (median s) | this (median s) | wall ratio median (range) "
             "| CPU ratio median (range) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['size']:,} | {r['base_median_s']:.2f} | {r['this_median_s']:.2f} | "
                     f"{r['ratio_median']:.3f} ({r['ratio_min']:.3f} - {r['ratio_max']:.3f}) | "
                     f"{r['cpu_ratio_median']:.3f} ({r['cpu_ratio_min']:.3f} - {r['cpu_ratio_max']:.3f}) |")
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
