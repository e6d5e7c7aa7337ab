"""Word count with TLS off and on (``tls=True``), side by side in one run.

    python3 benchmarks/tls_bench.py                          # 10M words, parallelism 2, 5 rounds
    python3 benchmarks/tls_bench.py --words 300000 --rounds 2 --out /tmp   # quick check

Rounds are interleaved (off, on, then on, off, ...) so machine noise hits both alike; the
report gives each variant's median, its runs, and the ratio of the medians. Every run
checkpoints every ``--interval`` seconds (ABS) on local workers; job time is from run() to
its return, so it includes start-up (with TLS: one certificate per attempt and one TLS
handshake per connection). Results: ``OUT/tls.{json,md}``.
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
from abs_engine.testing import write_zipf_corpus  # noqa: E402
from operators import FileSink, TextFileSource  # noqa: E402


def run(corpus: str, out: str, tls: bool, interval: float, parallelism: int) -> float:
    flow = Dataflow("wordcount", parallelism=parallelism)
    flow.source(TextFileSource(corpus)).flat_map(str.split).key_by().count_final().sink(FileSink(out), parallelism=1)
    t0 = time.perf_counter()
    flow.run(tls=tls, checkpoint_interval=interval)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--words", type=int, default=10_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between checkpoints")
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="abs-tls-bench-")
    corpus = write_zipf_corpus(os.path.join(tmp, "in.txt"), args.words, seed=11)
    times: dict[str, list[float]] = {"tls off": [], "tls on": []}
    run(corpus, os.path.join(tmp, "warm.tsv"), True, args.interval, args.parallelism)  # warm-up (imports)
    for r in range(args.rounds):
        order = [False, True] if r % 2 == 0 else [True, False]
        for tls in order:
            name = "tls on" if tls else "tls off"
            times[name].append(run(corpus, os.path.join(tmp, "o.tsv"), tls, args.interval, args.parallelism))
            print(f"round {r}: {name} {times[name][-1]:.2f}s", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in times.items()}
    summary = {"words": args.words, "rounds": args.rounds, "interval_s": args.interval,
               "parallelism": args.parallelism, "seconds": times, "median_s": med,
               "tls_overhead": med["tls on"] / med["tls off"] - 1}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "tls.json"), "w") as f:
        json.dump(summary, f, indent=2)
    lines = ["# Word count: TLS off vs on", "",
             f"`python3 benchmarks/tls_bench.py --words {args.words} --rounds {args.rounds} --interval {args.interval} "
             f"--parallelism {args.parallelism}`; local workers, ABS every {args.interval:g} s, rounds interleaved "
             "(order alternating), medians; job time from run() to its return (start-up included).", "",
             "| variant | median s | M words/s | runs |", "|---|---|---|---|"]
    for k, v in times.items():
        lines.append(f"| {k} | {med[k]:.2f} | {args.words / med[k] / 1e6:.2f} | {', '.join(f'{x:.2f}' for x in v)} |")
    lines += ["", f"TLS costs {summary['tls_overhead'] * 100:+.1f}% of the job time (ratio of the medians)."]
    with open(os.path.join(args.out, "tls.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
