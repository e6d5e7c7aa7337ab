"""Bank transfers round a cycle: the money in the system is conserved in every checkpoint.

    python examples/bank.py --accounts 100 --transfers 200000 --output balances.tsv

Accounts live as keyed state on the subtasks of ``accounts``. A transfer (from, to, amount)
first goes to the subtask that owns ``from``, which debits it and sends a credit back round
a feedback edge to the subtask that owns ``to`` (the seed documents' two-account walk-through,
generalised). Overdrafts are allowed, so the final balances do not depend on timing and
have an exact batch oracle. At every completed checkpoint, balances plus the credits logged
in flight on the back-edge equal the initial total (see ``conserved_total``).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from typing import Any

from abs_engine import Dataflow
from abs_engine.checkpoint.storage import CheckpointStorage
from operators import FileSink, Operator, OperatorContext, Source
from operators.generators import Progressions

try:
    from ._common import add_job_flags, read_int_pairs, run_job, verdict
except ImportError:  # run as a script
    from _common import add_job_flags, read_int_pairs, run_job, verdict  # type: ignore[no-redef,import-not-found]

INITIAL = 1_000


def transfers(accounts: int, count: int, seed: int) -> list[tuple[int, int, int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        a = rng.randrange(accounts)
        b = rng.randrange(accounts - 1)
        out.append((a, b if b < a else b + 1, rng.randint(1, 100)))
    return out


class TransferSource(Source[tuple[str, int, int, int]]):
    """Replayable: transfer j goes to source subtask j % p; the offset is what the subtask
    has left of them (arithmetic progressions of indices, which also lets it rescale)."""

    def __init__(self, accounts: int, count: int, seed: int, batch_size: int = 500):
        self.accounts, self.count, self.seed, self.batch_size = accounts, count, seed, batch_size

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self.all = transfers(self.accounts, self.count, self.seed)
        self.todo = Progressions.of_subtask(self.count, ctx.subtask_index, ctx.parallelism)

    def read_batch(self) -> list[tuple[str, int, int, int]] | None:
        r = self.todo.take(self.batch_size)
        if r is None:
            return None
        return [("debit", *self.all[j]) for j in r]

    def snapshot(self, checkpoint_id: int) -> Any:
        return self.todo.state()

    def restore(self, state: Any) -> None:
        self.todo = Progressions.from_state(self.count, state, self.ctx.parallelism, self.ctx.subtask_index)

    def rescale_state(self, old: list[Any], index: int, parallelism: int, owns: Any) -> Any:
        return Progressions.rescale(self.count, old, len(old), index, parallelism)


class Accounts(Operator):
    """Keyed by account. State: the balance of every account this subtask has touched
    (untouched accounts hold INITIAL). Emits credits into the loop and, at the end, balances."""

    def __init__(self, accounts: int):
        self.accounts = accounts
        self.balances: dict[int, int] = {}

    def process(self, batch: list[Any]) -> list[Any]:
        bal = self.balances
        out = []
        for rec in batch:
            if rec[0] == "debit":
                _, a, b, amt = rec
                bal[a] = bal.get(a, INITIAL) - amt
                out.append(("credit", b, amt))
            else:
                _, b, amt = rec
                bal[b] = bal.get(b, INITIAL) + amt
        return out

    def finish(self) -> list[Any]:
        mine = [a for a in range(self.accounts) if self.ctx.owns(a)]
        return [("balance", a, self.balances.get(a, INITIAL)) for a in mine]

    def snapshot(self, checkpoint_id: int) -> Any:
        return self.balances

    def restore(self, state: Any) -> None:
        self.balances = dict(state)

    def rescale_state(self, old: list[Any], index: int, parallelism: int, owns: Any) -> Any:
        """At another parallelism: the balances of the accounts this subtask now owns."""
        return {a: b for state in old if state for a, b in state.items() if owns(a)}


def is_credit(r: Any) -> bool:
    return bool(r[0] == "credit")


def is_balance(r: Any) -> bool:
    return bool(r[0] == "balance")


def account_of(r: Any) -> int:
    return int(r[1])


def fmt(r: Any) -> str:
    return f"{r[1]}\t{r[2]}"


def build_flow(accounts: int = 100, count: int = 100_000, seed: int = 0, output: str = "balances.tsv",
               parallelism: int = 2, source: Source[Any] | None = None) -> Dataflow:
    """``source``: the transfers (default: ``TransferSource(accounts, count, seed)``; a test
    passes it wrapped, e.g. held by a GatedSource)."""
    flow = Dataflow("bank", parallelism=parallelism)
    debits = flow.source(source or TransferSource(accounts, count, seed), name="transfers")
    credits = flow.feedback(name="credits")
    moves = debits.union(credits, name="merge").key_by(account_of).apply_keyed(Accounts(accounts), name="accounts")
    credits.connect(moves.filter(is_credit, name="in_flight"))
    moves.filter(is_balance, name="final").map(fmt, name="format").sink(FileSink(output), name="write", parallelism=1)
    return flow


def oracle(accounts: int, count: int, seed: int) -> dict[int, int]:
    bal = {a: INITIAL for a in range(accounts)}
    for a, b, amt in transfers(accounts, count, seed):
        bal[a] -= amt
        bal[b] += amt
    return bal


def conserved_total(storage: CheckpointStorage, checkpoint_id: int, accounts: int) -> int:
    """Money in one checkpoint: balances of every account (untouched ones hold INITIAL) plus
    the credits in flight round the loop at the cut: logged on the back-edges, and (an
    unaligned checkpoint) on the loop's other channels. The branch out of the loop (``final``)
    receives a copy of every record the accounts emit and drops the credits: its channel
    state is not money."""
    meta = storage.verify(checkpoint_id)
    accounts_tasks = [t for t in meta.tasks if t.startswith("accounts#")]
    touched: dict[int, int] = {}
    for t in accounts_tasks:
        touched.update(storage.read_state(checkpoint_id, t, meta)["accounts"])
    in_flight = 0
    for t in meta.tasks:
        if t.startswith("final#"):
            continue
        for records in storage.read_logs(checkpoint_id, t, meta).values():
            in_flight += sum(r[2] for r in records if r[0] == "credit")
    return sum(touched.values()) + INITIAL * (accounts - len(touched)) + in_flight


def read_output(path: str) -> dict[int, int]:
    return read_int_pairs(path, "account")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--accounts", type=int, default=100)
    ap.add_argument("--transfers", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", default="balances.tsv")
    add_job_flags(ap, interval=0.1)
    args = ap.parse_args(argv)
    if args.accounts < 2:
        ap.error("--accounts must be at least 2")
    t0 = time.perf_counter()
    res = run_job("bank", build_flow(args.accounts, args.transfers, args.seed, args.output, args.parallelism), args)
    if res is None:
        return 1
    got = read_output(args.output)
    print(f"\nbank: {args.transfers:,} transfers between {args.accounts} accounts in "
          f"{time.perf_counter() - t0:.2f}s; {len(res.checkpoints)} checkpoints; "
          f"total {sum(got.values()):,} (initial {INITIAL * args.accounts:,})")
    return verdict("bank", got == oracle(args.accounts, args.transfers, args.seed))


if __name__ == "__main__":
    sys.exit(main())
