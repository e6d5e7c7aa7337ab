"""Word count with exactly-once checkpoints: the abs-engine demo.

    python examples/wordcount.py                       # generated 5M-word corpus, read through Spark
    python examples/wordcount.py --input big.txt --output counts.tsv --parallelism 2 --source file

Reads a text file (with ``--source spark`` also a directory of text files), splits each line on whitespace (str.split), counts per word, and writes
``word<TAB>count`` lines (one per distinct word, the final count). At the end it checks the
output against a plain single-process batch count and says whether they are equal.
Exit status 0 only when the job succeeded and the output is exact.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
from typing import Any

from abs_engine import AbsEngineError, Dataflow
from abs_engine.testing import write_zipf_corpus
from operators import FileSink, TextFileSource

try:
    from ._common import add_job_flags, executor_options, verdict
except ImportError:  # run as a script
    from _common import add_job_flags, executor_options, verdict  # type: ignore[no-redef,import-not-found]


def build_flow(input: str = "input.txt", output: str = "wordcount-out.tsv", parallelism: int = 2,
               source: str = "file") -> Dataflow:
    """``source="spark"`` reads the lines through Spark (a DataFrame of the text file),
    ``source="file"`` with the engine's own byte-offset file reader."""
    flow = Dataflow("wordcount", parallelism=parallelism)
    if source == "spark":
        from operators.spark import SparkSource

        reader: Any = SparkSource.text(input)
        reader.check()  # read the input now (this starts Spark), so the job's time is its own
    elif source == "file":
        reader = TextFileSource(input)
    else:
        raise ValueError(f"source must be 'spark' or 'file', got {source!r}")
    lines = flow.source(reader, name="read")
    words = lines.flat_map(str.split, name="split")
    counts = words.key_by().count_final(name="count")
    counts.sink(FileSink(output), name="write", parallelism=1)
    return flow


def input_files(path: str) -> list[str]:
    """The files the job reads: ``path`` itself, or (a directory, as ``--source spark``
    accepts) its files in name order, skipping the ones Spark skips (names starting with
    ``_`` or ``.``, such as ``_SUCCESS`` and ``.crc`` files)."""
    if not os.path.isdir(path):
        return [path]
    names = sorted(n for n in os.listdir(path) if not n.startswith(("_", ".")))
    return [os.path.join(path, n) for n in names if os.path.isfile(os.path.join(path, n))]


def batch_count(path: str) -> collections.Counter[str]:
    """The oracle: a plain batch computation over the same file (or directory of files)."""
    counts: collections.Counter[str] = collections.Counter()
    for name in input_files(path):
        with open(name, encoding="utf-8") as f:
            for line in f:
                counts.update(line.split())
    return counts


def read_output(path: str) -> collections.Counter[str]:
    out: collections.Counter[str] = collections.Counter()
    with open(path, encoding="utf-8") as f:
        for line in f:
            word, _, n = line.rstrip("\n").rpartition("\t")
            if word in out:
                raise ValueError(f"word {word!r} appears twice in the output")
            out[word] = int(n)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", help="text file to count (default: generate a Zipf corpus)")
    ap.add_argument("--words", type=int, default=5_000_000, help="size of the generated corpus")
    ap.add_argument("--output", default="wordcount-out.tsv")
    add_job_flags(ap, interval=0.25)
    ap.add_argument("--source", choices=["spark", "file"], default="spark",
                    help="read the input through Spark (default) or with the plain file reader")
    ap.add_argument("--resume", action="store_true", help="continue from the checkpoints in --checkpoint-dir")
    ap.add_argument("--no-verify", action="store_true", help="skip the comparison with a batch count")
    args = ap.parse_args(argv)

    if args.input is None:
        args.input = os.path.join(tempfile.gettempdir(), f"abs-engine-demo-{args.words}.txt")
        if not os.path.exists(args.input):
            print(f"generating a {args.words:,}-word Zipf corpus at {args.input} ...", file=sys.stderr)
            write_zipf_corpus(args.input + ".tmp", args.words, seed=42)
            os.replace(args.input + ".tmp", args.input)
    try:
        # A --spark-master session first: the Spark source's DataFrame must be made on it
        # (starting it later would stop the local session that DataFrame was made on).
        where = executor_options(args)
        t_build = time.perf_counter()
        flow = build_flow(args.input, args.output, args.parallelism, args.source)
        setup = time.perf_counter() - t_build  # includes starting Spark with --source spark
        print(flow.explain(), file=sys.stderr)
        t0 = time.perf_counter()
        result = flow.run(
            mode=args.mode,
            checkpoint_interval=args.checkpoint_interval,
            checkpoint_dir=args.checkpoint_dir,
            resume=args.resume,
            progress=True,
            **where,
        )
    except (AbsEngineError, ValueError) as e:
        print(f"wordcount: FAILED: {e}", file=sys.stderr)
        return 1
    elapsed = time.perf_counter() - t0
    if result.stopped_with_savepoint:
        print(f"\nwordcount: stopped with savepoint {result.savepoint} (its sinks committed); continue with "
              f"--restore-from {result.savepoint} and an empty --checkpoint-dir, at any --parallelism")
        return 0
    out = read_output(args.output)
    total = sum(out.values())
    # One clock: the job's own (duration_s), the one its progress lines count on.
    elapsed = result.duration_s or elapsed
    if args.resume or args.restore_from:
        # Resumed: this run did only part of the work; credit it with its own reading only.
        rate = f"resumed from checkpoint {result.restored_from[0]}, " if result.restored_from else "resumed, "
        rate += f"this run read {result.source_records:,} source records"
    else:
        rate = f"{total / elapsed / 1e6:.2f} M words/s"
    print(f"\nwordcount: {total:,} words, {len(out):,} distinct, in {elapsed:.2f}s "
          f"({rate}) with parallelism {args.parallelism}, mode {args.mode}, "
          f"source {args.source}" + (f" (+{setup:.1f}s to start Spark)" if args.source == "spark" else ""))
    ck = [c for c in result.checkpoints if not c.final]
    print(f"wordcount: {len(ck)} periodic checkpoint(s) + final commit; restarts: {result.restarts} "
          f"(workers lost: {result.workers_lost}); output: {args.output}")
    if args.no_verify:
        return 0
    return verdict("wordcount", batch_count(args.input) == out, "a plain batch count")


if __name__ == "__main__":
    sys.exit(main())
