"""Rows per second into PostgreSQL: PostgresSink at parallelism 2 with checkpoints every 1 s,
against psycopg writing the same rows in one plain loop (the ceiling), COPY and executemany.

    python3 benchmarks/postgres_bench.py                 # 1M rows, 2 rounds
    python3 benchmarks/postgres_bench.py --rows 200000 --rounds 1

A PostgreSQL server is started for the run (tests/operators/postgres_server.py: Debian's
``postgresql``, a temporary directory, loopback; fsync off, as in the tests). Each round runs
every configuration once, in turn, into a fresh table; the figure is the median. The plain
loops hold every row in memory first and count only the writing; the job makes its rows in
its workers and counts from ``run()`` to its end (start-up included, and reported), and its
output is checked against the input. Results: benchmarks/results/postgres.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import psycopg  # noqa: E402

from abs_engine import Dataflow  # noqa: E402
from operators.generators import RangeSource  # noqa: E402
from operators.postgres import PostgresSink  # noqa: E402
from tests.operators.postgres_server import Server, running  # noqa: E402

COLUMNS = ["k", "n", "label"]


def row(i: int) -> tuple[str, int, str]:
    return f"user{i % 10_000}", i, f"event-{i}"


def rows_of(n: int) -> list[tuple[str, int, str]]:
    return [row(i) for i in range(n)]


def new_table(pg: Server, name: str) -> str:
    pg.query(f"DROP TABLE IF EXISTS {name}")
    pg.query(f"CREATE TABLE {name} (k text, n bigint, label text)")
    return name


def plain_copy(pg: Server, table: str, rows: list[Any]) -> float:
    began = time.perf_counter()
    with psycopg.connect(pg.dsn()) as conn, conn.cursor() as cur:
        with cur.copy(f"COPY {table} (k, n, label) FROM STDIN") as copy:
            for r in rows:
                copy.write_row(r)
        conn.commit()
    return time.perf_counter() - began


def plain_executemany(pg: Server, table: str, rows: list[Any]) -> float:
    began = time.perf_counter()
    with psycopg.connect(pg.dsn()) as conn, conn.cursor() as cur:
        cur.executemany(f"INSERT INTO {table} (k, n, label) VALUES (%s, %s, %s)", rows)
        conn.commit()
    return time.perf_counter() - began


def engine(pg: Server, table: str, rows: list[Any], parallelism: int) -> tuple[float, float]:
    flow = Dataflow("pgbench")
    # Rows made in the workers (a list of a million would be shipped to each of them first).
    (flow.source(RangeSource(len(rows), batch_size=2_000), "read", parallelism=parallelism).map(row, "row")
     .sink(PostgresSink(pg.dsn(), table, COLUMNS), "pg", parallelism=parallelism))
    with tempfile.TemporaryDirectory() as ck:
        began = time.perf_counter()
        res = flow.run(checkpoint_interval=1.0, checkpoint_dir=ck)
        return time.perf_counter() - began, res.running_after_s


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    rows = rows_of(args.rows)
    times: dict[str, list[float]] = {"plain COPY": [], "plain executemany": [], "engine p2": []}
    startup: list[float] = []
    with running() as pg:
        for r in range(args.rounds):
            plain: dict[str, Callable[[Server, str, list[Any]], float]] = {
                "plain COPY": plain_copy, "plain executemany": plain_executemany}
            for name, fn in plain.items():
                table = new_table(pg, "bench")
                times[name].append(fn(pg, table, rows))
            table = new_table(pg, "bench")
            took, up = engine(pg, table, rows, 2)
            got = pg.query(f"SELECT count(*), count(DISTINCT n) FROM {table}")[0]
            if got != (args.rows, args.rows):
                raise SystemExit(f"the job wrote {got} rows (distinct), not {args.rows}")
            times["engine p2"].append(took)
            startup.append(up)
            print(json.dumps({"round": r, **{k: round(v[-1], 3) for k, v in times.items()}}), flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    rate = {k: args.rows / v for k, v in med.items()}
    cmd = "python3 benchmarks/postgres_bench.py " + " ".join(argv)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "postgres.json"), "w") as f:
        json.dump({"command": cmd, "date": time.strftime("%Y-%m-%d"), "rows": args.rows, "times": times,
                   "rows_per_second": rate, "engine_startup_s": startup, "cpus": os.cpu_count()}, f, indent=1)
    md = [f"# Rows into PostgreSQL ({time.strftime('%Y-%m-%d')})", "",
          f"`{cmd}` on {os.cpu_count()} cores, {args.rows:,} rows of (text, bigint, text), medians of "
          f"{args.rounds} rounds. The engine: PostgresSink at parallelism 2, checkpoints every 1 s, "
          f"timed from run() to its end (start-up {statistics.median(startup):.2f} s of it).", "",
          "| writer | seconds | rows/s | vs plain COPY |", "|---|---|---|---|"]
    for k in times:
        md.append(f"| {k} | {med[k]:.2f} | {rate[k]:,.0f} | {rate[k] / rate['plain COPY']:.2f}x |")
    with open(os.path.join(args.out, "postgres.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
