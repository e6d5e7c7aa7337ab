"""Collatz step counts: an iterative computation on a cyclic dataflow.

    python examples/collatz.py --numbers 20000 --output collatz.tsv

Every number 1..N enters a loop as (start, current, steps); each trip round the loop applies
one Collatz step (n/2 or 3n+1) behind a hash exchange keyed by the current value; a record
leaves the loop when it reaches 1, so records go round a data-dependent number of times
(up to a few hundred). The output is ``start<TAB>steps`` per number, checked against a
plain batch computation. The job ends by itself once a checkpoint proves the loop drained.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from abs_engine import Dataflow
from operators import FileSink, Operator, RangeSource

try:
    from ._common import add_job_flags, read_int_pairs, run_job, verdict
except ImportError:  # run as a script
    from _common import add_job_flags, read_int_pairs, run_job, verdict  # type: ignore[no-redef,import-not-found]


class CollatzStep(Operator):
    """One step per record; counts, as keyed state, how many trajectories visit each value
    this subtask owns (so the loop carries real state through checkpoints)."""

    def __init__(self) -> None:
        self.visits: dict[int, int] = {}

    def process(self, batch: list[Any]) -> list[Any]:
        out: list[tuple[Any, ...]] = []
        visits = self.visits
        for start, n, steps in batch:
            visits[n] = visits.get(n, 0) + 1
            if n == 1:
                out.append(("done", start, steps))
            else:
                out.append(("more", start, n // 2 if n % 2 == 0 else 3 * n + 1, steps + 1))
        return out

    def snapshot(self, checkpoint_id: int) -> Any:
        return self.visits

    def restore(self, state: Any) -> None:
        self.visits = dict(state)


def is_more(r: Any) -> bool:
    return bool(r[0] == "more")


def is_done(r: Any) -> bool:
    return bool(r[0] == "done")


def strip_tag(r: Any) -> Any:
    return (r[1], r[2], r[3])


def fmt(r: Any) -> str:
    return f"{r[1]}\t{r[2]}"


def build_flow(numbers: int = 10_000, output: str = "collatz.tsv", parallelism: int = 2) -> Dataflow:
    flow = Dataflow("collatz", parallelism=parallelism)
    seeds = flow.source(RangeSource(1, numbers + 1), name="numbers").map(lambda n: (n, n, 0), name="seed")
    loop = flow.feedback(name="loop")
    stepped = seeds.union(loop, name="merge").key_by(lambda r: r[1]).apply_keyed(CollatzStep(), name="step")
    loop.connect(stepped.filter(is_more, name="unfinished").map(strip_tag, name="again"))
    stepped.filter(is_done, name="finished").map(fmt, name="format").sink(FileSink(output), name="write",
                                                                             parallelism=1)
    return flow


def collatz_steps(n: int) -> int:
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


def oracle(numbers: int) -> dict[int, int]:
    return {n: collatz_steps(n) for n in range(1, numbers + 1)}


def read_output(path: str) -> dict[int, int]:
    return read_int_pairs(path, "number")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--numbers", type=int, default=20_000)
    ap.add_argument("--output", default="collatz.tsv")
    add_job_flags(ap, interval=0.25)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    res = run_job("collatz", build_flow(args.numbers, args.output, args.parallelism), args)
    if res is None:
        return 1
    got = read_output(args.output)
    total_steps = sum(got.values())
    print(f"\ncollatz: {len(got):,} numbers, {total_steps:,} trips round the loop in "
          f"{time.perf_counter() - t0:.2f}s; {len(res.checkpoints)} checkpoints")
    return verdict("collatz", got == oracle(args.numbers))


if __name__ == "__main__":
    sys.exit(main())
