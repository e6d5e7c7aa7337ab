"""Word-count throughput: abs-engine with ABS checkpoints vs without vs a plain Python loop.

    python benchmarks/wordcount_bench.py                 # 10M words, parallelism 2, 3 rounds
    python benchmarks/wordcount_bench.py --words 1000000 --rounds 1   # quick

The variants run interleaved (A B C, A B C, ...) so machine noise hits them alike; the
report gives medians and the spread, and ratios taken within the same run. A fourth
variant checkpoints ten times as often (interval / 10) to show the cost per checkpoint;
``engine_aligned_p1`` runs at parallelism 1 (does a second core help?), and
``engine_vectorized`` is the same word count on Arrow batches (ArrowTextSource ->
map_batches -> aggregate_batches; docs/dataflows.md, "Columnar batches") with ABS. CPU
seconds are those of the benchmark process and every process it waited for (driver and
workers), over the run. Peak memory is
the largest total RSS of the benchmark process and all its descendants (driver + workers),
sampled from /proc every 20 ms. Results: benchmarks/results/wordcount.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

from abs_engine import Dataflow
from abs_engine.testing import write_zipf_corpus
from operators import ArrowTextSource, FileSink, TextFileSource

HERE = os.path.dirname(os.path.abspath(__file__))


class PeakRss:
    """Samples the summed RSS of this process and its descendants."""

    def __init__(self, period: float = 0.02):
        self.period = period
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _tree_rss(self) -> int:
        me = os.getpid()
        parents: dict[int, int] = {}
        rss: dict[int, int] = {}
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    parents[int(pid)] = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{pid}/statm") as f:
                    rss[int(pid)] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            except (OSError, IndexError, ValueError):
                continue
        total, frontier = rss.get(me, 0), [me]
        while frontier:
            p = frontier.pop()
            for c, pp in parents.items():
                if pp == p:
                    total += rss.get(c, 0)
                    frontier.append(c)
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.peak = max(self.peak, self._tree_rss())

    def __enter__(self) -> "PeakRss":
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()


def cpu_seconds() -> float:
    """CPU seconds of this process and of every child it (or they) waited for."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def plain_python(path: str) -> int:
    counts: dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            for w in line.split():
                counts[w] = counts.get(w, 0) + 1
    return sum(counts.values())


def split_words(batch: Any) -> Any:
    """A batch of lines -> a batch of its words (str.split's words: no empty strings)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    words = pc.list_flatten(pc.utf8_split_whitespace(batch.column("line")))
    return pa.record_batch([words.filter(pc.not_equal(words, ""))], names=["word"])


def engine(path: str, out: str, parallelism: int, mode: str, interval: float,
           vectorized: bool = False) -> tuple[int, int]:
    flow = Dataflow("wordcount", parallelism=parallelism)
    if vectorized:
        flow.source(ArrowTextSource(path, batch_bytes=4 << 20)).map_batches(split_words).aggregate_batches(
            "word").sink(FileSink(out), parallelism=1)
    else:
        flow.source(TextFileSource(path)).flat_map(str.split).key_by().count_final().sink(FileSink(out),
                                                                                          parallelism=1)
    res = flow.run(mode=mode, checkpoint_interval=interval)
    total = 0
    with open(out, encoding="utf-8") as f:
        for line in f:
            total += int(line.rsplit("\t", 1)[1])
    return total, len([c for c in res.checkpoints if not c.final])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--words", type=int, default=10_000_000)
    ap.add_argument("--vocabulary", type=int, default=10_000)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()

    corpus = os.path.join(tempfile.gettempdir(), f"abs-engine-zipf-{args.words}-{args.vocabulary}.txt")
    if not os.path.exists(corpus):
        print(f"generating {corpus} ...", file=sys.stderr)
        write_zipf_corpus(corpus + ".tmp", args.words, args.vocabulary, seed=7)
        os.replace(corpus + ".tmp", corpus)
    out = os.path.join(tempfile.gettempdir(), "abs-engine-bench-out.tsv")

    variants = {
        "plain_python": lambda: (plain_python(corpus), 0),
        "engine_none": lambda: engine(corpus, out, args.parallelism, "none", args.interval),
        "engine_aligned": lambda: engine(corpus, out, args.parallelism, "aligned", args.interval),
        # Ten times more checkpoints than asked for, to show what a checkpoint costs.
        "engine_aligned_fast": lambda: engine(corpus, out, args.parallelism, "aligned", args.interval / 10),
        "engine_aligned_p1": lambda: engine(corpus, out, 1, "aligned", args.interval),
        "engine_vectorized": lambda: engine(corpus, out, args.parallelism, "aligned", args.interval, vectorized=True),
    }
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in variants}
    for r in range(args.rounds):
        for name, fn in variants.items():
            with PeakRss() as mem:
                c0 = cpu_seconds()
                t0 = time.perf_counter()
                words, checkpoints = fn()
                secs = time.perf_counter() - t0
                cpu = cpu_seconds() - c0
            if words != args.words:
                raise SystemExit(f"{name} counted {words} words, expected {args.words}: wrong output")
            runs[name].append({"seconds": secs, "words_per_s": words / secs, "peak_rss_mb": mem.peak / 2**20,
                               "checkpoints": checkpoints, "cpu_seconds": cpu})
            print(f"round {r + 1} {name:15} {secs:6.2f}s {words / secs / 1e6:6.2f} M words/s "
                  f"peak RSS {mem.peak / 2**20:6.0f} MiB checkpoints {checkpoints}", file=sys.stderr)

    def med(name: str, key: str) -> float:
        return statistics.median(x[key] for x in runs[name])

    overhead = [a["seconds"] / n["seconds"] - 1 for a, n in zip(runs["engine_aligned"], runs["engine_none"])]
    overhead_fast = [a["seconds"] / n["seconds"] - 1 for a, n in zip(runs["engine_aligned_fast"], runs["engine_none"])]
    summary = {
        "command": "python benchmarks/wordcount_bench.py " + " ".join(sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "params": vars(args) | {"out": None},
        "median_words_per_s": {k: med(k, "words_per_s") for k in runs},
        "median_peak_rss_mb": {k: med(k, "peak_rss_mb") for k in runs},
        "checkpoint_overhead_per_round": overhead,
        "checkpoint_overhead_median": statistics.median(overhead),
        "checkpoint_overhead_fast_median": statistics.median(overhead_fast),
        "engine_vs_plain_python": med("engine_aligned", "words_per_s") / med("plain_python", "words_per_s"),
        "engine_p2_vs_p1": med("engine_aligned", "words_per_s") / med("engine_aligned_p1", "words_per_s"),
        "vectorized_vs_plain_python": med("engine_vectorized", "words_per_s") / med("plain_python", "words_per_s"),
        "runs": runs,
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "wordcount.json"), "w") as f:
        json.dump(summary, f, indent=2)
    lines = [
        "# Word count benchmark",
        "",
        f"Command: `{summary['command']}`  ",
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}; {summary['when']}  ",
        f"{args.words:,} words (Zipf, {args.vocabulary:,}-word vocabulary), parallelism {args.parallelism}, "
        f"checkpoint interval {args.interval}s, {args.rounds} interleaved rounds (median, [min-max]).",
        "",
        "| variant | M words/s | seconds | CPU seconds | peak RSS (MiB, all processes) | checkpoints |",
        "|---|---|---|---|---|---|",
    ]
    for k in runs:
        w = [x["words_per_s"] / 1e6 for x in runs[k]]
        s = [x["seconds"] for x in runs[k]]
        lines.append(f"| {k} | {statistics.median(w):.2f} [{min(w):.2f}-{max(w):.2f}] | "
                     f"{statistics.median(s):.2f} | {med(k, 'cpu_seconds'):.2f} | {med(k, 'peak_rss_mb'):.0f} | "
                     f"{statistics.median(x['checkpoints'] for x in runs[k]):.0f} |")
    lines += [
        "",
        f"Checkpointing overhead (aligned vs none, same round): median {summary['checkpoint_overhead_median']:+.1%}, "
        f"per round {', '.join(f'{o:+.1%}' for o in overhead)}.  ",
        f"At a {args.interval / 10:g}s interval (engine_aligned_fast): median "
        f"{summary['checkpoint_overhead_fast_median']:+.1%}, per round {', '.join(f'{o:+.1%}' for o in overhead_fast)}.  ",
        f"Engine with checkpoints vs plain single-process Python loop: {summary['engine_vs_plain_python']:.2f}x; "
        f"parallelism {args.parallelism} vs 1: {summary['engine_p2_vs_p1']:.2f}x.  ",
        f"Vectorized (Arrow batches, parallelism {args.parallelism}, ABS) vs the plain loop: "
        f"{summary['vectorized_vs_plain_python']:.2f}x.",
    ]
    with open(os.path.join(args.out, "wordcount.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
