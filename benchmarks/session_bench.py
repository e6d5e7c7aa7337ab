"""Checkpoints of a session-window job with many open sessions: how long they take, how much
they write, full against incremental.

    python benchmarks/session_bench.py                       # 20,000 users, 1,000,000 events
    python benchmarks/session_bench.py --events 200000 --rounds 1   # a quick check

The job (a clickstream sessionizer): events ``(user, ts_ms, page)`` of ``--users`` users, in
event-time order; per user, session windows with a 30-minute gap, aggregated as ``[clicks,
first ts, last ts, the last 20 pages]`` (hundreds of bytes a session); every session stays
open to the end (the input spans less than the gap), so the state grows to all users'
sessions. Parallelism 2, aligned checkpoints every ``--interval`` seconds; the source is
throttled to ``--rate`` events/s so that the run spans several checkpoints, as a live job
does. Reported per variant: each periodic checkpoint's duration (trigger to last
acknowledgement), the bytes it wrote and the state's size, medians over the rounds' checkpoints.
Every run's output (one row per user's session at the end) must equal a batch oracle.
Writes benchmarks/results/sessions.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from typing import Any, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from abs_engine import Dataflow  # noqa: E402
from abs_engine.testing import CapturingSink  # noqa: E402
from operators import SessionWindows  # noqa: E402
from operators.base import OperatorContext  # noqa: E402
from operators.eventtime import BoundedOutOfOrderness  # noqa: E402
from operators.generators import IndexSource  # noqa: E402

GAP_MS = 30 * 60 * 1000
PAGES = 20  #: pages a session keeps


def click(i: int, users: int) -> tuple[str, int, str]:
    r = random.Random(i)
    return (f"user-{r.randrange(users):05d}", i, f"/page/{r.randrange(500)}")


class Clicks(IndexSource[tuple[str, int, str]]):
    """Event i: a click of a pseudo-random user at ``i`` ms; at most ``rate`` events/s per
    subtask (a live stream's pace)."""

    def __init__(self, count: int, users: int, rate: float, batch_size: int = 500):
        self.count, self.users, self.rate, self.batch_size = count, users, rate, batch_size

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self.t0: float | None = None
        self.sent = 0

    def records(self, indices: Sequence[int]) -> list[tuple[str, int, str]]:
        now = time.monotonic()
        if self.t0 is None:
            self.t0 = now
        due = self.t0 + self.sent / self.rate
        if due > now:
            time.sleep(due - now)  # pacing the input, as a live stream is paced: not synchronisation
        self.sent += len(indices)
        return [click(i, self.users) for i in indices]


def ts(e: tuple[str, int, str]) -> int:
    return e[1]


def user(e: tuple[str, int, str]) -> str:
    return e[0]


def new_session() -> list[Any]:
    return [0, None, None, []]


def add_click(acc: list[Any], e: tuple[str, int, str]) -> list[Any]:
    pages = list(acc[3][-(PAGES - 1):]) + [e[2]]
    return [acc[0] + 1, e[1] if acc[1] is None else min(acc[1], e[1]), e[1] if acc[2] is None else max(acc[2], e[1]),
            pages]


def merge_sessions(a: list[Any], b: list[Any]) -> list[Any]:
    first, second = (a, b) if (a[1] or 0) <= (b[1] or 0) else (b, a)
    return [a[0] + b[0], first[1], second[2], (list(first[3]) + list(second[3]))[-PAGES:]]


def clicks_of(acc: Any) -> int:
    return int(acc[0])


def oracle(events: int, users: int) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for i in range(events):
        u = click(i, users)[0]
        counts[u] = counts.get(u, 0) + 1
    return sorted(counts.items())


def run(events: int, users: int, rate: float, interval: float, incremental: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="session-bench-") as tmp:
        flow = Dataflow("sessions", parallelism=2)
        (flow.source(Clicks(events, users, rate / 2), timestamps=ts, watermarks=BoundedOutOfOrderness(0))
         .key_by(user).window(SessionWindows(GAP_MS), ts)
         .aggregate(new_session, add_click, clicks_of, merge=merge_sessions, name="sessions")
         .map(lambda r: (r[0], r[3]), name="row").sink(CapturingSink(os.path.join(tmp, "out")), parallelism=1))
        res = flow.run(checkpoint_dir=os.path.join(tmp, "ck"), checkpoint_interval=interval,
                       incremental_checkpoints=incremental)
        got = sorted((u, n) for u, n in CapturingSink(os.path.join(tmp, "out")).records())
    periodic = [c for c in res.checkpoints if not c.final]
    return {"seconds": res.duration_s, "checkpoints": len(periodic),
            "duration_ms": [round(c.duration_ms, 1) for c in periodic],
            "bytes": [c.bytes for c in periodic], "state_size": [c.state_size for c in periodic],
            "output": got}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--users", type=int, default=20_000)
    ap.add_argument("--rate", type=float, default=100_000, help="events/s of the whole source (default %(default)s)")
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    if args.events >= GAP_MS:
        ap.error("--events must stay below the gap (one event a millisecond): every session stays open")
    expected = oracle(args.events, args.users)
    runs: dict[str, list[dict[str, Any]]] = {"full": [], "incremental": []}
    for r in range(args.rounds):
        for name in (runs if r % 2 == 0 else list(runs)[::-1]):
            got = run(args.events, args.users, args.rate, args.interval, name == "incremental")
            if got.pop("output") != expected:
                raise SystemExit(f"{name}: WRONG ANSWER (sessions differ from the batch oracle)")
            runs[name].append(got)
            print(f"round {r + 1} {name:>11}: {got['checkpoints']} checkpoints, durations (ms) {got['duration_ms']}, "
                  f"bytes {got['bytes']}", flush=True)

    def pooled(name: str, key: str) -> list[float]:
        return [x for run_ in runs[name] for x in run_[key]]

    summary = {name: {"checkpoints": sum(r["checkpoints"] for r in runs[name]),
                      "duration_ms_median": statistics.median(pooled(name, "duration_ms") or [0]),
                      "duration_ms_max": max(pooled(name, "duration_ms") or [0]),
                      "bytes_median": statistics.median(pooled(name, "bytes") or [0]),
                      "state_size_max": max(pooled(name, "state_size") or [0])} for name in runs}
    meta = {"command": "python benchmarks/session_bench.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "events": args.events, "users": args.users, "rate": args.rate, "interval_s": args.interval,
            "rounds": args.rounds, "cores": os.cpu_count(), "python": platform.python_version(),
            "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "sessions.json"), "w", encoding="utf-8") as f:
        json.dump({"meta": meta, "summary": summary, "runs": runs}, f, indent=2)
        f.write("\n")
    lines = ["# Session windows: checkpoint time with many open sessions", "",
             f"`{meta['command'].strip()}` ({meta['when']}, {meta['cores']} cores): {args.events:,} clicks of "
             f"{args.users:,} users at {args.rate:,.0f} events/s, session windows (30 min gap, all open to the "
             f"end), parallelism 2, aligned checkpoints every {args.interval:g} s; {args.rounds} interleaved "
             "round(s); every output equal to the batch oracle.", "",
             "| checkpoints | count | duration p50 | duration max | written p50 | state at most |",
             "|---|---|---|---|---|---|"]
    for name, s in summary.items():
        lines.append(f"| {name} | {s['checkpoints']} | {s['duration_ms_median']:,.0f} ms | "
                     f"{s['duration_ms_max']:,.0f} ms | {s['bytes_median'] / 1e6:.2f} MB | "
                     f"{s['state_size_max'] / 1e6:.2f} MB |")
    with open(os.path.join(args.out, "sessions.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
