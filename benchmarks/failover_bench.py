"""Fine-grained failover against global failover, as Flink's fine-grained recovery
measurements compare them, on two workloads:

- ``pipelines``: a job of K independent pipelines (numbers, keyed counts, a sink), a worker
  of pipeline 0 SIGKILLed every few seconds: ``failover="pipeline"`` restarts 1/K of the job;
- ``lanes``: an embarrassingly parallel job (source -> map -> sink, forward only, p lanes),
  a lane's worker SIGKILLed every few seconds: a region restart is 1/p of the job.

    python benchmarks/failover_bench.py          # K=4 at p=2, 4 lanes, a kill every 10 s, 2 rounds

Each round runs, interleaved per workload: ``failover="pipeline"`` without kills (the
baseline), ``failover="pipeline"`` with kills, and ``failover="job"`` (global failover)
with kills. Reported: the job's wall time; the tasks restarted per failure (as a share of
the job's tasks); the time from a failure to the failed unit running again (p50, the job's
RecoveryEvents); and, for the pipelines workload, the longest output gap of the pipelines
that were *not* killed (their sinks' committed output, polled every 20 ms: under global
failover they stall with the failed one). Every run's output is compared with its batch
oracle (every count once). Results: benchmarks/results/failover.{json,md}.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from abs_engine import Dataflow  # noqa: E402
from abs_engine.testing import CapturingSink  # noqa: E402
from operators.generators import RangeSource  # noqa: E402


def build(tmp: str, k: int, records: int, parallelism: int) -> tuple[Dataflow, list[CapturingSink]]:
    flow = Dataflow("failover-bench", parallelism=parallelism)
    sinks = [CapturingSink(os.path.join(tmp, f"out{i}")) for i in range(k)]
    for i in range(k):
        flow.source(RangeSource(0, records, batch_size=500), name=f"p{i}") \
            .map(lambda x, i=i: (x % 97 + 1000 * i, 1), name=f"pair{i}").key_by(lambda kv: kv[0]) \
            .count(name=f"count{i}").filter(lambda kv: kv[1] % EVERY == 0, name=f"every{i}") \
            .sink(sinks[i], name=f"sink{i}", parallelism=1)
    return flow, sinks


#: The sinks get every EVERY-th count of a key and every EVERY-th lane record: output all the
#: time (the gaps are measured on it), small enough to check exactly.
EVERY = 100


def exact(sink: CapturingSink, i: int, records: int) -> bool:
    """Every key's running counts that are multiples of EVERY, up to its batch count, each
    once: exactly once."""
    seen: dict[Any, list[int]] = collections.defaultdict(list)
    for key, n in sink.records():
        seen[key].append(n)
    want = collections.Counter(x % 97 + 1000 * i for x in range(records))
    return all(sorted(seen.get(k, [])) == list(range(EVERY, n + 1, EVERY)) for k, n in want.items()) \
        and seen.keys() <= want.keys()


def output_bytes(sink: CapturingSink) -> int:
    try:
        return sum(e.stat().st_size for e in os.scandir(sink.path) if e.is_file())
    except FileNotFoundError:
        return 0


def workers_of(pipeline: int) -> list[int]:
    """The live workers of pipeline ``pipeline`` (by /proc/PID/comm: 'abs p0#1')."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/comm") as f:
                    comm = f.read().strip()
            except OSError:
                continue
            if comm.startswith(("abs ", )) and comm[4:].split("#")[0] in (f"p{pipeline}", f"count{pipeline}"):
                out.append(int(name))
    return out


def lanes(tmp: str, records: int, parallelism: int) -> tuple[Dataflow, CapturingSink]:
    """An embarrassingly parallel job: source -> map -> sink, forward only (one task per lane)."""
    flow = Dataflow("lanes-bench", parallelism=parallelism)
    sink = CapturingSink(os.path.join(tmp, "lanes"))
    flow.source(RangeSource(0, records, batch_size=500), name="lane").map(lambda x: 3 * x, name="triple") \
        .filter(lambda x: x % (3 * EVERY) == 0, name="every").sink(sink, name="out")
    return flow, sink


def lane_workers() -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/comm") as f:
                    if f.read().startswith("abs lane#"):
                        out.append(int(name))
            except OSError:
                continue
    return out


def run(workload: str, mode: str, kill_every: float | None, args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    if workload == "pipelines":
        flow, sinks = build(tmp, args.pipelines, args.records, args.parallelism)
        victims = lambda: workers_of(0)  # noqa: E731
        units = args.pipelines
    else:
        flow, sink = lanes(tmp, args.lane_records, args.lanes)
        sinks, victims, units = [sink], lane_workers, args.lanes
    box: dict[str, Any] = {}
    done = threading.Event()

    def job() -> None:
        try:
            box["result"] = flow.run(checkpoint_dir=os.path.join(tmp, "ck"), checkpoint_interval=0.5,
                                     failover=mode, restart_delay=0, restart_attempts=args.restart_attempts)
        except Exception as e:  # noqa: BLE001 - e.g. restarts exhausted: the run is reported as failed
            box["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        finally:
            done.set()

    t = threading.Thread(target=job)
    began = time.monotonic()
    t.start()
    growth: list[list[float]] = [[] for _ in sinks]  # when each sink's committed output grew
    sizes = [0] * len(sinks)
    kills = 0
    next_kill = began + kill_every if kill_every else float("inf")
    while not done.is_set():
        now = time.monotonic()
        for i, s in enumerate(sinks):
            if (b := output_bytes(s)) != sizes[i]:
                sizes[i] = b
                growth[i].append(now - began)
        if now >= next_kill:
            found = victims()
            if found:
                os.kill(found[kills % len(found)], signal.SIGKILL)
                kills += 1
            next_kill = now + kill_every  # type: ignore[operator]
        done.wait(0.02)  # the polling period of the probe
    t.join()
    if "error" in box:
        return {"workload": workload, "mode": mode, "kills": kill_every is not None, "failed": box["error"],
                "killed": kills, "wall_s": None, "failures": None, "restarted_share": None, "recovery_p50_s": None,
                "others_longest_gap_s": None}
    res = box["result"]
    if workload == "pipelines":
        for i, s in enumerate(sinks):
            if not exact(s, i, args.records):
                raise SystemExit(f"{mode}: pipeline {i}'s output differs from its oracle")
    elif sorted(sinks[0].records()) != [3 * x for x in range(0, args.lane_records, EVERY)]:
        raise SystemExit(f"{mode}: the lanes' output differs from its oracle")
    tasks = len(flow.compile().tasks)
    # the units (pipelines, lanes) are alike: one restarted unit is tasks / units of them
    per_failure = tasks // units if mode == "pipeline" else tasks
    restarted = res.restarts * per_failure
    gaps = [max(b - a for a, b in zip(g, g[1:])) for i, g in enumerate(growth) if i > 0 and len(g) >= 2]
    recov = [r.running_after_s for r in res.recoveries if r.running_after_s is not None]
    return {"workload": workload, "mode": mode, "kills": kill_every is not None, "wall_s": round(res.duration_s, 3),
            "failures": res.restarts, "killed": kills, "tasks": tasks,
            "restarted_share": round(restarted / max(1, res.restarts) / tasks, 3) if res.restarts else 0.0,
            "recovery_p50_s": round(statistics.median(recov), 3) if recov else None,
            "others_longest_gap_s": round(max(gaps), 3) if gaps else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pipelines", type=int, default=4)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--records", type=int, default=3_000_000, help="per pipeline")
    ap.add_argument("--kill-every", type=float, default=10.0)
    ap.add_argument("--lanes", type=int, default=4, help="the lanes workload's parallelism")
    ap.add_argument("--lane-records", type=int, default=24_000_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--restart-attempts", type=int, default=100)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    variants = [(w, m, e) for w in ("pipelines", "lanes")
                for m, e in (("pipeline", None), ("pipeline", args.kill_every), ("job", args.kill_every))]
    runs: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in range(args.rounds):
        for workload, mode, every in variants:
            tmp = tempfile.mkdtemp(prefix="abs-engine-failover-bench-")
            try:
                row = run(workload, mode, every, args, tmp)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            name = f"{workload}: failover={mode}{' + kills' if every else ''}"
            runs[name].append(row)
            print(f"round {r}: {name}: {json.dumps(row)}", flush=True)
    summary = {}
    for name, all_rows in runs.items():
        rows = [x for x in all_rows if "failed" not in x]
        if not rows:
            summary[name] = {"failed": all_rows[0]["failed"]}
            continue
        summary[name] = {
            "wall_s": statistics.median(x["wall_s"] for x in rows),
            "failures": statistics.median(x["failures"] for x in rows),
            "restarted_share": statistics.median(x["restarted_share"] for x in rows),
            "recovery_p50_s": statistics.median([x["recovery_p50_s"] for x in rows if x["recovery_p50_s"] is not None]
                                                or [0.0]),
            "others_longest_gap_s": (statistics.median(g) if (g := [x["others_longest_gap_s"] for x in rows
                                                                    if x["others_longest_gap_s"] is not None])
                                     else None),
        }
    cmd = "python3 benchmarks/failover_bench.py " + " ".join(sys.argv[1:])
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "failover.json"), "w") as f:
        json.dump({"command": cmd, "args": vars(args), "runs": runs, "summary": summary, "cpus": os.cpu_count()},
                  f, indent=2)
    lines = [f"# Pipeline and region failover vs global failover ({args.pipelines} pipelines at p={args.parallelism}; "
             f"{args.lanes} lanes; a worker SIGKILLed every {args.kill_every:g} s)", "", f"`{cmd}` on {os.cpu_count()} "
             f"cores; medians of {args.rounds} interleaved rounds; every output equal to its oracle.", "",
             "| run | wall s | failures | tasks restarted per failure (share of the job's) | failure to running "
             "again p50 s | other pipelines' longest output gap s |", "|---|---|---|---|---|---|"]
    for name, s in summary.items():
        if "failed" in s:
            lines.append(f"| {name} | failed: {s['failed']} | | | | |")
            continue
        lines.append(f"| {name} | {s['wall_s']:.1f} | {s['failures']:g} | {s['restarted_share']:.2f} | "
                     f"{s['recovery_p50_s']:.2f} | "
                     + ("-" if s["others_longest_gap_s"] is None else f"{s['others_longest_gap_s']:.2f}") + " |")
    with open(os.path.join(args.out, "failover.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
