"""A worked example of connectors of your own (docs/writing-connectors.md): a replayable
source and an exactly-once sink, in about a hundred lines, and a job that proves them.

    python examples/custom_connectors.py                    # 200k orders, two workers killed
    python examples/custom_connectors.py --orders 50000 --kills 0

``JsonLinesSource`` reads orders from a JSON-lines file; its offset is the byte position of
the next line. ``SqliteSink`` writes totals per customer into a SQLite table, exactly once:
each checkpoint's rows wait in the checkpoint, and when it completes they are written in one
transaction with a progress row saying which checkpoint this sink subtask has committed. The
job keeps a running total of order amounts per customer and appends a row per order (the
customer and its total so far), so that a row written twice or lost would show; workers are
SIGKILLed at checkpoints, and at the end the table is compared with a plain batch
computation. Exit status 0 only when they are equal.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import sqlite3
import sys
import tempfile
from typing import Any

from abs_engine import Dataflow
from abs_engine.testing import KillOnCheckpoints
from operators.base import OperatorContext, Sink, Source


class JsonLinesSource(Source[dict[str, Any]]):
    """The JSON objects of a file, one per line. Offset: the byte position of the next line.
    Parallelism 1 (a sharded source would give each subtask its byte range)."""

    def __init__(self, path: str, batch_lines: int = 1000):
        self.path, self.batch_lines = os.path.abspath(path), batch_lines

    def check(self) -> None:  # in the driver, before anything starts
        if not os.path.isfile(self.path):
            from abs_engine.errors import InputError

            raise InputError(f"input {self.path!r} does not exist: generate it or fix the path")

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self.file = open(self.path, "rb")
        self.offset = 0

    def read_batch(self) -> list[dict[str, Any]] | None:
        self.file.seek(self.offset)
        lines = [line for _, line in zip(range(self.batch_lines), self.file)]
        if not lines:
            return None  # end of input
        self.offset += sum(len(line) for line in lines)
        return [json.loads(line) for line in lines]

    def snapshot(self, checkpoint_id: int) -> Any:
        return self.offset  # everything before it has been emitted

    def restore(self, state: Any) -> None:
        self.offset = int(state)  # replay from there

    def close(self) -> None:
        self.file.close()


class SqliteSink(Sink):
    """``(customer, total)`` rows appended to table ``totals`` of a SQLite file, exactly once."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        self.buffer: list[list[Any]] = []
        self.pending: list[tuple[int, list[list[Any]]]] = []  # (checkpoint id, rows) not committed yet

    def check(self) -> None:
        with sqlite3.connect(self.path) as db:
            db.execute("CREATE TABLE IF NOT EXISTS totals (customer TEXT, total INTEGER)")
            db.execute("CREATE TABLE IF NOT EXISTS progress (sink TEXT, subtask INTEGER, checkpoint INTEGER, "
                       "PRIMARY KEY (sink, subtask))")

    def outputs(self) -> list[str]:
        return [self.path]

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self.db = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        if not ctx.restored:  # a fresh start counts its checkpoints from 1 again
            self.db.execute("INSERT OR REPLACE INTO progress VALUES (?, ?, 0)", (ctx.operator, ctx.subtask_index))

    def process(self, batch: list[Any]) -> list[Any]:
        self.buffer.extend([customer, total] for customer, total in batch)  # held, never written here
        return []

    def snapshot(self, checkpoint_id: int) -> Any:
        if self.buffer:  # the rows since the last barrier are this checkpoint's epoch
            self.pending.append((checkpoint_id, self.buffer))
            self.buffer = []
        return [[cid, rows] for cid, rows in self.pending]  # msgpack data: lists, ints, strs

    def restore(self, state: Any) -> None:
        self.pending = [(int(cid), [list(r) for r in rows]) for cid, rows in state]
        self.commit(None)  # the restored checkpoint completed: its epochs may be published

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.commit(checkpoint_id)

    def commit(self, upto: int | None) -> None:
        ready = [(cid, rows) for cid, rows in self.pending if upto is None or cid <= upto]
        if not ready:
            return
        with self.ctx.guard():  # a process of an older attempt fails here instead of writing
            self.db.execute("BEGIN IMMEDIATE")
            try:
                (done,) = self.db.execute("SELECT checkpoint FROM progress WHERE sink = ? AND subtask = ?",
                                          (self.ctx.operator, self.ctx.subtask_index)).fetchone()
                for cid, rows in ready:
                    if cid > done:  # an epoch committed before a crash is skipped
                        self.db.executemany("INSERT INTO totals VALUES (?, ?)", rows)
                self.db.execute("UPDATE progress SET checkpoint = MAX(checkpoint, ?) WHERE sink = ? AND subtask = ?",
                                (max(cid for cid, _ in ready), self.ctx.operator, self.ctx.subtask_index))
                self.db.execute("COMMIT")  # the rows and the progress row: both or neither
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
        finished = {cid for cid, _ in ready}
        self.pending = [(cid, rows) for cid, rows in self.pending if cid not in finished]

    def close(self) -> None:
        if hasattr(self, "db"):
            self.db.close()


def write_orders(path: str, n: int, customers: int = 500, seed: int = 1) -> None:
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"order": i, "customer": f"c{rng.randrange(customers)}",
                                "amount": rng.randrange(1, 100)}) + "\n")


def add(a: tuple[str, int], b: tuple[str, int]) -> tuple[str, int]:
    return b[0], a[1] + b[1]


def build_flow(orders: str, database: str, parallelism: int = 2) -> Dataflow:
    flow = Dataflow("custom-connectors", parallelism=parallelism)
    (flow.source(JsonLinesSource(orders), "orders", parallelism=1)
     # (at the source's parallelism, chained to it: a customer's orders stay in the file's
     # order up to the running total, which the oracle's rows depend on)
     .map(lambda o: (o["customer"], o["amount"]), "amounts", parallelism=1)
     .key_by(lambda ca: ca[0]).reduce(add, "totals")     # running total: (customer, (customer, total))
     .map(lambda kv: kv[1], "rows")                       # -> (customer, total): one row per order
     .sink(SqliteSink(database), "sqlite"))
    return flow


def oracle(orders: str) -> collections.Counter[tuple[str, int]]:
    """Every (customer, running total) row the job should write, computed in one plain loop."""
    totals: collections.Counter[str] = collections.Counter()
    rows: collections.Counter[tuple[str, int]] = collections.Counter()
    with open(orders) as f:
        for line in f:
            o = json.loads(line)
            totals[o["customer"]] += o["amount"]
            rows[(o["customer"], totals[o["customer"]])] += 1
    return rows


def table(database: str) -> collections.Counter[tuple[str, int]]:
    with sqlite3.connect(database) as db:
        return collections.Counter(db.execute("SELECT customer, total FROM totals").fetchall())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--orders", type=int, default=200_000)
    ap.add_argument("--kills", type=int, default=2, help="workers SIGKILLed, one after each of the first checkpoints")
    ap.add_argument("--dir", default=None, help="where the input, the database and the checkpoints go")
    args = ap.parse_args(argv)
    where = args.dir or tempfile.mkdtemp(prefix="abs-custom-")
    orders, database = os.path.join(where, "orders.jsonl"), os.path.join(where, "totals.db")
    write_orders(orders, args.orders)
    chaos = KillOnCheckpoints(range(2, 2 + 2 * args.kills, 2), seed=3) if args.kills else None
    res = build_flow(orders, database).run(checkpoint_dir=os.path.join(where, "ck"), checkpoint_interval=0.1,
                                           chaos=chaos)
    exact = table(database) == oracle(orders)
    print(f"{args.orders:,} orders, {res.restarts} restart(s), {res.checkpoints_completed} checkpoints: "
          f"the table {'equals' if exact else 'DIFFERS FROM'} the batch computation")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
