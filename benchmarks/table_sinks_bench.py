"""Rows per second into Delta Lake and Iceberg tables: DeltaSink and IcebergSink at
parallelism 2 with checkpoints every 1 s, against the format's own library writing the same
rows in one plain call (the ceiling), on the local disk (Iceberg: a SQL catalog on SQLite).

    python3 benchmarks/table_sinks_bench.py                  # 1M rows, 2 rounds
    python3 benchmarks/table_sinks_bench.py --rows 200000 --rounds 1

The plain writers get every row in one Arrow table made beforehand and count only the
writing; the jobs make their rows in their workers (or read a Parquet file of them as
RecordBatches, the columnar path) and count from ``run()`` to its end
(start-up included, and reported), and each table is checked against the input (row count
and distinct ids) with the format's own reader. Results: benchmarks/results/table_sinks.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import pyarrow as pa  # noqa: E402

from abs_engine import Dataflow  # noqa: E402
from operators.arrow_sources import ParquetSource  # noqa: E402
from operators.delta import DeltaSink  # noqa: E402
from operators.generators import RangeSource  # noqa: E402
from operators.iceberg import IcebergSink  # noqa: E402

SCHEMA = pa.schema([("k", pa.string()), ("n", pa.int64()), ("label", pa.string())])


def row(i: int) -> tuple[str, int, str]:
    return f"user{i % 10_000}", i, f"event-{i}"


def catalog(where: str) -> dict[str, str]:
    return {"type": "sql", "uri": f"sqlite:///{where}/catalog.db", "warehouse": f"file://{where}/warehouse"}


def plain(kind: str, where: str, data: pa.Table) -> float:
    began = time.perf_counter()
    if kind == "delta":
        from deltalake import write_deltalake

        write_deltalake(os.path.join(where, "table"), data)
    else:
        from pyiceberg.catalog import load_catalog

        c = load_catalog("default", **catalog(where))
        c.create_namespace("bench")
        c.create_table("bench.events", schema=SCHEMA).append(data)
    return time.perf_counter() - began


def engine(kind: str, where: str, n: int, parquet: str | None = None) -> tuple[float, float]:
    """Rows made in the workers, or (``parquet``) the file's RecordBatches handed on whole."""
    sink: Any = (DeltaSink(os.path.join(where, "table"), SCHEMA) if kind == "delta"
                 else IcebergSink(catalog(where), "bench.events", SCHEMA))
    flow = Dataflow("tablebench")
    if parquet is not None:
        flow.source(ParquetSource(parquet), "read", parallelism=2).sink(sink, "table", parallelism=2)
    else:
        (flow.source(RangeSource(n, batch_size=2_000), "read", parallelism=2).map(row, "row")
         .sink(sink, "table", parallelism=2))
    began = time.perf_counter()
    res = flow.run(checkpoint_interval=1.0, checkpoint_dir=os.path.join(where, "ck"))
    return time.perf_counter() - began, res.running_after_s


def count(kind: str, where: str) -> tuple[int, int]:
    if kind == "delta":
        import deltalake

        t = deltalake.DeltaTable(os.path.join(where, "table")).to_pyarrow_table()
    else:
        from pyiceberg.catalog import load_catalog

        t = load_catalog("default", **catalog(where)).load_table("bench.events").scan().to_arrow()
    return t.num_rows, len(set(t.column("n").to_pylist()))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    data = pa.Table.from_pylist([dict(zip(SCHEMA.names, row(i))) for i in range(args.rows)], schema=SCHEMA)
    parquet = os.path.join(tempfile.mkdtemp(prefix="abs-tables-in-"), "events.parquet")
    import pyarrow.parquet as pq

    pq.write_table(data, parquet, row_group_size=100_000)
    hows = ("plain", "engine p2", "engine p2, Arrow batches")
    times: dict[str, list[float]] = {f"{k} {w}": [] for k in ("delta", "iceberg") for w in hows}
    startup: dict[str, list[float]] = {"delta": [], "iceberg": []}
    for r in range(args.rounds):
        for kind in ("delta", "iceberg"):
            for how in hows:
                where = tempfile.mkdtemp(prefix="abs-tables-")
                try:
                    if how == "plain":
                        took = plain(kind, where, data)
                    else:
                        took, up = engine(kind, where, args.rows, parquet if "Arrow" in how else None)
                        startup[kind].append(up)
                    if count(kind, where) != (args.rows, args.rows):
                        raise SystemExit(f"{kind} {how}: the table holds {count(kind, where)}, not {args.rows} rows")
                    times[f"{kind} {how}"].append(took)
                finally:
                    shutil.rmtree(where, ignore_errors=True)
        print(json.dumps({"round": r, **{k: round(v[-1], 3) for k, v in times.items()}}), flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    rate = {k: args.rows / v for k, v in med.items()}
    cmd = "python3 benchmarks/table_sinks_bench.py " + " ".join(argv)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "table_sinks.json"), "w") as f:
        json.dump({"command": cmd, "date": time.strftime("%Y-%m-%d"), "rows": args.rows, "times": times,
                   "rows_per_second": rate, "engine_startup_s": startup, "cpus": os.cpu_count()}, f, indent=1)
    md = [f"# Rows into Delta Lake and Iceberg ({time.strftime('%Y-%m-%d')})", "",
          f"`{cmd}` on {os.cpu_count()} cores, {args.rows:,} rows of (string, int64, string) on the local disk, "
          f"medians of {args.rounds} rounds. Plain: the format's library writes one Arrow table made beforehand. "
          "Engine: the sink at parallelism 2, checkpoints every 1 s, timed from run() to its end; rows made in the "
          "workers as tuples, or (Arrow batches) a Parquet file of the same rows read by ParquetSource and its "
          "RecordBatches handed to the sink whole.", "",
          "| writer | seconds | rows/s | vs plain |", "|---|---|---|---|"]
    for k in times:
        base = rate[k.split()[0] + " plain"]
        md.append(f"| {k} | {med[k]:.2f} | {rate[k]:,.0f} | {rate[k] / base:.2f}x |")
    md += ["", "Engine start-up (running_after_s), median: " + ", ".join(
        f"{k} {statistics.median(v):.2f} s" for k, v in startup.items() if v) + "."]
    with open(os.path.join(args.out, "table_sinks.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
