"""A PostgreSQL table as an exactly-once sink (psycopg 3).

The rows a sink subtask receives between two barriers are epoch n. They are kept in the
checkpoint (its snapshot holds every epoch not yet committed), and when checkpoint n
completes they are written in **one transaction** that also records, in a progress table,
that (job, sink, table, subtask) has committed up to checkpoint n. A restore commits the
epochs its checkpoint holds that the progress table does not: whatever a crash interrupted,
each epoch is in the table once. Rows are written with ``COPY`` (append), or ``COPY`` into a
temporary table and one ``INSERT ... ON CONFLICT`` (upsert).

Invariants:
- An epoch's rows and the progress row that says it is committed change in one transaction:
  both or neither.
- The progress row names its owner, the attempt that last opened the subtask. A commit locks
  that row (``FOR UPDATE``) and goes on only if it is still the owner. A newer attempt
  takes it over when it opens, so a process of an older attempt can never commit again
  (and a commit of it in flight finishes before the takeover, which reads what it wrote).
  The engine's own fence (``ctx.guard()``) is held around each commit too.
- A replayed epoch (its checkpoint id at or below the progress row's) is skipped, never
  written twice.
- Everything the driver can check before the job starts is checked there, with a typed
  error naming the fix: the server, the credentials, the table, its columns, and for
  upserts a unique index on the key.
"""

from __future__ import annotations

import secrets

import psycopg
from typing import Any, Callable, Sequence

from abs_engine.changes import Change

from . import postgres_schema, postgres_write
from .base import OperatorContext, Sink
from .postgres_schema import PostgresProblem, PostgresSinkError
from .record_errors import function_label

#: The progress table's columns: who wrote, to where, up to which checkpoint, and who owns it.
PROGRESS_DDL = """CREATE TABLE IF NOT EXISTS {progress} (
    job text NOT NULL, sink text NOT NULL, target text NOT NULL, subtask integer NOT NULL,
    checkpoint bigint NOT NULL, owner text NOT NULL, updated timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job, sink, target, subtask))"""

__all__ = ["PostgresProblem", "PostgresSink", "PostgresSinkError"]


class PostgresSink(Sink):
    """Rows into PostgreSQL table ``table`` (``"name"`` or ``"schema.name"``), exactly once.

    ``dsn``: a libpq connection string or URI (``"postgresql://user:pw@host:5432/db"``).
    ``columns``: the table's columns the rows fill, in order. A record is a tuple or list of
    that many values, a dict with those keys, or anything ``to_row`` turns into one of those.
    Values must be what a checkpoint can hold (str, int, float, bool, None, bytes, lists,
    dicts): give a timestamp as an ISO string, and PostgreSQL parses it.

    ``mode``: ``"append"`` (every row inserted) or ``"upsert"`` (``key``: the columns of a
    unique index; a row replaces the one with its key, the last of an epoch winning; send a
    key's rows to one subtask, with ``key_by``, so that their order is the stream's).

    In upsert mode a ``Change`` record (abs_engine.changes, from ``PostgresCDCSource``) is
    applied as such: a snapshot row, insert or update replaces the row of its key (an update
    that moved the key deletes the old one; one that left large TOASTed values unchanged sets
    only the columns it carries), a delete deletes it. A ``TRUNCATE`` change is refused (as a
    record error): it cannot be applied key by key. One sink writes one table: filter a
    source of several tables by ``Change.table`` before it.

    ``progress_table``: where the commits are recorded (created if missing). A job is known
    there by its dataflow's name: two jobs of one name must not write one table at once. A
    job that starts afresh (not from a checkpoint) appends again; empty the table first if
    that is not what you want. ``connect_timeout``: seconds to wait for a connection.
    A bad argument is a ValueError; check() raises PostgresSinkError before the job starts.
    """

    preload = ("psycopg",)

    def __init__(self, dsn: str, table: str, columns: Sequence[str], mode: str = "append",
                 key: Sequence[str] = (), to_row: Callable[[Any], Any] | None = None,
                 progress_table: str = "abs_engine_sink_progress", connect_timeout: float = 10.0):
        if mode not in ("append", "upsert"):
            raise ValueError(f"mode must be 'append' or 'upsert', got {mode!r}")
        if not columns:
            raise ValueError("columns must name at least one column of the table")
        if mode == "upsert" and not key:
            raise ValueError("mode='upsert' needs key=(the columns of a unique index)")
        if not set(key) <= set(columns):
            raise ValueError(f"key {list(key)} must be among the columns {list(columns)}")
        self.dsn, self.table, self.columns = dsn, table, tuple(columns)
        self.mode, self.key, self.to_row = mode, tuple(key), to_row
        self.progress_table, self.connect_timeout = progress_table, connect_timeout
        self.buffer: list[Any] = []  #: rows (lists), delete rows (one longer) and partial updates (dicts)
        self.restored_from: int | None = None  #: the checkpoint restored (None: none, or not known)
        self.pending: list[tuple[int, list[Any]]] = []  #: (checkpoint id, rows) not yet committed

    # ---- the driver -------------------------------------------------------------------------

    def check(self) -> None:
        """The server answers, the credentials work, the table has the columns (and, for an
        upsert, a unique index on the key); the progress table exists afterwards."""
        with self._connect() as conn:
            postgres_schema.check_target(conn, self.table, self.columns, self.key, self.mode)
            with conn.cursor() as cur:
                cur.execute(PROGRESS_DDL.format(progress=postgres_schema.quoted(conn, self.progress_table)))
            conn.commit()

    def outputs(self) -> list[str]:
        return [f"postgresql-table:{self._where()}/{self.table}"]

    # ---- a worker ---------------------------------------------------------------------------

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self.conn = self._connect(in_worker=True)
        self.progress = postgres_schema.quoted(self.conn, self.progress_table)
        self.target = postgres_schema.quoted(self.conn, self.table)
        self.owner = getattr(ctx.fence, "token", "") or secrets.token_hex(8)
        self.ident = (ctx.job, ctx.operator, self.table, ctx.subtask_index)
        # The takeover: from now on no older attempt of this subtask can commit. A fresh start
        # (no checkpoint) begins its count again; a restore keeps what was committed. Under the
        # engine's fence: a worker of an older attempt that gets here late cannot take the row
        # back (nor reset its count).
        with self.ctx.guard(), self.conn.cursor() as cur:
            cur.execute(f"INSERT INTO {self.progress} (job, sink, target, subtask, checkpoint, owner) "
                        "VALUES (%s, %s, %s, %s, 0, %s) ON CONFLICT (job, sink, target, subtask) DO UPDATE SET "
                        "owner = EXCLUDED.owner, updated = now()"
                        + ("" if ctx.restored else ", checkpoint = 0"), (*self.ident, self.owner))
        self.conn.commit()

    def process(self, batch: list[Any]) -> list[Any]:
        n = len(self.columns)
        for record in batch:
            try:
                value = self.to_row(record) if self.to_row is not None else record
                if isinstance(value, Change):
                    self.buffer.extend(postgres_write.change_rows(value, self.columns, self.key, self.mode))
                    continue
                row = [value[c] for c in self.columns] if isinstance(value, dict) else list(value)
                if len(row) != n:
                    raise ValueError(f"a row of {len(row)} values for the {n} columns {list(self.columns)}")
            except Exception as e:
                self.record_failed(record, function_label("to_row", self.to_row) if self.to_row is not None
                                   else f"sink {self.ctx.operator!r} (a record must be a row or a change)", e)
                continue
            self.buffer.append(row)
        return []

    def snapshot(self, checkpoint_id: int) -> Any:
        if self.buffer:
            self.pending.append((checkpoint_id, self.buffer))
            self.buffer = []
        return {"pending": [[cid, rows] for cid, rows in self.pending], "checkpoint": checkpoint_id}

    def restore(self, state: Any) -> None:
        self.pending = [(int(cid), [r if isinstance(r, dict) else list(r) for r in rows])
                        for cid, rows in state["pending"]]
        self.buffer = []
        self.restored_from = int(state["checkpoint"]) if "checkpoint" in state else None
        self._commit(None)  # recover-and-commit: every epoch of a completed checkpoint

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._commit(checkpoint_id)

    def close(self) -> None:
        conn = getattr(self, "conn", None)
        if conn is not None:
            conn.close()

    # ---- committing ---------------------------------------------------------------------------

    def _commit(self, upto: int | None) -> None:
        """One transaction: the epochs up to ``upto`` (None: all) that the progress row does
        not count yet, and the progress row moved past them."""
        ready = [(cid, rows) for cid, rows in self.pending if upto is None or cid <= upto]
        if not ready and upto is not None:
            return
        self._step("before")
        try:
            self._transaction(ready, restoring=upto is None)
        except (psycopg.DataError, psycopg.IntegrityError) as e:
            raise PostgresSinkError(PostgresProblem.REJECTED_ROW, postgres_write.rejected(self.table, ready, e)) from None
        self._step("after")
        done = {cid for cid, _ in ready}
        self.pending = [(cid, rows) for cid, rows in self.pending if cid not in done]

    def _transaction(self, ready: list[tuple[int, list[list[Any]]]], restoring: bool) -> None:
        with self.ctx.guard(), self.conn.transaction(), self.conn.cursor() as cur:
            committed = postgres_write.lock_progress(cur, self.progress, self.ident, self.owner)
            if restoring and self.restored_from is not None and committed > self.restored_from:
                raise PostgresSinkError(PostgresProblem.AHEAD_OF_CHECKPOINT, postgres_write.ahead(
                    self.table, self.ident, committed, self.restored_from))
            if not ready:
                return
            todo = [rows for cid, rows in ready if cid > committed]
            if todo:
                postgres_write.write(cur, self.target, self.columns, self.mode, self.key,
                                     [r for rows in todo for r in rows])
            last = max(cid for cid, _ in ready)
            if last > committed:
                cur.execute(f"UPDATE {self.progress} SET checkpoint = %s, updated = now() WHERE job = %s "
                            "AND sink = %s AND target = %s AND subtask = %s", (last, *self.ident))
            self._step("inside")

    def _step(self, step: str) -> None:
        """A point of the commit (``before`` the transaction, ``inside`` it before COMMIT,
        ``after`` it): a hook for tests that kill the worker there."""

    def _connect(self, in_worker: bool = False) -> Any:
        """In a worker a server that does not answer is an OSError the job restarts on (it
        may be restarting); in the driver, before the job starts, a fatal typed error."""
        return postgres_schema.connect(self.dsn, self.connect_timeout, self._where(), fatal=not in_worker)

    def _where(self) -> str:
        return postgres_schema.describe(self.dsn)
