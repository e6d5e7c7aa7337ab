"""A Delta Lake table as an exactly-once sink (``deltalake``, delta-rs).

The rows a sink subtask receives between two barriers are epoch n; they are kept in the
checkpoint, and when checkpoint n completes they become **one Delta commit** that carries an
application transaction ``(app_id, n)`` (the Delta protocol's ``txn`` action, which is how
Spark's streaming sinks make their writes idempotent). A restore first reads the table's
transaction version for its ``app_id`` and commits only the epochs above it: an epoch whose
commit landed before a crash is never written again.

Invariants:
- An epoch's data files and the transaction version that says they are in are one atomic
  Delta commit: a crash leaves both or neither (at most unreferenced files, which VACUUM
  removes).
- ``app_id`` names the job, the sink, its subtask and the run: a run that starts afresh (not
  from a checkpoint) gets a new one, so its epochs are not mistaken for an earlier run's; a
  restored run keeps the one its checkpoint holds.
- Commits happen under the engine's fence (``ctx.guard()``): a process of an older attempt
  cannot commit once a newer one has started.
"""

from __future__ import annotations

import enum
import random
import secrets
import time
from typing import Any, Callable, Sequence

from abs_engine.errors import InputError

from .base import OperatorContext, Sink
from .record_errors import function_label

__all__ = ["DeltaProblem", "DeltaSink", "DeltaSinkError"]

#: Tries of one commit that conflicts with other subtasks' (then the task fails and restarts).
COMMIT_ATTEMPTS = 20


class DeltaProblem(enum.Enum):
    UNREACHABLE = "unreachable"
    SCHEMA_MISMATCH = "schema mismatch"


class DeltaSinkError(InputError):
    """The sink cannot write the table it was pointed at; retrying cannot help."""

    fatal = True

    def __init__(self, problem: DeltaProblem, message: str):
        super().__init__(message)
        self.problem = problem


class DeltaSink(Sink):
    """Rows into the Delta Lake table at ``uri`` (a local path, ``s3://...``, ...), exactly once.

    ``schema``: a ``pyarrow.Schema``; the table is created with it if it does not exist (with
    ``partition_by`` columns), and an existing table must have its fields. A record is a dict
    with the schema's names as keys, a tuple or list in the schema's order, or anything
    ``to_row`` turns into one of those.

    ``mode``: ``"append"``, or ``"merge"``: rows replace the table's rows with the same
    ``key`` columns and are inserted where there is none (a Delta MERGE); the last row of a key
    in an epoch wins, so send a key's rows through ``key_by``.

    ``storage_options``: passed to delta-rs (for S3: ``AWS_ENDPOINT_URL``, ``AWS_REGION``,
    credentials, ``AWS_ALLOW_HTTP``...).
    """

    preload = ("deltalake", "pyarrow")

    def __init__(self, uri: str, schema: Any, mode: str = "append", key: Sequence[str] = (),
                 to_row: Callable[[Any], Any] | None = None, partition_by: Sequence[str] = (),
                 storage_options: dict[str, str] | None = None):
        if mode not in ("append", "merge"):
            raise ValueError(f"mode must be 'append' or 'merge', got {mode!r}")
        if mode == "merge" and not key:
            raise ValueError("mode='merge' needs key=(the columns that identify a row)")
        names = list(schema.names)
        if not set(key) <= set(names) or not set(partition_by) <= set(names):
            raise ValueError(f"key {list(key)} and partition_by {list(partition_by)} must be among the schema's "
                             f"fields {names}")
        self.uri, self.schema, self.mode, self.key = uri, schema, mode, tuple(key)
        self.to_row, self.partition_by = to_row, list(partition_by)
        self.storage_options = dict(storage_options or {})
        self.buffer: list[Any] = []
        self.pending: list[tuple[int, list[Any]]] = []  #: (checkpoint id, rows) not yet committed
        self.run = ""  #: this run's part of the app_id (see the module docstring)

    def check(self) -> None:
        """The table exists with the schema's fields, or is created with them."""
        try:
            from deltalake import DeltaTable
            from deltalake.exceptions import TableNotFoundError
        except ImportError:
            raise DeltaSinkError(DeltaProblem.UNREACHABLE, "DeltaSink needs the deltalake package: pip install "
                                                           "'abs-engine[delta]' (or deltalake)") from None

        try:
            table = DeltaTable(self.uri, storage_options=self.storage_options or None)
        except TableNotFoundError:
            try:
                DeltaTable.create(self.uri, self.schema, partition_by=self.partition_by or None,
                                  storage_options=self.storage_options or None)
            except Exception as e:  # noqa: BLE001 - the store's own words, in our typed error
                raise DeltaSinkError(DeltaProblem.UNREACHABLE, f"cannot create Delta table {self.uri!r} ({e}): "
                                                               "fix the location or its storage_options") from None
            return
        except Exception as e:  # noqa: BLE001
            raise DeltaSinkError(DeltaProblem.UNREACHABLE, f"cannot open Delta table {self.uri!r} ({e}): fix the "
                                                           "location or its storage_options") from None
        have = set(table.schema().to_arrow().names)
        missing = [n for n in self.schema.names if n not in have]
        if missing:
            raise DeltaSinkError(DeltaProblem.SCHEMA_MISMATCH,
                                 f"Delta table {self.uri!r} has no field(s) {missing} (it has {sorted(have)}): fix "
                                 "the schema or the table")

    def outputs(self) -> list[str]:
        return [self.uri]

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self.run = secrets.token_hex(6)  # a restore replaces it with its checkpoint's

    def app_id(self) -> str:
        return f"abs-engine:{self.ctx.job}:{self.ctx.operator}:{self.ctx.subtask_index}:{self.run}"

    def process(self, batch: list[Any]) -> list[Any]:
        names = self.schema.names
        for record in batch:
            try:
                value = self.to_row(record) if self.to_row is not None else record
                row = value if isinstance(value, dict) else dict(zip(names, value, strict=True))
            except Exception as e:
                self.record_failed(record, function_label("to_row", self.to_row) if self.to_row is not None
                                   else f"sink {self.ctx.operator!r} (a record must be a row)", e)
                continue
            self.buffer.append(row)
        return []

    def snapshot(self, checkpoint_id: int) -> Any:
        if self.buffer:
            self.pending.append((checkpoint_id, self.buffer))
            self.buffer = []
        return {"run": self.run, "pending": [[cid, rows] for cid, rows in self.pending]}

    def restore(self, state: Any) -> None:
        self.run = str(state["run"])
        self.pending = [(int(cid), list(rows)) for cid, rows in state["pending"]]
        self.buffer = []
        self._commit(None)  # recover-and-commit: every epoch of a completed checkpoint

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._commit(checkpoint_id)

    def _commit(self, upto: int | None) -> None:
        """One Delta commit: the epochs up to ``upto`` (None: all) above the table's
        transaction version for this app_id, with the newest one's id as the version."""
        from deltalake.exceptions import CommitFailedError

        ready = [(cid, rows) for cid, rows in self.pending if upto is None or cid <= upto]
        if not ready:
            return
        self._step("before")
        for attempt in range(COMMIT_ATTEMPTS):
            try:
                with self.ctx.guard():
                    self._write(ready)
                break
            except CommitFailedError:
                # Another subtask committed first (concurrent MERGEs conflict in Delta's
                # optimistic concurrency): read the table again and redo, a while later.
                if attempt == COMMIT_ATTEMPTS - 1:
                    raise
                time.sleep(random.uniform(0.01, 0.05) * (attempt + 1))  # backoff between retries
        self._step("after")
        finished = {cid for cid, _ in ready}
        self.pending = [(cid, rows) for cid, rows in self.pending if cid not in finished]

    def _write(self, ready: list[tuple[int, list[Any]]]) -> None:
        """One Delta commit of the epochs of ``ready`` above the table's transaction version."""
        import pyarrow as pa
        from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

        table = DeltaTable(self.uri, storage_options=self.storage_options or None)
        app = self.app_id()
        done = table.transaction_version(app) or 0
        todo = [(cid, rows) for cid, rows in ready if cid > done]
        if not todo:
            return
        rows = [r for _, batch in todo for r in batch]
        if self.mode == "merge":
            last = {tuple(r[k] for k in self.key): r for r in rows}  # MERGE: one source row per key
            rows = list(last.values())
        data = pa.Table.from_pylist(rows, schema=self.schema)
        props = CommitProperties(app_transactions=[Transaction(app, max(cid for cid, _ in todo))])
        if self.mode == "append":
            write_deltalake(table, data, mode="append", commit_properties=props)
        else:
            on = " AND ".join(f"t.{k} = s.{k}" for k in self.key)
            (table.merge(data, on, source_alias="s", target_alias="t", commit_properties=props)
             .when_matched_update_all().when_not_matched_insert_all().execute())

    def _step(self, step: str) -> None:
        """A point of the commit (``before`` it, ``after`` it): a hook for tests that kill the
        worker there."""
