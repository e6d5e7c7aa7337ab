"""PostgreSQL change data capture, end to end: PostgresCDCSource into PostgresSink (upsert,
parallelism 2) on one server, against psycopg copying the same rows in one plain loop.

    python3 benchmarks/cdc_bench.py                      # 200k rows, 2 rounds, latency at 2,000 rows/s
    python3 benchmarks/cdc_bench.py --rows 50000 --rounds 1 --seconds 5

Measured, each round in turn, each run into fresh tables:
- **latency**: rows inserted at ``--rate`` rows/s (one transaction every 10 ms) for
  ``--seconds`` s while the job streams; each row's age is the sink's commit time
  (``clock_timestamp()`` default of the replica's column) minus its insert time in the source
  (the same server's clock): p50/p99/max, with checkpoints every 1 s and every 0.2 s (the sink
  commits when a checkpoint completes, so the interval bounds the latency);
- **snapshot**: a table of ``--rows`` rows replicated by the snapshot phase (from run() to
  the end: the driver's staging, the workers' reading and the sink's commits), against a
  plain ``COPY ... TO STDOUT`` / ``COPY ... FROM STDIN`` loop;
- **stream**: ``--rows`` rows inserted by ``COPY`` in transactions of 1,000 while the job
  streams, from the first insert until the job has committed the last row, against the
  plain loop's time for the same rows.

The replica is checked equal to the source after every run. A PostgreSQL server is started
for the run (tests/operators/postgres_server.py). Results: benchmarks/results/cdc.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import psycopg  # noqa: E402

from abs_engine import Dataflow  # noqa: E402
from operators.postgres import PostgresSink  # noqa: E402
from operators.postgres_cdc import PostgresCDCSource, stop_stream  # noqa: E402
from tests.operators.postgres_server import Server, running  # noqa: E402

_run = iter(range(1_000_000))


def fresh(pg: Server, rows: int) -> tuple[str, str, str]:
    n = next(_run)
    src, dst, slot = f"src{n}", f"dst{n}", f"bench{n}"
    pg.query(f"CREATE TABLE {src} (id bigint PRIMARY KEY, payload text, written timestamptz NOT NULL DEFAULT "
             "clock_timestamp())")
    pg.query(f"CREATE TABLE {dst} (id bigint PRIMARY KEY, payload text, written timestamptz, synced timestamptz "
             "NOT NULL DEFAULT clock_timestamp())")
    if rows:
        pg.query(f"INSERT INTO {src} (id, payload) SELECT g, repeat('x', 40) || g FROM generate_series(1, {rows}) g")
    return src, dst, slot


def job(pg: Server, src: str, dst: str, slot: str, staging: str) -> Dataflow:
    flow = Dataflow(f"cdc-{slot}")
    (flow.source(PostgresCDCSource(pg.dsn(), [src], slot, staging), "cdc")
     .key_by(lambda c: c.key["id"])
     .sink(PostgresSink(pg.dsn(), dst, ["id", "payload", "written"], mode="upsert", key=["id"]), "pg",
           parallelism=2))
    return flow


def check(pg: Server, src: str, dst: str) -> None:
    a = pg.query(f"SELECT id, payload, written FROM {src} ORDER BY id")
    b = pg.query(f"SELECT id, payload, written FROM {dst} ORDER BY id")
    if a != b:
        raise SystemExit(f"the replica {dst} differs from {src} ({len(a)} rows against {len(b)})")


def wait_slot(pg: Server, slot: str) -> None:
    deadline = time.monotonic() + 60
    while not pg.query("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)):
        if time.monotonic() > deadline:
            raise SystemExit("the job made no slot in 60 s")
        time.sleep(0.01)


def streaming(pg: Server, interval: float, write: Any) -> tuple[str, str, float]:
    """Run the job on an empty table while ``write(src)`` changes it; (src, dst, seconds from
    the first write to the job's end)."""
    src, dst, slot = fresh(pg, 0)
    box: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        flow = job(pg, src, dst, slot, os.path.join(tmp, "staging"))
        t = threading.Thread(target=lambda: box.setdefault("r", flow.run(
            checkpoint_interval=interval, checkpoint_dir=os.path.join(tmp, "ck"))))
        t.start()
        wait_slot(pg, slot)
        began = time.perf_counter()
        write(src)
        stop_stream(pg.dsn(), slot)
        t.join()
        took = time.perf_counter() - began
    if "r" not in box:
        raise SystemExit("the job failed")
    check(pg, src, dst)
    return src, dst, took


def latency(pg: Server, rate: int, seconds: float, interval: float) -> dict[str, float]:
    def write(src: str) -> None:
        per_tick, tick = max(1, rate // 100), 0.01
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            start, n = time.perf_counter(), 0
            while time.perf_counter() - start < seconds:
                conn.execute(f"INSERT INTO {src} (id, payload) SELECT g, 'p' || g FROM generate_series(%s::bigint, "
                             "%s::bigint) g", (n, n + per_tick - 1))
                n += per_tick
                ahead = start + (n / per_tick) * tick - time.perf_counter()
                if ahead > 0:
                    time.sleep(ahead)  # the rate's pacing

    _, dst, _ = streaming(pg, interval, write)
    p50, p99, mx, n = pg.query(
        f"SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY a), percentile_cont(0.99) WITHIN GROUP (ORDER BY a), "
        f"max(a), count(*) FROM (SELECT extract(epoch FROM synced - written) * 1000 AS a FROM {dst}) t")[0]
    return {"p50_ms": float(p50), "p99_ms": float(p99), "max_ms": float(mx), "rows": int(n)}


def snapshot_run(pg: Server, rows: int) -> float:
    src, dst, slot = fresh(pg, rows)
    with tempfile.TemporaryDirectory() as tmp:
        flow = job(pg, src, dst, slot, os.path.join(tmp, "staging"))
        box: dict[str, Any] = {}
        began = time.perf_counter()
        t = threading.Thread(target=lambda: box.setdefault("r", flow.run(
            checkpoint_interval=1.0, checkpoint_dir=os.path.join(tmp, "ck"))))
        t.start()
        # the snapshot is done when the replica holds every row: then end the stream
        while pg.query(f"SELECT count(*) FROM {dst}")[0][0] < rows and t.is_alive():
            time.sleep(0.02)
        took = time.perf_counter() - began
        stop_stream(pg.dsn(), slot)
        t.join()
    check(pg, src, dst)
    return took


def stream_run(pg: Server, rows: int) -> float:
    def write(src: str) -> None:
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            for first in range(0, rows, 1_000):
                with conn.transaction(), conn.cursor().copy(f"COPY {src} (id, payload) FROM STDIN") as copy:
                    for i in range(first, min(rows, first + 1_000)):
                        copy.write_row((i, "x" * 40 + str(i)))

    return streaming(pg, 1.0, write)[2]


def plain_copy(pg: Server, rows: int) -> float:
    src, dst, _ = fresh(pg, rows)
    began = time.perf_counter()
    with psycopg.connect(pg.dsn()) as a, psycopg.connect(pg.dsn()) as b:
        with a.cursor().copy(f"COPY {src} (id, payload, written) TO STDOUT") as out, \
                b.cursor().copy(f"COPY {dst} (id, payload, written) FROM STDIN") as into:
            for data in out:
                into.write(data)
        b.commit()
    took = time.perf_counter() - began
    check(pg, src, dst)
    return took


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rate", type=int, default=2_000, help="rows per second for the latency runs")
    ap.add_argument("--seconds", type=float, default=10.0, help="seconds of writing for the latency runs")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    lat: dict[str, list[dict[str, float]]] = {"1.0": [], "0.2": []}
    times: dict[str, list[float]] = {"plain COPY": [], "snapshot": [], "stream": []}
    with running() as pg:
        for r in range(args.rounds):
            for interval in lat:
                lat[interval].append(latency(pg, args.rate, args.seconds, float(interval)))
            times["plain COPY"].append(plain_copy(pg, args.rows))
            times["snapshot"].append(snapshot_run(pg, args.rows))
            times["stream"].append(stream_run(pg, args.rows))
            print(json.dumps({"round": r, "latency": {k: v[-1] for k, v in lat.items()},
                              **{k: round(v[-1], 3) for k, v in times.items()}}), flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    rate = {k: args.rows / v for k, v in med.items()}
    lmed = {k: {q: statistics.median(x[q] for x in v) for q in ("p50_ms", "p99_ms", "max_ms")} for k, v in lat.items()}
    cmd = "python3 benchmarks/cdc_bench.py " + " ".join(argv)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cdc.json"), "w") as f:
        json.dump({"command": cmd, "date": time.strftime("%Y-%m-%d"), "rows": args.rows, "times": times,
                   "rows_per_second": rate, "latency": lat, "latency_median": lmed, "rate": args.rate,
                   "cpus": os.cpu_count()}, f, indent=1)
    md = [f"# PostgreSQL change data capture ({time.strftime('%Y-%m-%d')})", "",
          f"`{cmd}` on {os.cpu_count()} cores; one PostgreSQL server on the same machine; PostgresCDCSource into "
          f"PostgresSink (upsert, parallelism 2); medians of {args.rounds} rounds.", "",
          f"Latency, commit in the source table to commit in the replica, {args.rate:,} rows/s for "
          f"{args.seconds:g} s:", "",
          "| checkpoint interval | p50 | p99 | max |", "|---|---|---|---|"]
    for k, v in lmed.items():
        md.append(f"| {k} s | {v['p50_ms']:.0f} ms | {v['p99_ms']:.0f} ms | {v['max_ms']:.0f} ms |")
    md += ["", f"Throughput, {args.rows:,} rows (bigint, text, timestamptz), checkpoints every 1 s:", "",
           "| run | seconds | rows/s | vs plain COPY |", "|---|---|---|---|"]
    for k in times:
        md.append(f"| {k} | {med[k]:.2f} | {rate[k]:,.0f} | {rate[k] / rate['plain COPY']:.2f}x |")
    with open(os.path.join(args.out, "cdc.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
