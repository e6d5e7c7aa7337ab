"""Bytewax 0.21 throughput on Nexmark q0-q3, q5 and q7, for comparison with abs-engine.

Measures events/s of a single-worker Bytewax dataflow (``bytewax.testing.run_main``) over the
very events abs-engine reads: ``operators.nexmark.events(count, seed)`` (persons, auctions and
bids; the dataflow filters the bids itself). Event time is a bid's ``date_time`` (ms).

- q0-q3 as abs-engine's (``examples.nexmark.queries``: the same functions), q3's join with
  Bytewax's ``stateful_map`` keyed by person id; their output must equal the plain
  implementation's (``PLAIN``) as a multiset.
- q5 "hot items": sliding windows of 10 s every 2 s (starts are multiples of 2,000 ms since the
  epoch); bids per auction per window; per window ``(end_ms, sorted auctions with the max
  count, max count)``.
- q7 "highest bid": tumbling 10 s windows (starts multiples of 10,000 ms); per window
  ``(end_ms, [auction, price, bidder, date_time])`` of the bid with the greatest
  ``(price, bidder, auction, date_time)``.

Windows are ``[start, start + size)``; Bytewax names them by id ``i`` (start = i * slide) and
we report ``end_ms = i * slide + size``. Both queries key every bid on one key: Bytewax keeps a
watermark *per key*, so per-auction keys would close an auction's windows only when that
auction bids again. The clock's ``now_getter`` is frozen so the watermark is pure event time
(the default advances it with wall time and drops in-order bids as late). Events are
generated before timing; only ``run_main`` is timed (wall, and the process's CPU seconds);
every run's output must equal a plain-Python batch oracle, or the script exits non-zero.

Bytewax is installed into its own venv (``--venv``), and the measurement runs there in a
subprocess (this script re-invoked with ``--_worker``, ``PYTHONPATH`` = the repo root).

    python3 benchmarks/bytewax_nexmark.py --events 200000 --query all --repeat 3 --json OUT.json
    python3 benchmarks/bytewax_nexmark.py --query q0,q3 ...
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
Q5_SIZE, Q5_SLIDE, Q7_SIZE = 10_000, 2_000, 10_000
Q5Row = tuple[int, list[int], int]
Q7Row = tuple[int, list[int]]

# --- batch oracles --------------------------------------------------------------------------


def oracle_q5(bids: list[list[Any]]) -> list[Q5Row]:
    counts: dict[int, Counter[int]] = defaultdict(Counter)
    for bid in bids:
        last_start = bid[6] // Q5_SLIDE * Q5_SLIDE
        for start in range(last_start - Q5_SIZE + Q5_SLIDE, last_start + 1, Q5_SLIDE):
            counts[start + Q5_SIZE][bid[1]] += 1
    return sorted(_hot(end, c) for end, c in counts.items())


def oracle_q7(bids: list[list[Any]]) -> list[Q7Row]:
    best: dict[int, list[Any]] = {}
    for bid in bids:
        end = bid[6] // Q7_SIZE * Q7_SIZE + Q7_SIZE
        if end not in best or _q7_key(bid) > _q7_key(best[end]):
            best[end] = bid
    return sorted((end, _q7_out(bid)) for end, bid in best.items())


def _hot(end: int, counts: dict[int, int]) -> Q5Row:
    top = max(counts.values())
    return end, sorted(a for a, n in counts.items() if n == top), top


def _q7_key(bid: list[Any]) -> tuple[int, int, int, int]:
    return bid[3], bid[2], bid[1], bid[6]


def _q7_out(bid: list[Any]) -> list[int]:
    return [bid[1], bid[3], bid[2], bid[6]]


# --- Bytewax dataflows ----------------------------------------------------------------------


def _count_bid(acc: dict[int, int], bid: list[Any]) -> dict[int, int]:
    acc[bid[1]] = acc.get(bid[1], 0) + 1
    return acc


def _merge_counts(a: dict[int, int], b: dict[int, int]) -> dict[int, int]:
    for k, n in b.items():
        a[k] = a.get(k, 0) + n
    return a


def _max_bid(acc: list[Any] | None, bid: list[Any]) -> list[Any]:
    return bid if acc is None or _q7_key(bid) > _q7_key(acc) else acc


def build_flow(query: str, events: list[list[Any]], sink: list[Any]) -> Any:
    from bytewax import operators as op
    from bytewax.dataflow import Dataflow
    from bytewax.operators import windowing as win
    from bytewax.testing import TestingSink, TestingSource

    clock = win.EventClock(ts_getter=lambda bid: EPOCH + timedelta(milliseconds=bid[6]),
                           wait_for_system_duration=timedelta(0),
                           now_getter=lambda: EPOCH,  # frozen: watermark = max event time seen
                           to_system_utc=lambda _t: None)  # never wake up on system time
    flow = Dataflow(f"nexmark_{query}")
    inp = op.input("events", flow, TestingSource(events, batch_size=BATCH_SIZE))
    if query in ROW_QUERIES:
        op.output("out", _row_query(query, inp), TestingSink(sink))
        return flow
    bids = op.key_on("one_key", op.filter("bids", inp, lambda e: e[0] == "B"), lambda _bid: "all")
    if query == "q5":
        windower = win.SlidingWindower(length=timedelta(milliseconds=Q5_SIZE),
                                       offset=timedelta(milliseconds=Q5_SLIDE), align_to=EPOCH)
        out = win.fold_window("counts", bids, clock, windower, dict, _count_bid, _merge_counts, ordered=False)
        # out.down items are (key, (window_id, folded state)); window_id * slide = start (ms).
        rows = op.map("hot", out.down, lambda kv: _hot(kv[1][0] * Q5_SLIDE + Q5_SIZE, kv[1][1]))
    else:
        windower = win.TumblingWindower(length=timedelta(milliseconds=Q7_SIZE), align_to=EPOCH)
        out = win.fold_window("max", bids, clock, windower, lambda: None, _max_bid, _max_bid, ordered=False)
        rows = op.map("best", out.down, lambda kv: (kv[1][0] * Q7_SIZE + Q7_SIZE, _q7_out(kv[1][1])))
    op.output("out", rows, TestingSink(sink))
    return flow


ROW_QUERIES = ("q0", "q1", "q2", "q3")


def _row_query(query: str, inp: Any) -> Any:
    """q0-q3 with the functions abs-engine's dataflows use."""
    from bytewax import operators as op

    from examples.nexmark.queries import is_bid, q2_pick, q2_project, q3_join, q3_key, q3_side, to_euro

    if query == "q0":
        return op.filter("bids", inp, is_bid)
    if query == "q1":
        return op.map("euro", op.filter("bids", inp, is_bid), to_euro)
    if query == "q2":
        return op.map("project", op.filter("pick", inp, q2_pick), q2_project)
    keyed = op.key_on("person", op.filter("sides", inp, q3_side), lambda e: str(q3_key(e)))
    joined = op.stateful_map("join", keyed, q3_join)  # (key, rows) per event
    return op.flat_map("results", joined, lambda kv: kv[1])


BATCH_SIZE = 1000  # set from --batch-size in the worker
ORACLES: dict[str, Callable[[list[list[Any]]], list[Any]]] = {"q5": oracle_q5, "q7": oracle_q7}
QUERIES = (*ROW_QUERIES, "q5", "q7")


def worker(args: argparse.Namespace) -> int:
    global BATCH_SIZE
    BATCH_SIZE = args.batch_size
    from importlib.metadata import version

    from bytewax.testing import run_main

    from operators.nexmark import BID, events

    from examples.nexmark.queries import PLAIN, canonical

    data = list(events(args.events, args.seed))
    bids = [e for e in data if e[0] == BID]
    queries = list(QUERIES) if args.query == "all" else args.query.split(",")
    report: dict[str, Any] = {}
    for query in queries:
        rows = query in ROW_QUERIES
        expected = canonical(PLAIN[query](data)) if rows else ORACLES[query](bids)
        seconds: list[float] = []
        cpu: list[float] = []
        for _ in range(args.repeat):
            sink: list[Any] = []
            flow = build_flow(query, data, sink)
            start, c0 = time.perf_counter(), time.process_time()
            run_main(flow)
            seconds.append(time.perf_counter() - start)
            cpu.append(time.process_time() - c0)
            got = canonical(sink) if rows else sorted((r[0], list(r[1]), *r[2:]) for r in sink)
            if got != expected:
                diff = next((i for i, (g, e) in enumerate(zip(got, expected)) if g != e), min(len(got), len(expected)))
                print(f"bytewax {query}: WRONG ANSWER: {len(got)} rows, oracle {len(expected)}; first difference "
                      f"at {diff}: {got[diff:diff + 1]} != {expected[diff:diff + 1]}", file=sys.stderr)
                return 1
        rate = statistics.median(args.events / s for s in seconds)
        report[query] = {"events": args.events, "bids": len(bids), "rows": len(expected),
                         "seconds": [round(s, 4) for s in seconds], "events_per_s": rate,
                         "cpu_seconds": [round(c, 4) for c in cpu],
                         "events_per_s_per_core": statistics.median(args.events / c for c in cpu),
                         "batch_size": BATCH_SIZE, "bytewax": version("bytewax")}
        print(f"bytewax {version('bytewax')} {query}: {args.events} events ({len(bids)} bids, "
              f"{len(expected)} output rows, oracle ok) median {rate:,.0f} events/s "
              f"runs {', '.join(f'{s:.3f}s' for s in seconds)}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


# --- venv driver ----------------------------------------------------------------------------


def ensure_venv(venv: Path) -> Path:
    """The venv's python, with bytewax 0.21 (and msgpack, which abs_engine imports) installed."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    probe = "import importlib.metadata as m, msgpack; assert m.version('bytewax').startswith('0.21.')"
    if subprocess.run([str(python), "-c", probe], capture_output=True, check=False).returncode != 0:
        subprocess.run([str(python), "-m", "pip", "install", "-q", "bytewax==0.21.*", "msgpack"], check=True)
    return python


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=200_000, help="Nexmark events (all kinds) to generate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--query", default="all", help="all, or comma-separated among q0,q1,q2,q3,q5,q7")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=1000, help="TestingSource batch size")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--venv", default="/tmp/bytewax-venv", help="venv to install bytewax into")
    p.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.query != "all" and not set(args.query.split(",")) <= set(QUERIES):
        p.error(f"--query: all, or comma-separated among {','.join(QUERIES)}")
    if args._worker:
        return worker(args)
    python = ensure_venv(Path(args.venv))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    argv = sys.argv[1:]
    if args.json:  # the worker may run elsewhere: hand it an absolute path
        argv += ["--json", str(Path(args.json).resolve())]
    return subprocess.run([str(python), str(Path(__file__).resolve()), *argv, "--_worker"], env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
