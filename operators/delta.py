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
from typing import Any, Callable, Sequence

from abs_engine.errors import InputError

from .epoch_sink import EpochSink

__all__ = ["DeltaProblem", "DeltaSink", "DeltaSinkError"]


class DeltaProblem(enum.Enum):
    """What a DeltaSinkError is about: the table cannot be opened or created (or the
    deltalake package is missing), or it lacks a column of the sink's schema."""

    UNREACHABLE = "unreachable"
    SCHEMA_MISMATCH = "schema mismatch"


class DeltaSinkError(InputError):
    """The sink cannot write the table it was pointed at; retrying cannot help. ``problem``
    (a DeltaProblem) says what, ``message`` names the table and the fix."""

    fatal = True

    def __init__(self, problem: DeltaProblem, message: str):
        super().__init__(message)
        self.problem = problem


class DeltaSink(EpochSink):
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
        super().__init__(names, to_row)
        self.uri, self.schema, self.mode, self.key = uri, schema, mode, tuple(key)
        self.partition_by = list(partition_by)
        self.storage_options = dict(storage_options or {})

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

    def conflicts(self) -> tuple[type[BaseException], ...]:
        from deltalake.exceptions import CommitFailedError

        return (CommitFailedError,)  # concurrent MERGEs of two subtasks conflict (optimistic concurrency)

    def recorded(self) -> int:
        from deltalake import DeltaTable

        return DeltaTable(self.uri, storage_options=self.storage_options or None).transaction_version(
            self.app_id()) or 0

    def publish(self, epochs: list[tuple[int, list[Any]]]) -> None:
        """One Delta commit of the epochs above the table's transaction version for our
        app_id, carrying the newest one's id as the version."""
        from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

        table = DeltaTable(self.uri, storage_options=self.storage_options or None)
        app = self.app_id()
        done = table.transaction_version(app) or 0
        todo = [(cid, rows) for cid, rows in epochs if cid > done]
        if not todo:
            return
        items = [r for _, batch in todo for r in batch]
        data = self.to_arrow(items, self.schema, self.key if self.mode == "merge" else ())
        props = CommitProperties(app_transactions=[Transaction(app, max(cid for cid, _ in todo))])
        if self.mode == "append":
            write_deltalake(table, data, mode="append", commit_properties=props)
        else:
            on = " AND ".join(f't."{k}" = s."{k}"' for k in self.key)  # (quoted: any column name)
            (table.merge(data, on, source_alias="s", target_alias="t", commit_properties=props)
             .when_matched_update_all().when_not_matched_insert_all().execute())
