"""Incremental checkpoints against full ones, side by side in one run.

    python3 benchmarks/incremental_bench.py            # full: 1M/5M-key states, pipeline 4M records
    python3 benchmarks/incremental_bench.py --quick    # a check: 100k keys, pipeline 400k records

1. Bytes a checkpoint writes after k of 1M keys changed (k = 0 .. 100k), full vs
   incremental: the real Count operator, runtime/increments.py and the real encoder.
2. The task thread's share of a snapshot (Increments.prepare + the encoder's start) at 1k,
   100k, 1M and 5M keys with 1% of the keys changed: full inline, full forked, incremental.
3. Restore of 1M keys: read + verify + decode + restore a full file, and a chain of a full
   file and 8 deltas of 10k keys each (storage.load_task_snapshot + Count.restore).
4. The pipeline (benchmarks/workloads.py, 2M-key first stage): no checkpoints, ABS at 1 s
   and 0.1 s with full snapshots and incremental ones (both encoded inline); word count
   with and without change tracking. Rounds interleaved, medians.
Writes benchmarks/results/incremental.{json,md} and plots/incremental_{bytes,sync_time}.png.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from abs_engine.checkpoint.incremental import ChainRef  # noqa: E402
from abs_engine.checkpoint.safe_io import load_task_snapshot
from abs_engine.checkpoint.safe_io import write_state_file  # noqa: E402
from abs_engine.checkpoint import snapshot_file  # noqa: E402
from abs_engine.runtime import snapshot_encoding  # noqa: E402
from abs_engine.runtime.increments import Increments  # noqa: E402
from benchmarks import plots, workloads  # noqa: E402
from operators.keyed import Count  # noqa: E402


class Task:
    """One task's snapshot path without processes: Count, Increments, the encoder, a file."""

    def __init__(self, root: str, incremental: bool, encoding: str = "inline"):
        self.root, self.encoding = root, encoding
        self.op = Count()
        self.inc = Increments([("count", self.op)], incremental)

    def snapshot(self, cid: int) -> tuple[float, bytes, int]:
        """(task-thread ms, file bytes, base) of snapshot ``cid``; the file is written."""
        t0 = time.perf_counter()
        states = {"count": self.op.snapshot(cid)}
        base, deltas, entries = self.inc.prepare(cid, states)
        enc = snapshot_encoding.start(states, self.encoding, entries)
        sync_ms = (time.perf_counter() - t0) * 1000
        blob = snapshot_file.encode("count#0", cid, enc.result(), {}, False, base, deltas)
        write_state_file(self.root, cid, "count#0.state", blob)
        return sync_ms, blob, base


def bytes_vs_changes(keys: int, ks: list[int], tmp: str) -> dict[str, dict[int, int]]:
    out: dict[str, dict[int, int]] = {"full": {}, "incremental": {}}
    rng = random.Random(1)
    for variant in out:
        root = tempfile.mkdtemp(dir=tmp)
        task = Task(root, variant == "incremental")
        task.op.process(list(range(keys)))
        task.snapshot(1)
        task.inc.completed(1)
        for cid, k in enumerate(ks, start=2):
            task.op.process(rng.sample(range(keys), k) if k else [])
            _, blob, _ = task.snapshot(cid)
            task.inc.completed(cid)
            out[variant][k] = len(blob)
        shutil.rmtree(root)
    return out


def sync_times(sizes: list[int], repeat: int, tmp: str) -> dict[int, dict[str, float]]:
    res: dict[int, dict[str, float]] = {}
    for n in sizes:
        row: dict[str, list[float]] = {"full inline": [], "full fork": [], "incremental inline": [],
                                       "incremental fork": []}
        for variant in row:
            root = tempfile.mkdtemp(dir=tmp)
            task = Task(root, variant.startswith("incremental"), variant.split()[1])
            task.op.process([f"w{i}" for i in range(n)])
            task.snapshot(1)
            task.inc.completed(1)
            changed = [f"w{i}" for i in range(0, n, 100)]  # 1% of the keys
            for r in range(repeat):
                task.op.process(changed)
                ms, _, _ = task.snapshot(2 + r)
                task.inc.completed(2 + r)
                row[variant].append(ms)
            shutil.rmtree(root)
        res[n] = {k: statistics.median(v) for k, v in row.items()}
        print(f"{n:>9,} keys: {res[n]}", file=sys.stderr)
    return res


def restore_times(keys: int, repeat: int, tmp: str) -> dict[str, float]:
    root = tempfile.mkdtemp(dir=tmp)
    task = Task(root, True)
    task.op.process([f"w{i}" for i in range(keys)])
    files = []
    rng = random.Random(2)
    for cid in range(1, 10):  # a full file, then 8 deltas of 10k keys
        if cid > 1:
            task.op.process([f"w{i}" for i in rng.sample(range(keys), 10_000)])
        _, blob, base = task.snapshot(cid)
        files.append(ChainRef(cid, "count#0.state", len(blob), hashlib.sha256(blob).hexdigest()))
        task.inc.completed(cid)
    assert base == 8, base  # the last file is a delta on the one before: a chain of 8 deltas
    out: dict[str, list[float]] = {"full file": [], "full + 8 deltas": []}
    for _ in range(repeat):
        for label, chain, top in (("full file", [], files[0]), ("full + 8 deltas", files[:-1], files[-1])):
            t0 = time.perf_counter()
            snap = load_task_snapshot(root, top.checkpoint_id, top.file, top.size, top.sha256, chain)
            op = Count()
            op.restore(snap.states["count"])
            out[label].append(time.perf_counter() - t0)
            assert len(op.state) == keys
    shutil.rmtree(root)
    return {k: statistics.median(v) for k, v in out.items()}


CHECKPOINTS: dict[str, list[int]] = {}  #: variant -> checkpoints completed per run


def pipeline_run(records: int, interval: float | None, incremental: bool, tmp: str) -> tuple[float, int]:
    out = os.path.join(tmp, "gaps.json")
    workloads.cleanup(out)
    flow = workloads.pipeline(records, out, 2)
    t0 = time.perf_counter()
    # Encoded inline in every variant: "auto" forks or not by the load average of the moment,
    # which made runs of one variant differ by a third (benchmarks/results/async_snapshots.md).
    res = flow.run(mode="none" if interval is None else "aligned", checkpoint_interval=interval or 1.0,
                   incremental_checkpoints=incremental, snapshot_encoding="inline")
    return time.perf_counter() - t0, res.checkpoints_completed


def wordcount_run(corpus: str, incremental: bool, tmp: str) -> tuple[float, int]:
    out = os.path.join(tmp, "wc.tsv")
    workloads.cleanup(out)
    t0 = time.perf_counter()
    res = workloads.wordcount(corpus, out, 2).run(checkpoint_interval=1.0, incremental_checkpoints=incremental)
    return time.perf_counter() - t0, res.checkpoints_completed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--tiny", action="store_true", help="smallest inputs: a smoke test of the script")
    ap.add_argument("--jobs-only", action="store_true",
                    help="measure only the jobs (4.); keep parts 1-3 from the last incremental.json")
    args = ap.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="abs-incremental-bench-")
    keys = 100_000 if args.quick else 1_000_000
    ks = [0, 10, 100, 1_000, 10_000] + ([] if args.quick else [100_000])
    sizes = [1_000, 100_000] if args.quick else [1_000, 100_000, 1_000_000, 5_000_000]
    records = 400_000 if args.quick else 4_000_000
    words = 1_000_000 if args.quick else 10_000_000
    if args.tiny:
        keys, ks, sizes, records, words = 20_000, [0, 10, 100], [1_000, 20_000], 20_000, 50_000

    if args.jobs_only:
        with open(os.path.join(args.out, "incremental.json")) as f:
            last = json.load(f)
        nbytes = {v: {int(k): n for k, n in d.items()} for v, d in last["bytes"].items()}
        sync = {int(k): v for k, v in last["sync_ms"].items()}
        restore = last["restore_s"]
    else:
        nbytes = bytes_vs_changes(keys, ks, tmp)
        print(f"bytes: {nbytes}", file=sys.stderr)
        sync = sync_times(sizes, args.repeat, tmp)
        restore = restore_times(keys, args.repeat, tmp)
    print(f"restore of {keys:,} keys: {restore}", file=sys.stderr)

    from abs_engine.testing import write_zipf_corpus

    corpus = os.path.join(tmp, "corpus.txt")
    write_zipf_corpus(corpus, words, 10_000, seed=7)
    variants = {"none": lambda: pipeline_run(records, None, False, tmp),
                "ABS 1s, full": lambda: pipeline_run(records, 1.0, False, tmp),
                "ABS 1s, incremental": lambda: pipeline_run(records, 1.0, True, tmp),
                "ABS 0.1s, full": lambda: pipeline_run(records, 0.1, False, tmp),
                "ABS 0.1s, incremental": lambda: pipeline_run(records, 0.1, True, tmp),
                "wordcount ABS 1s": lambda: wordcount_run(corpus, False, tmp),
                "wordcount ABS 1s, incremental": lambda: wordcount_run(corpus, True, tmp)}
    times: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(args.rounds):
        for name in (list(variants) if r % 2 == 0 else list(reversed(variants))):
            seconds, completed = variants[name]()
            times[name].append(seconds)
            CHECKPOINTS.setdefault(name, []).append(completed)
            print(f"round {r}: {name} {seconds:.2f}s, {completed} checkpoints", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in times.items()}
    overhead = {k: med[k] / med["none"] - 1 for k in med if k.startswith("ABS")}
    wc_ratio = med["wordcount ABS 1s, incremental"] / med["wordcount ABS 1s"]
    shutil.rmtree(tmp, ignore_errors=True)

    summary = {"keys": keys, "bytes": nbytes, "sync_ms": {str(k): v for k, v in sync.items()},
               "restore_s": restore, "pipeline_records": records, "seconds": times, "median_s": med,
               "overhead": overhead, "checkpoints": CHECKPOINTS, "wordcount_words": words, "wordcount_ratio": wc_ratio,
               "rounds": args.rounds, "repeat": args.repeat}
    os.makedirs(os.path.join(args.out, "plots"), exist_ok=True)
    with open(os.path.join(args.out, "incremental.json"), "w") as f:
        json.dump(summary, f, indent=2)
    cmd = ("python3 benchmarks/incremental_bench.py" + (" --quick" if args.quick else "")
           + (f" --rounds {args.rounds}" if args.rounds != 3 else "") + (" --jobs-only" if args.jobs_only else ""))
    lines = ["# Incremental checkpoints vs full ones", "",
             f"`{cmd}` (repeat {args.repeat}, rounds {args.rounds}, 2-core machine)."
             + (" Parts 1-3 (bytes, task-thread time, restore) are those of the full run before it; "
                "`--jobs-only` measured the jobs." if args.jobs_only else ""), "",
             f"## Bytes one checkpoint writes after k of {keys:,} keys changed (one task)", "",
             "| keys changed | full | incremental | ratio |", "|---|---|---|---|"]
    for k in ks:
        full, inc = nbytes["full"][k], nbytes["incremental"][k]
        lines.append(f"| {k:,} | {full:,} | {inc:,} | {inc / full:.4f} |")
    lines += ["", "## The task thread's share of a snapshot, 1% of the keys changed (median ms)", "",
              "| keys | full inline | full fork | incremental inline | incremental fork |", "|---|---|---|---|---|"]
    for n, row in sync.items():
        lines.append(f"| {n:,} | {row['full inline']:.1f} | {row['full fork']:.1f} | "
                     f"{row['incremental inline']:.1f} | {row['incremental fork']:.1f} |")
    lines += ["", f"## Restore of {keys:,} keys (read, verify, decode, restore; median s)", "",
              "| files | seconds |", "|---|---|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in restore.items()]
    lines += ["", f"## The pipeline ({records:,} records, {records // 2:,}-key first stage) and word count "
              f"({words:,} words); medians", "",
              "| variant | median s | overhead vs none | checkpoints (median) | runs |", "|---|---|---|---|---|"]
    for k, v in times.items():
        ov = f"{overhead[k] * 100:+.1f}%" if k in overhead else ""
        lines.append(f"| {k} | {med[k]:.2f} | {ov} | {statistics.median(CHECKPOINTS[k]):g} | "
                     f"{', '.join(f'{x:.2f}' for x in v)} |")
    lines += ["", f"Word count with change tracking / without: {wc_ratio:.3f}", "",
              "![bytes per checkpoint](plots/incremental_bytes.png)",
              "![task-thread time of a snapshot](plots/incremental_sync_time.png)"]
    with open(os.path.join(args.out, "incremental.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    plots.loglog(os.path.join(args.out, "plots", "incremental_bytes.png"), [max(k, 1) for k in ks],
                 [("full", [nbytes["full"][k] for k in ks], "o-"),
                  ("incremental", [nbytes["incremental"][k] for k in ks], "s-")],
                 f"keys changed since the last checkpoint (of {keys:,}; 0 plotted at 1)",
                 "bytes written by the checkpoint")
    ns = list(sync)
    plots.loglog(os.path.join(args.out, "plots", "incremental_sync_time.png"), ns,
                 [(v, [max(sync[n][v], 0.01) for n in ns], style)
                  for v, style in (("full inline", "o-"), ("full fork", "s-"), ("incremental inline", "^-"),
                                   ("incremental fork", "v--"))],
                 "keys in the state (1% changed since the last checkpoint)", "task-thread ms per snapshot",
                 (10, "10 ms"))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
