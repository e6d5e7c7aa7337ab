"""Spark source throughput and word count through Spark.

    python benchmarks/spark_bench.py                  # 10M short rows, 2 rounds

1. Rows/s the SparkSource delivers into the engine (parallelism 2, batches dropped right
   after the source by a batch-level operator) for 10M short text rows, side by side with ``df.toArrow()`` on the
   same DataFrame (the ceiling) and ``df.toLocalIterator()`` (the naive way).
2. Word count end to end over a 10M-word corpus, checkpoints every 1 s, with the input read
   through Spark vs the engine's plain file source.
Variants run interleaved; results go to benchmarks/results/spark.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

from abs_engine import Dataflow
from abs_engine.spark_session import embedded_session
from abs_engine.testing import write_zipf_corpus
from operators import FileSink, Operator, TextFileSource
from operators.spark import SparkSource

HERE = os.path.dirname(os.path.abspath(__file__))


def short_rows_file(rows: int) -> str:
    path = os.path.join(tempfile.gettempdir(), f"abs-engine-short-rows-{rows}.txt")
    if not os.path.exists(path):
        rng = random.Random(3)
        with open(path + ".tmp", "w") as f:
            for start in range(0, rows, 100_000):
                n = min(100_000, rows - start)
                f.write("\n".join(f"w{rng.randrange(10_000)} w{rng.randrange(10_000)}" for _ in range(n)) + "\n")
        os.replace(path + ".tmp", path)
    return path


class Discard(Operator):
    """Drops whole batches: what is measured is the source, not a per-record call."""

    def process(self, batch: list[object]) -> list[object]:
        return []


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--words", type=int, default=10_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-iterator", action="store_true", help="leave out toLocalIterator (slow)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()

    spark = embedded_session()
    rows_path = short_rows_file(args.rows)
    corpus = os.path.join(tempfile.gettempdir(), f"abs-engine-zipf-{args.words}-10000.txt")
    if not os.path.exists(corpus):
        write_zipf_corpus(corpus + ".tmp", args.words, 10_000, seed=7)
        os.replace(corpus + ".tmp", corpus)
    df = spark.read.text(rows_path)
    n = df.count()
    out = os.path.join(tempfile.gettempdir(), "abs-engine-spark-bench.tsv")

    delivery: list[float] = []

    def engine_source() -> float:
        flow = Dataflow("spark-source", parallelism=2)
        src = SparkSource(df)
        flow.source(src).apply(Discard()).sink(FileSink(out), parallelism=1)
        t0 = time.perf_counter()
        flow.run(mode="none")
        secs = time.perf_counter() - t0
        if src.delivered_rows() != n:
            raise SystemExit(f"the source delivered {src.delivered_rows()} rows, expected {n}")
        delivery.append(src.delivery_seconds() or secs)
        return secs

    def to_arrow() -> float:
        t0 = time.perf_counter()
        assert df.toArrow().num_rows == n
        return time.perf_counter() - t0

    def to_local_iterator() -> float:
        t0 = time.perf_counter()
        assert sum(1 for _ in df.toLocalIterator()) == n
        return time.perf_counter() - t0

    def wordcount(source: str) -> float:
        flow = Dataflow("wordcount", parallelism=2)
        reader = SparkSource(spark.read.text(corpus)) if source == "spark" else TextFileSource(corpus)
        flow.source(reader).flat_map(str.split).key_by().count_final().sink(FileSink(out), parallelism=1)
        t0 = time.perf_counter()
        flow.run(checkpoint_interval=1.0)
        secs = time.perf_counter() - t0
        total = sum(int(line.rsplit("\t", 1)[1]) for line in open(out, encoding="utf-8"))
        if total != args.words:
            raise SystemExit(f"word count through {source} counted {total}, expected {args.words}")
        return secs

    variants = {"engine_spark_source": engine_source, "toArrow": to_arrow}
    if not args.skip_iterator:
        variants["toLocalIterator"] = to_local_iterator
    variants |= {"wordcount_spark": lambda: wordcount("spark"), "wordcount_file": lambda: wordcount("file")}
    # Warm the JVM's JIT for both Arrow paths before anything is timed (the first runs of
    # each were 2-4x slower than later ones): toArrow's collect, and runJob over toArrowBatchRdd.
    to_arrow()
    engine_source()
    delivery.clear()
    runs: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(args.rounds):
        for name, fn in variants.items():
            runs[name].append(fn())
            print(f"round {r + 1} {name:20} {runs[name][-1]:6.2f}s", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in runs.items()}
    rate = {k: n / med[k] for k in ("engine_spark_source", "toArrow", "toLocalIterator") if k in med}
    rate["spark_source_delivery_window"] = n / statistics.median(delivery)
    summary = {
        "command": "python benchmarks/spark_bench.py " + " ".join(sys.argv[1:]),
        "rows": n, "words": args.words, "rounds": args.rounds, "median_seconds": med,
        "rows_per_s": rate, "source_vs_toArrow": rate["engine_spark_source"] / rate["toArrow"],
        "delivery_window_vs_toArrow": rate["spark_source_delivery_window"] / rate["toArrow"],
        "delivery_seconds": delivery,
        "wordcount_spark_vs_file": med["wordcount_file"] / med["wordcount_spark"],
        "runs": runs, "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "note": "engine_spark_source includes starting 3 worker processes (~0.3 s); Spark start-up is excluded",
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "spark.json"), "w") as f:
        json.dump(summary, f, indent=2)
    lines = [
        "# Spark source benchmark", "",
        f"Command: `{summary['command']}`  ",
        f"{n:,} short text rows (two words each), local Spark, parallelism 2, {args.rounds} interleaved rounds "
        f"(median); {summary['when']}.", "",
        "| variant | seconds | rows/s |", "|---|---|---|",
    ]
    for k in rate:
        secs = statistics.median(delivery) if k == "spark_source_delivery_window" else med[k]
        lines.append(f"| {k} | {secs:.2f} | {rate[k]:,.0f} |")
    lines += [
        "", f"SparkSource / toArrow: **{summary['source_vs_toArrow']:.2f}** end to end (the whole engine job, "
        "including starting 3 worker processes and connecting them), "
        f"**{summary['delivery_window_vs_toArrow']:.2f}** over the delivery window (first partition "
        "requested to last partition sent, timed by the driver's partition server). Target >= 0.5.", "",
        f"Word count of {args.words:,} words, checkpoints every 1 s: through Spark {med['wordcount_spark']:.2f}s, "
        f"plain file source {med['wordcount_file']:.2f}s (Spark start-up excluded, JVM warm).",
    ]
    with open(os.path.join(args.out, "spark.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
