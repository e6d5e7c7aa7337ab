"""Event-to-output latency (p50, p99, max) at a steady input rate, with checkpoints.

    python3 benchmarks/latency_bench.py                       # 20k and 100k events/s, 10 s each
    python3 benchmarks/latency_bench.py --rates 50000 --seconds 5
    python3 benchmarks/latency_bench.py --half-max --seconds 5  # the issue's goal: q1 at half its maximum rate

The job is Nexmark q1's shape with a shuffle after it: a rate-limited source of events (an
id and the wall time the event was due) at ``--rate`` events per second, spread over the
source's subtasks; q1's map (a bid's price in euros); a keyed running count (the shuffle);
and a sink that times every event twice:

* **processed**: from the event's due time until the sink processes it (what the pipeline
  itself adds: batching, framing, the shuffle, the processes' scheduling);
* **committed**: until its checkpoint completes and an exactly-once sink would publish it
  (FileSink, ParquetSink): the latency a reader of the output sees, which the checkpoint
  interval bounds from below (Flink's two-phase-commit sinks have the same floor).

Each run also reports the engine's own measure, ``JobResult.latency`` (latency markers every
``--marker-interval`` s, runtime/latency.py), beside the sink's per-record one.
``--half-max`` first measures the job's maximum rate (every event due at once: events over
the time until the sink has processed the last), then runs at half of it.

The source is due-time driven: an event becomes due at ``start + i / rate``, and a source
that falls behind emits what is due at once, so the latencies include any backlog. The
machine's clock is shared by every process (one host). Each configuration runs once per
round, rounds interleaved. Results: benchmarks/results/latency.{json,md}
(latency-half-max.{json,md} with ``--half-max``).
"""

from __future__ import annotations

import argparse
import array
import glob
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from abs_engine import Dataflow  # noqa: E402
from operators.base import OperatorContext, Sink, Source  # noqa: E402


class DueSource(Source[Any]):
    """``count`` events ``(i, due)``, event i due at ``start + i / rate`` (wall time); subtask
    k of p emits the events with i % p == k. Its offset is the next index."""

    def __init__(self, count: int, rate: float, start: float):
        self.count, self.rate, self.start = count, rate, start

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self.k, self.p = ctx.subtask_index, ctx.parallelism
        self.next = ctx.subtask_index

    def read_batch(self) -> list[Any] | None:
        if self.next >= self.count:
            return None
        due_upto = min(self.count, int((time.time() - self.start) * self.rate) + 1)
        if due_upto <= self.next:
            time.sleep(min(0.001, (self.next - due_upto + 1) / self.rate))  # the next event is not due yet
            return []
        start, rate = self.start, self.rate
        ids = range(self.next, due_upto, self.p)
        self.next = ids[-1] + self.p if len(ids) else self.next
        return [(i, start + i / rate) for i in ids]

    def snapshot(self, checkpoint_id: int) -> Any:
        return self.next

    def restore(self, state: Any) -> None:
        self.next = int(state)


def euros(event: tuple[int, float]) -> tuple[int, float, float]:
    """q1's conversion (a price, here derived from the id, in euros)."""
    return event[0] % 1000, event[1], (event[0] % 997) * 0.908


class LatencySink(Sink):
    """Times each record from its due time (field 1 of the record's value) to its processing
    and to its checkpoint's completion; writes both as float arrays to ``directory`` at the
    end (one file per subtask and kind)."""

    def __init__(self, directory: str):
        self.directory = directory

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self.processed = array.array("d")
        self.committed = array.array("d")
        # Due times in arrays, not lists: a list of a second's floats, traversed by every
        # young-generation collection while it grows, cost the sink 20-30 ms a time.
        self.epoch = array.array("d")  #: due times since the last barrier
        self.pending: dict[int, array.array[float]] = {}  #: checkpoint id -> the due times it commits
        self.done: list[tuple[float, array.array[float]]] = []  #: (when committed, the due times)

    def process(self, batch: list[Any]) -> list[Any]:
        now = time.time()
        dues = [r[1][1] for r in batch]  # (key, (id % 1000, due, euros)) -> due
        self.processed.extend(now - d for d in dues)
        self.epoch.extend(dues)
        return []

    def snapshot(self, checkpoint_id: int) -> Any:
        self.pending[checkpoint_id], self.epoch = self.epoch, array.array("d")
        return None

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        # O(1) per checkpoint: the ages are computed at the end. Computing them here (a
        # Python loop over a second of events) held the sink for tens of milliseconds at
        # every checkpoint, and that showed as the engine's latency.
        now = time.time()
        for cid in sorted(c for c in self.pending if c <= checkpoint_id):
            self.done.append((now, self.pending.pop(cid)))

    def finish(self) -> list[Any]:
        for now, dues in self.done:
            self.committed.extend(now - d for d in dues)
        for kind in ("processed", "committed"):
            with open(os.path.join(self.directory, f"{kind}-{self.ctx.subtask_index}.bin"), "wb") as f:
                getattr(self, kind).tofile(f)
        return []


def first(e: tuple[int, float, float]) -> int:
    return e[0]


def latest(a: tuple[int, float, float], b: tuple[int, float, float]) -> tuple[int, float, float]:
    return b


def percentiles(values: array.array[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    s = sorted(values)
    pick = (lambda q: s[min(len(s) - 1, int(q * len(s)))])
    return {"n": len(s), "p50_ms": round(pick(0.50) * 1e3, 2), "p99_ms": round(pick(0.99) * 1e3, 2),
            "max_ms": round(s[-1] * 1e3, 2)}


def run_once(rate: int, seconds: float, parallelism: int, interval: float, markers: float = 0.05,
             count: int | None = None) -> dict[str, Any]:
    where = tempfile.mkdtemp(prefix="abs-latency-")
    count = int(rate * seconds) if count is None else count
    flow = Dataflow("latency", parallelism=parallelism)
    # The first events are due a moment after the start, once the workers are up.
    start = time.time() + 1.5
    (flow.source(DueSource(count, rate, start), name="events").map(euros, name="q1")
     .key_by(first).reduce(latest, name="latest")
     .sink(LatencySink(where), name="timer"))
    res = flow.run(checkpoint_interval=interval, checkpoint_dir=os.path.join(where, "ck"), latency_interval=markers)
    out: dict[str, Any] = {"rate": rate, "parallelism": parallelism, "interval": interval,
                           "checkpoints": len([c for c in res.checkpoints if not c.final])}
    for kind in ("processed", "committed"):
        values: array.array[float] = array.array("d")
        for path in glob.glob(os.path.join(where, f"{kind}-*.bin")):
            with open(path, "rb") as f:
                values.frombytes(f.read())
        out[kind] = percentiles(values)
    out["markers"] = res.latency.to_dict() if res.latency is not None else {"samples": 0}
    out["events_seen"] = out["processed"]["n"]
    if out["events_seen"] != count:
        raise SystemExit(f"the sink saw {out['events_seen']} events of {count}")
    return out


def max_rate(seconds: float, parallelism: int, interval: float, guess: int = 1_000_000) -> float:
    """Events per second the job sustains: ``guess * seconds`` events all due at the start;
    their number over the time until the sink processed the last (its largest latency)."""
    count = int(guess * seconds)
    row = run_once(10**9, seconds, parallelism, interval, count=count)
    return count / (row["processed"]["max_ms"] / 1000)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="20000,100000", help="events per second, comma-separated")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--parallelism", type=int, default=1)
    ap.add_argument("--interval", type=float, default=1.0, help="checkpoint interval (s)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--marker-interval", type=float, default=0.05, help="latency_interval (s)")
    ap.add_argument("--half-max", action="store_true", help="measure the maximum rate, run at half of it")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    rates = [int(r) for r in args.rates.split(",")]
    maximum = None
    if args.half_max:
        maximum = max_rate(args.seconds, args.parallelism, args.interval)
        print(f"maximum rate: {maximum:,.0f} events/s", flush=True)
        rates = [int(maximum / 2)]
    runs = []
    for r in range(args.rounds):
        for rate in rates:
            row = run_once(rate, args.seconds, args.parallelism, args.interval, args.marker_interval)
            row["round"] = r
            print(json.dumps(row), flush=True)
            runs.append(row)
    summary = []
    for rate in rates:
        mine = [x for x in runs if x["rate"] == rate]

        def med(kind: str, q: str) -> float | None:
            values = [x[kind][q] for x in mine if q in x[kind]]
            return round(statistics.median(values), 2) if values else None

        summary.append({"rate": rate, **{f"{k}_{q}": med(k, q) for k in ("processed", "committed", "markers")
                                         for q in ("p50_ms", "p99_ms", "max_ms")}})
    cmd = "python3 benchmarks/latency_bench.py " + " ".join(argv)
    os.makedirs(args.out, exist_ok=True)
    name = "latency-half-max" if args.half_max else "latency"
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump({"command": cmd, "date": time.strftime("%Y-%m-%d"), "args": vars(args), "max_rate": maximum,
                   "runs": runs,
                   "summary": summary, "cpus": os.cpu_count()}, f, indent=1)
    md = [f"# Event-to-output latency ({time.strftime('%Y-%m-%d')})", "",
          f"`{cmd}` on {os.cpu_count()} cores: Nexmark q1's map then a keyed running reduce (a shuffle) "
          f"at parallelism {args.parallelism}, checkpoints every {args.interval:g} s, {args.seconds:g} s per run; "
          f"medians of {args.rounds} rounds. *Processed*: event due -> the sink processes it. *Committed*: "
          "event due -> its checkpoint completes (when an exactly-once sink publishes it). *Markers*: "
          f"the engine's own measure (`JobResult.latency`, a latency marker every {args.marker_interval:g} s).",
          "", *([f"Maximum rate measured first: {maximum:,.0f} events/s; the run is at half of it.", ""]
                if maximum else []),
          "| events/s | processed p50 | processed p99 | processed max | committed p50 | committed p99 "
          "| markers p50 | markers p99 |",
          "|---|---|---|---|---|---|---|---|"]
    for s in summary:
        md.append(f"| {s['rate']:,} | {s['processed_p50_ms']} ms | {s['processed_p99_ms']} ms | "
                  f"{s['processed_max_ms']} ms | {s['committed_p50_ms']} ms | {s['committed_p99_ms']} ms | "
                  f"{s['markers_p50_ms']} ms | {s['markers_p99_ms']} ms |")
    with open(os.path.join(args.out, f"{name}.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
