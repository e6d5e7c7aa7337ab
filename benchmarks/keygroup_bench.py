"""The cost of key-group routing on word count's hot path, side by side in one run.

    python3 benchmarks/keygroup_bench.py [--words 2000000] [--repeat 5]

Routes the words of a Zipf corpus (batches of 4096, as a source emits them) to 2 channels
three ways: Python's ``hash(w) % n`` (what the engine did before key groups), the stable
key group of every word computed afresh, and what ``runtime/output.py`` does (the key
group of each distinct key remembered). Best of ``--repeat``. Then word count end to end at
parallelism 2 with ABS every second, the engine's own numbers to compare with
``benchmarks/results/wordcount.md``. Writes benchmarks/results/keygroups.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from abs_engine import keygroups  # noqa: E402
from abs_engine.testing import write_zipf_corpus  # noqa: E402
from benchmarks import workloads  # noqa: E402


def by_hash(batch: list[str], n: int, state: dict[Any, int]) -> None:
    parts: list[list[str]] = [[] for _ in range(n)]
    appends = [p.append for p in parts]
    for w in batch:
        appends[hash(w) % n](w)


def by_group(batch: list[str], n: int, state: dict[Any, int]) -> None:
    parts: list[list[str]] = [[] for _ in range(n)]
    appends = [p.append for p in parts]
    owner = state.setdefault("owner", keygroups.owners(128, n))  # type: ignore[call-overload]
    for w in batch:
        appends[owner[keygroups.key_group(w, 128)]](w)


def by_remembered_group(batch: list[str], n: int, state: dict[Any, int]) -> None:
    parts: list[list[str]] = [[] for _ in range(n)]
    appends = [p.append for p in parts]
    owner = keygroups.owners(128, n)
    get = state.get
    for w in batch:
        c = get(w)
        if c is None:
            c = state[w] = owner[keygroups.key_group(w, 128)]
        appends[c](w)


def best(fn: Callable[[list[str], int, dict[Any, int]], None], batches: list[list[str]], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        state: dict[Any, int] = {}
        t0 = time.perf_counter()
        for b in batches:
            fn(b, 2, state)
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--words", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="abs-kg-bench-")
    corpus = write_zipf_corpus(os.path.join(tmp, "in.txt"), args.words, seed=5)
    with open(corpus, encoding="utf-8") as f:
        words = f.read().split()
    batches = [words[i:i + 4096] for i in range(0, len(words), 4096)]
    micro = {name: best(fn, batches, args.repeat) for name, fn in
             [("hash", by_hash), ("key_group", by_group), ("key_group_remembered", by_remembered_group)]}
    out = os.path.join(tmp, "wc.tsv")
    t0 = time.perf_counter()
    workloads.wordcount(corpus, out, 2).run(checkpoint_interval=1.0)
    e2e = time.perf_counter() - t0
    summary = {"words": len(words), "routing_s": micro, "wordcount_p2_abs1s_s": e2e,
               "wordcount_p2_abs1s_mwords_per_s": len(words) / e2e / 1e6}
    with open(os.path.join(args.out, "keygroups.json"), "w") as f:
        json.dump(summary, f, indent=2)
    ns = {k: v / len(words) * 1e9 for k, v in micro.items()}
    lines = ["# Key-group routing on word count's hot path", "",
             f"`python3 benchmarks/keygroup_bench.py --words {args.words} --repeat {args.repeat}` (best of "
             f"{args.repeat}, {len(words):,} words in batches of 4096, 2 channels, one run).", "",
             "| routing | s | ns per word | vs hash() |", "|---|---|---|---|"]
    for k, v in micro.items():
        lines.append(f"| {k} | {v:.3f} | {ns[k]:.0f} | {v / micro['hash']:.2f}x |")
    lines += ["", f"Word count end to end (parallelism 2, ABS every 1 s): {e2e:.2f} s, "
              f"{summary['wordcount_p2_abs1s_mwords_per_s']:.2f} M words/s."]
    with open(os.path.join(args.out, "keygroups.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
