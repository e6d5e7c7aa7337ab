"""Regenerate every benchmark result under benchmarks/results/ in one command.

    python benchmarks/run_all.py            # full: about 35 minutes on 2 cores
    python benchmarks/run_all.py --quick    # a check before a release: about 5 minutes
    python benchmarks/run_all.py --no-spark # without the Spark benchmark (no Java needed)

Runs, one after another (never side by side: they would share the 2 cores):
the ABS-vs-stop-the-world suite (suite.py), word count (wordcount_bench.py: rows, the
combiner, parallelism 1 and 2, the vectorized Arrow path), loops (loop_bench.py), Nexmark
q0-q8 against the plain loop, Bytewax and Flink per core (nexmark_bench.py), event-to-output
latency (latency_bench.py), rows into PostgreSQL (postgres_bench.py), Delta Lake and Iceberg
(table_sinks_bench.py), change data capture (cdc_bench.py), session-window checkpoints
(session_bench.py), Spark
(spark_bench.py) and the pytest-benchmark micro benchmarks. Every number on the
performance page (docs/performance.md) comes from one of them; each result file carries
the command that made it and its date.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-spark", action="store_true")
    args = ap.parse_args()
    py = sys.executable
    q = args.quick
    steps = [
        [py, "benchmarks/suite.py"] + (["--quick"] if q else []),
        [py, "benchmarks/wordcount_bench.py"] + (["--words", "2000000", "--rounds", "1"] if q else ["--rounds", "5"]),
        [py, "benchmarks/loop_bench.py"] + (["--numbers", "5000", "--rounds", "1"] if q else []),
        [py, "benchmarks/nexmark_bench.py"] + (["--events", "400000", "--repeat", "1"] if q else []),
        [py, "benchmarks/latency_bench.py"] + (["--rates", "20000,300000", "--seconds", "3", "--rounds", "1"] if q
                                                else ["--rates", "20000,100000,300000,600000,1000000", "--seconds",
                                                      "5", "--rounds", "2"]),
        [py, "benchmarks/latency_bench.py", "--half-max"] + (["--seconds", "2", "--rounds", "1"] if q
                                                             else ["--seconds", "5", "--rounds", "2"]),
        [py, "benchmarks/postgres_bench.py"] + (["--rows", "200000", "--rounds", "1"] if q else []),
        [py, "benchmarks/table_sinks_bench.py"] + (["--rows", "200000", "--rounds", "1"] if q else []),
        [py, "benchmarks/cdc_bench.py"] + (["--rows", "50000", "--rounds", "1", "--seconds", "3"] if q else []),
        [py, "benchmarks/session_bench.py"] + (["--events", "200000", "--rounds", "1"] if q else []),
    ]
    if not args.no_spark:
        steps.append([py, "benchmarks/spark_bench.py"]
                     + (["--rows", "1000000", "--words", "2000000", "--rounds", "1", "--skip-iterator"] if q else []))
    micro_json = os.path.join(HERE, "results", ".micro-raw.json")
    # (-n 0: one process; pytest-benchmark measures nothing under xdist's workers)
    steps.append([py, "-m", "pytest", "benchmarks/micro", "-q", "-n", "0", "-p", "no:cacheprovider",
                  "--benchmark-enable", f"--benchmark-json={micro_json}"])
    steps.append([py, "benchmarks/micro/test_micro.py", micro_json])
    for cmd in steps:
        t0 = time.monotonic()
        print(f"==> {' '.join(cmd[1:])}", flush=True)
        if subprocess.call(cmd, cwd=ROOT) != 0:
            print(f"FAILED: {' '.join(cmd)}", file=sys.stderr)
            return 1
        print(f"    ({time.monotonic() - t0:.0f}s)", flush=True)
    if os.path.exists(micro_json):
        os.remove(micro_json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
