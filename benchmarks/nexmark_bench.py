"""Nexmark q0, q1, q2, q3, q5, q7 and q8: abs-engine against a plain Python loop, Bytewax and
Flink's published figures, in events per second per core.

    python benchmarks/nexmark_bench.py                        # 2,000,000 events, 2 repetitions
    python benchmarks/nexmark_bench.py --events 200000 --repeat 1 --no-bytewax   # a quick check

Each query runs on the very same events (``operators.nexmark``; generated before any clock
starts) as:

- **plain**: the query's plain single-process implementation (``examples.nexmark``'s
  ``rows_*``/``plain_*``; the latter are the batch oracles): one Python loop that counts the
  rows it makes and keeps none, the per-core limit of Python;
- **abs-engine** at parallelism 1 and 2, without checkpoints (``none``) and with ABS every
  ``--interval`` seconds (``abs``). The sink is a blackhole that counts (as the Nexmark
  project's Flink runs use ``blackhole``), at the query's parallelism, chained to its last
  operator; its count must equal the oracle's. Once per query an untimed run at
  parallelism 2 with ABS writes every row, and its output must equal the oracle exactly;
- **Bytewax 0.21** as one worker (bytewax_nexmark.py, in a venv of its own) for the queries
  its API expresses: q0-q3, q5, q7 (q8 needs a windowed join across two keyed streams).

The generated events are frozen out of the garbage collector's view (``gc.freeze()``), in the
plain loop's process and in each source subtask alike: otherwise every collection a query's
allocations trigger scans millions of input events, which slows the plain loop of an
allocating query (q1) about fourfold and measures the collector, not the query.

Events/s is events over the job's wall time after every worker ran (``duration_s -
running_after_s``); events/s/core is events over the *CPU seconds* of every process of the
run (driver and workers, from ``getrusage``), less the CPU the sources spent generating
their events in ``open()`` (each measures its own). Flink 1.13's figures (the nexmark
project's README: 100M events, parallelism 8, checkpoints every 3 min) are the reference.
Writes benchmarks/results/nexmark.{json,md}.
"""

from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import platform
import resource
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
from examples.nexmark.queries import PLAIN, QUERIES, ROWS, canonical  # noqa: E402
from operators.base import OperatorContext, Sink  # noqa: E402
from operators.generators import IndexSource  # noqa: E402
from operators.nexmark import event, events  # noqa: E402

#: events/s/core of Flink 1.13 (nexmark project README: 100M events, parallelism 8, 8 cores)
FLINK = {"q0": 155_000, "q1": 158_000, "q2": 175_000, "q3": 152_000, "q5": 22_000, "q7": 12_000, "q8": 146_000}
#: the issue's goals: abs-engine at parallelism 2 with ABS against the plain loop
GOAL = {"q0": 1.5, "q1": 1.5, "q2": 1.5, "q3": 1.2, "q5": 1.2, "q7": 1.2, "q8": 1.2}
BYTEWAX = ("q0", "q1", "q2", "q3", "q5", "q7")
ENGINE = [(1, "none"), (1, "abs"), (2, "none"), (2, "abs")]


class PregeneratedNexmark(IndexSource[list[Any]]):
    """NexmarkSource's events, each subtask's share generated in ``open()`` (then read from
    memory, as Bytewax's TestingSource reads its list); the CPU seconds that took are
    written to ``cpu_dir``, to be taken off the run's."""

    def __init__(self, count: int, cpu_dir: str, seed: int = 0, batch_size: int = 1000):
        self.count, self.cpu_dir, self.seed, self.batch_size = count, cpu_dir, seed, batch_size

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        k, p = ctx.subtask_index, ctx.parallelism
        t0 = time.process_time()
        self.cache = {n: event(n, self.seed) for n in range(k, self.count, p)}
        gc.freeze()  # the cached events are input, not the job's objects: the collector skips them
        with open(os.path.join(self.cpu_dir, f"gen-{k}-{os.getpid()}"), "w") as f:
            f.write(repr(time.process_time() - t0))

    def records(self, indices: Sequence[int]) -> list[list[Any]]:
        cache = self.cache
        return [cache[n] for n in indices]


class CountingSink(Sink):
    """A blackhole that counts what it is given (checkpointed) and writes the count at the end."""

    def __init__(self, out_dir: str):
        self.out_dir = out_dir
        self.n = 0

    def process(self, batch: list[Any]) -> list[Any]:
        self.n += len(batch)
        return []

    def snapshot(self, checkpoint_id: int) -> Any:
        return self.n

    def restore(self, state: Any) -> None:
        self.n = int(state)

    def finish(self) -> list[Any]:
        with open(os.path.join(self.out_dir, f"count-{self.ctx.subtask_index}"), "w") as f:
            f.write(str(self.n))
        return []


def cpu_seconds() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def run_plain(query: str, evs: list[Any], rows: int) -> dict[str, Any]:
    """The plain loop hands each row on and keeps none (as the engine's blackhole sink)."""
    t0, c0 = time.perf_counter(), time.process_time()
    n = sum(1 for _ in ROWS[query](evs))
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    if n != rows:
        raise SystemExit(f"plain {query}: {n} rows, the oracle has {rows}")
    return {"seconds": seconds, "cpu_seconds": cpu, "events_per_s": len(evs) / seconds,
            "events_per_s_per_core": len(evs) / cpu}


def run_engine(query: str, parallelism: int, variant: str, events_n: int, interval: float, rows: int,
               verify: list[str] | None = None) -> dict[str, Any]:
    build = QUERIES[query][0]
    with tempfile.TemporaryDirectory(prefix="nexmark-bench-") as tmp:
        sink: Sink = CapturingSink(os.path.join(tmp, "out")) if verify is not None else CountingSink(tmp)
        flow = build(events_n, sink, parallelism, 0, source=PregeneratedNexmark(events_n, tmp),
                     sink_parallelism=1 if verify is not None else None)
        c0 = cpu_seconds()
        res = flow.run(checkpoint_dir=os.path.join(tmp, "ck"), checkpoint_interval=interval,
                       mode="none" if variant == "none" else "aligned", startup_timeout=600.0)
        cpu = cpu_seconds() - c0 - sum(float(open(p).read()) for p in glob.glob(os.path.join(tmp, "gen-*")))
        if verify is not None:
            if canonical(sink.records()) != verify:  # type: ignore[attr-defined]
                raise SystemExit(f"abs-engine {query} p={parallelism} {variant}: WRONG ANSWER (output differs from "
                                 "the batch oracle)")
        else:
            got = sum(int(open(p).read()) for p in glob.glob(os.path.join(tmp, "count-*")))
            if got != rows:
                raise SystemExit(f"abs-engine {query} p={parallelism} {variant}: {got} rows, the oracle has {rows}")
    seconds = res.duration_s - res.running_after_s
    periodic = [c for c in res.checkpoints if not c.final]
    return {"seconds": seconds, "cpu_seconds": cpu, "events_per_s": events_n / seconds,
            "events_per_s_per_core": events_n / cpu, "checkpoints": len(periodic)}


def run_bytewax(events_n: int, repeat: int, out: str, queries: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, os.path.join(HERE, "bytewax_nexmark.py"), "--events", str(events_n), "--query",
           ",".join(queries), "--repeat", str(repeat), "--json", out]
    proc = subprocess.run(cmd, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"bytewax run failed (exit {proc.returncode}): {' '.join(cmd)}")
    with open(out, encoding="utf-8") as f:
        report: dict[str, Any] = json.load(f)
    return report


def _med(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=2_000_000, help="Nexmark events (all kinds; default %(default)s)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--interval", type=float, default=1.0, help="ABS checkpoint interval, s (default %(default)s)")
    ap.add_argument("--queries", default=",".join(QUERIES), help="comma-separated (default: all)")
    ap.add_argument("--no-bytewax", action="store_true", help="skip the Bytewax comparison")
    ap.add_argument("--out", default=os.path.join(HERE, "results"), help="directory for nexmark.json/.md")
    args = ap.parse_args(argv)
    queries = [q for q in args.queries.split(",") if q]
    if args.events < 1 or args.repeat < 1 or not args.interval > 0 or not set(queries) <= set(QUERIES):
        ap.error(f"--events and --repeat must be >= 1, --interval > 0, --queries among {', '.join(QUERIES)}")

    evs = list(events(args.events, 0))
    gc.freeze()  # as the sources do: the collector does not scan the input over and over
    summary: dict[str, Any] = {}
    for query in queries:
        expected = canonical(PLAIN[query](evs))
        run_engine(query, 2, "abs", args.events, args.interval, len(expected), verify=expected)  # every row checked
        runs: dict[str, list[dict[str, Any]]] = {"plain": [], **{f"p{p} {v}": [] for p, v in ENGINE}}
        for rep in range(args.repeat):
            order = [("plain", None)] + [(f"p{p} {v}", (p, v)) for p, v in ENGINE]
            for name, pv in (order if rep % 2 == 0 else order[::-1]):  # interleaved, order alternating
                r = (run_plain(query, evs, len(expected)) if pv is None
                     else run_engine(query, pv[0], pv[1], args.events, args.interval, len(expected)))
                runs[name].append(r)
                print(f"[{rep + 1}/{args.repeat}] {query} {name:>8}: {r['events_per_s']:>10,.0f} events/s "
                      f"{r['events_per_s_per_core']:>10,.0f} /core ({r['seconds']:.2f} s)", flush=True)
        rate = {k: _med(v, "events_per_s") for k, v in runs.items()}
        core = {k: _med(v, "events_per_s_per_core") for k, v in runs.items()}
        summary[query] = {"rows": len(expected), "events_per_s": rate, "events_per_s_per_core": core,
                          "abs_overhead_p2": rate["p2 none"] / rate["p2 abs"] - 1,
                          "p2_abs_vs_plain": rate["p2 abs"] / rate["plain"], "goal": GOAL[query],
                          "flink_events_per_s_per_core": FLINK[query], "runs": runs}

    bytewax: dict[str, Any] = {}
    wanted = [q for q in queries if q in BYTEWAX]
    if not args.no_bytewax and wanted:
        bytewax = run_bytewax(args.events, args.repeat, os.path.join(tempfile.gettempdir(), "nexmark-bytewax.json"),
                              wanted)
        for q, r in bytewax.items():
            summary[q]["bytewax_events_per_s"] = r["events_per_s"]
            summary[q]["bytewax_events_per_s_per_core"] = r["events_per_s_per_core"]

    command = "python benchmarks/nexmark_bench.py " + " ".join(argv if argv is not None else sys.argv[1:])
    meta = {"command": command.strip(), "events": args.events, "repeat": args.repeat, "interval_s": args.interval,
            "cores": os.cpu_count(), "python": platform.python_version(), "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "nexmark.json"), "w", encoding="utf-8") as f:
        json.dump({"meta": meta, "queries": summary, "bytewax": bytewax}, f, indent=2)
        f.write("\n")
    version = next((r.get("bytewax") for r in bytewax.values()), "-")
    lines = [
        "# Nexmark: abs-engine against a plain Python loop, Bytewax and Flink, per core",
        "",
        f"Command: `{meta['command']}`  ",
        f"Machine: {meta['cores']} cores, Python {meta['python']}; {meta['when']}; {args.events:,} events "
        f"(persons, auctions, bids) generated before any clock starts; medians of {args.repeat} interleaved "
        f"repetition(s); ABS every {args.interval:g} s; Bytewax {version} as one worker. Events/s: over the "
        "job's wall time once its workers ran. Per core: events over the CPU seconds of every process of the "
        "run (the sources' event generation taken off).",
        "",
        "## Events per second (wall)",
        "",
        "| query | plain loop | p1 none | p1 ABS | p2 none | p2 ABS | ABS overhead (p2) | p2 ABS / plain | goal |"
        " Bytewax |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for q, e in summary.items():
        r = e["events_per_s"]
        met = "met" if e["p2_abs_vs_plain"] >= e["goal"] else "not met"
        bw = e.get("bytewax_events_per_s")
        lines.append(f"| {q} | {r['plain']:,.0f} | {r['p1 none']:,.0f} | {r['p1 abs']:,.0f} | {r['p2 none']:,.0f} | "
                     f"{r['p2 abs']:,.0f} | {e['abs_overhead_p2']:+.1%} | {e['p2_abs_vs_plain']:.2f}x | "
                     f"{e['goal']:.1f}x: {met} | {f'{bw:,.0f}' if bw else '-'} |")
    lines += [
        "",
        "## Events per second per core (CPU seconds), against Flink 1.13",
        "",
        "| query | plain loop | p1 ABS | p2 ABS | Bytewax | Flink 1.13 | p2 ABS / Flink |",
        "|---|---|---|---|---|---|---|",
    ]
    for q, e in summary.items():
        c = e["events_per_s_per_core"]
        bw = e.get("bytewax_events_per_s_per_core")
        lines.append(f"| {q} | {c['plain']:,.0f} | {c['p1 abs']:,.0f} | {c['p2 abs']:,.0f} | "
                     f"{f'{bw:,.0f}' if bw else '-'} | {FLINK[q]:,} | {c['p2 abs'] / FLINK[q]:.2f}x |")
    lines += ["", "Every timed run's row count equals the oracle's, and one untimed run per query (p2, ABS) "
              "wrote rows equal to the oracle's. Per-run numbers are in nexmark.json."]
    with open(os.path.join(args.out, "nexmark.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
