"""Run a Nexmark query with exactly-once checkpoints and check its output against a plain
Python batch computation over the same generated events.

    python -m examples.nexmark q3 --events 200000 --output q3.jsonl --parallelism 2
    python -m examples.nexmark q5 --events 400000 --rate 10000

q0-q3 are stateless or keyed; q5, q7 and q8 are event-time windows (examples/nexmark/windowed.py).

Exit status 0 only when the job succeeded and its output equals the oracle's (as multisets).
"""

from __future__ import annotations

import argparse
import json
import sys

from operators import FileSink
from operators.nexmark import DEFAULT_RATE

from .._common import add_job_flags, run_job, verdict
from .queries import QUERIES, canonical


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("query", choices=sorted(QUERIES))
    ap.add_argument("--events", type=int, default=200_000, help="Nexmark events to generate (default %(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate", type=int, default=DEFAULT_RATE,
                    help="events per second of event time (default %(default)s): q5's windows are 10 s")
    ap.add_argument("--output", default="nexmark-out.jsonl", help="where the results go, one JSON array a line")
    add_job_flags(ap, interval=1.0)
    args = ap.parse_args(argv)
    build, oracle = QUERIES[args.query]
    if args.rate <= 0:
        ap.error(f"--rate must be > 0, got {args.rate}")
    flow = build(args.events, FileSink(args.output, format="jsonl"), args.parallelism, args.seed, rate=args.rate)
    res = run_job(f"nexmark {args.query}", flow, args)
    if res is None:
        return 1
    with open(args.output, encoding="utf-8") as f:
        got = [json.loads(line) for line in f]
    print(f"nexmark {args.query}: {len(got):,} results from {args.events:,} events, "
          f"{res.checkpoints_completed} checkpoints, {res.restarts} restarts")
    return verdict(f"nexmark {args.query}", canonical(got) == canonical(oracle(args.events, args.seed, rate=args.rate)))


if __name__ == "__main__":
    sys.exit(main())
