"""Word count on the Spark executor (workers in a barrier stage on local-cluster[2,1,1024],
two executor JVMs) against the embedded local executor at the same parallelism, side by
side in one run, rounds interleaved; Spark's start-up is reported separately.

    python3 benchmarks/spark_executor_bench.py [--words 10000000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from abs_engine import Dataflow  # noqa: E402
from abs_engine.spark_session import session_for  # noqa: E402
from abs_engine.testing import write_zipf_corpus  # noqa: E402
from operators import FileSink, TextFileSource  # noqa: E402


def run(corpus: str, out: str, executor: str, spark: object, interval: float | None) -> tuple[float, float]:
    """(seconds end to end, seconds of steady state) of one word count."""
    flow = Dataflow("wordcount", parallelism=2)
    flow.source(TextFileSource(corpus)).flat_map(str.split).key_by().count_final().sink(FileSink(out), parallelism=1)
    opts: dict[str, object] = {"mode": "none"} if interval is None else {"checkpoint_interval": interval}
    if executor == "spark":
        opts["spark"] = spark
    t0 = time.perf_counter()
    res = flow.run(executor=executor, **opts)
    return time.perf_counter() - t0, res.duration_s - res.running_after_s


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--words", type=int, default=10_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="abs-spark-bench-")
    corpus = write_zipf_corpus(os.path.join(tmp, "in.txt"), args.words, seed=9)
    t0 = time.perf_counter()
    spark = session_for("local-cluster[2,1,1024]")
    from abs_engine.executors.spark import SparkLauncher

    SparkLauncher(spark)._await_slots(2)
    startup = time.perf_counter() - t0
    variants = [("local", None), ("local", 1.0), ("spark", None), ("spark", 1.0)]
    times: dict[str, list[float]] = {f"{e}/{'none' if i is None else 'abs-1s'}": [] for e, i in variants}
    steady: dict[str, list[float]] = {k: [] for k in times}
    run(corpus, os.path.join(tmp, "warm.tsv"), "spark", spark, None)  # warm-up (first stage, zip shipped)
    run(corpus, os.path.join(tmp, "warm.tsv"), "local", spark, None)
    for r in range(args.rounds):
        for e, i in (variants if r % 2 == 0 else list(reversed(variants))):
            name = f"{e}/{'none' if i is None else 'abs-1s'}"
            total, run_s = run(corpus, os.path.join(tmp, "o.tsv"), e, spark, i)
            times[name].append(total)
            steady[name].append(run_s)
            print(f"round {r}: {name} {total:.2f}s (steady {run_s:.2f}s)", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in times.items()}
    smed = {k: statistics.median(v) for k, v in steady.items()}
    summary = {"words": args.words, "rounds": args.rounds, "spark_startup_s": startup, "seconds": times,
               "steady_seconds": steady, "median_s": med, "steady_median_s": smed,
               "spark_vs_local_throughput": med["local/none"] / med["spark/none"],
               "spark_vs_local_steady_throughput": smed["local/none"] / smed["spark/none"],
               "abs_overhead_spark": med["spark/abs-1s"] / med["spark/none"] - 1,
               "abs_overhead_spark_steady": smed["spark/abs-1s"] / smed["spark/none"] - 1,
               "abs_overhead_local": med["local/abs-1s"] / med["local/none"] - 1}
    with open(os.path.join(args.out, "spark_executor.json"), "w") as f:
        json.dump(summary, f, indent=2)
    lines = ["# Word count: Spark executor (local-cluster[2,1,1024]) vs embedded local executor", "",
             f"`python3 benchmarks/spark_executor_bench.py --words {args.words} --rounds {args.rounds}`; parallelism 2 "
             "on the 2-core machine, rounds interleaved (order alternating), medians. *End to end*: run() to its "
             "return. *Steady*: the job's duration minus its start-up (`JobResult.running_after_s`: until every "
             f"task is running; on Spark that includes launching the barrier stage). Spark's own start-up "
             f"({startup:.1f} s, until the executors registered) is excluded from both.", "",
             "| variant | end to end s | M words/s | steady s | steady M words/s | end-to-end runs |",
             "|---|---|---|---|---|---|"]
    for k, v in times.items():
        lines.append(f"| {k} | {med[k]:.2f} | {args.words / med[k] / 1e6:.2f} | {smed[k]:.2f} | "
                     f"{args.words / smed[k] / 1e6:.2f} | {', '.join(f'{x:.2f}' for x in v)} |")
    lines += ["", f"Spark executor throughput vs embedded: {summary['spark_vs_local_steady_throughput']:.2f}x "
              f"in the steady state, {summary['spark_vs_local_throughput']:.2f}x end to end. "
              f"ABS every 1 s costs {summary['abs_overhead_spark_steady'] * 100:+.1f}% on Spark in the steady state "
              f"({summary['abs_overhead_spark'] * 100:+.1f}% end to end), "
              f"{summary['abs_overhead_local'] * 100:+.1f}% locally end to end."]
    with open(os.path.join(args.out, "spark_executor.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    os._exit(0)


if __name__ == "__main__":
    main()
