"""An Apache Iceberg table as an exactly-once sink (``pyiceberg``).

Each checkpoint's rows (operators/epoch_sink.py) become, when it completes, **one Iceberg
commit** per sink subtask whose snapshot summary carries ``abs-engine.<app_id>`` = the
checkpoint id (RisingWave's Iceberg sink keeps its epoch there the same way). Before it
commits, a subtask looks through the table's snapshots for the newest id recorded under its
``app_id`` and leaves out every epoch at or below it: a commit that landed before a crash is
recognised and not made again.

Invariants:
- The rows and the summary entry are one snapshot (or one transaction of snapshots, for an
  upsert), swapped in atomically by the catalog: both or neither.
- ``app_id`` is EpochSink's: job, sink, subtask and run.
"""

from __future__ import annotations

import enum
from typing import Any, Callable, Sequence

from abs_engine.errors import InputError

from .epoch_sink import EpochSink

__all__ = ["IcebergProblem", "IcebergSink", "IcebergSinkError"]

PROPERTY = "abs-engine."  #: the snapshot summary key's prefix, before the app_id


class IcebergProblem(enum.Enum):
    """What an IcebergSinkError is about: the catalog or table cannot be opened or created
    (or the pyiceberg package is missing), or it lacks a field of the sink's schema."""

    UNREACHABLE = "unreachable"
    SCHEMA_MISMATCH = "schema mismatch"


class IcebergSinkError(InputError):
    """The sink cannot write the table it was pointed at; retrying cannot help. ``problem``
    (an IcebergProblem) says what, ``message`` names the table and the fix."""

    fatal = True

    def __init__(self, problem: IcebergProblem, message: str):
        super().__init__(message)
        self.problem = problem


class IcebergSink(EpochSink):
    """Rows into Iceberg table ``table`` (``"namespace.name"``) of the catalog that
    ``catalog`` describes, exactly once.

    ``catalog``: pyiceberg catalog properties, e.g. ``{"type": "sql", "uri":
    "sqlite:////data/catalog.db", "warehouse": "file:///data/warehouse"}``, or
    ``{"type": "rest", "uri": "https://..."}``, ``{"type": "glue"}`` (with the S3 properties
    its warehouse needs: ``s3.endpoint``, ``s3.region``...).

    ``schema``: a ``pyarrow.Schema``; the namespace and the table are created with it if
    missing, and an existing table must have its fields. A record is a dict, a tuple in the
    schema's order, or anything ``to_row`` turns into one of those.

    ``catalog_name``: the catalog's name (a SQL catalog keeps the tables of each name apart:
    use the name your other readers and writers use).

    ``mode``: ``"append"``, or ``"upsert"`` on ``key`` (pyiceberg's upsert: rows with a key
    already in the table replace it, the others are inserted; the last row of a key in an
    epoch wins, so send a key's rows through ``key_by``).
    """

    preload = ("pyiceberg", "pyarrow")

    def __init__(self, catalog: dict[str, str], table: str, schema: Any, mode: str = "append",
                 key: Sequence[str] = (), to_row: Callable[[Any], Any] | None = None, catalog_name: str = "default"):
        if mode not in ("append", "upsert"):
            raise ValueError(f"mode must be 'append' or 'upsert', got {mode!r}")
        if mode == "upsert" and not key:
            raise ValueError("mode='upsert' needs key=(the columns that identify a row)")
        if "." not in table:
            raise ValueError(f"table must be 'namespace.name', got {table!r}")
        names = list(schema.names)
        if not set(key) <= set(names):
            raise ValueError(f"key {list(key)} must be among the schema's fields {names}")
        super().__init__(names, to_row)
        self.catalog_properties, self.table, self.schema = dict(catalog), table, schema
        self.mode, self.key, self.catalog_name = mode, tuple(key), catalog_name

    def _catalog(self) -> Any:
        try:
            from pyiceberg.catalog import load_catalog
        except ImportError:
            raise IcebergSinkError(IcebergProblem.UNREACHABLE, "IcebergSink needs the pyiceberg package: pip "
                                                               "install 'abs-engine[iceberg]'") from None
        return load_catalog(self.catalog_name, **self.catalog_properties)

    def check(self) -> None:
        """The table exists with the schema's fields, or is created (with its namespace)."""
        try:
            catalog = self._catalog()
            catalog.create_namespace_if_not_exists(self.table.rsplit(".", 1)[0])
            table = catalog.create_table_if_not_exists(self.table, schema=self.schema)
        except IcebergSinkError:
            raise
        except Exception as e:  # noqa: BLE001 - the catalog's own words, in our typed error
            raise IcebergSinkError(IcebergProblem.UNREACHABLE, f"cannot open or create Iceberg table {self.table!r} "
                                                               f"({type(e).__name__}: {e}): fix the catalog "
                                                               "properties or the table name") from None
        have = set(table.schema().column_names)
        missing = [n for n in self.names if n not in have]
        if missing:
            raise IcebergSinkError(IcebergProblem.SCHEMA_MISMATCH,
                                   f"Iceberg table {self.table!r} has no field(s) {missing} (it has {sorted(have)}): "
                                   "fix the schema or the table")

    def outputs(self) -> list[str]:
        return [f"iceberg:{self.catalog_properties.get('uri', '')}/{self.table}"]

    def conflicts(self) -> tuple[type[BaseException], ...]:
        from pyiceberg.exceptions import CommitFailedException, ValidationException

        # Another subtask committed first: the catalog's swap failed, or (an upsert) its
        # validation found files added since the table was read. Read the table again.
        return (CommitFailedException, ValidationException)

    def committed(self, table: Any) -> int:
        """The newest checkpoint id a snapshot of ``table`` records for this app_id (0: none)."""
        key = PROPERTY + self.app_id()
        newest = 0
        for snap in table.snapshots():
            value = snap.summary.additional_properties.get(key) if snap.summary is not None else None
            if value is not None:
                newest = max(newest, int(value))
        return newest

    def recorded(self) -> int:
        return self.committed(self._catalog().load_table(self.table))

    def publish(self, epochs: list[tuple[int, list[Any]]]) -> None:
        table = self._catalog().load_table(self.table)
        done = self.committed(table)
        todo = [(cid, rows) for cid, rows in epochs if cid > done]
        if not todo:
            return
        items = [r for _, batch in todo for r in batch]
        data = self.to_arrow(items, self.schema, self.key if self.mode == "upsert" else ())
        props = {PROPERTY + self.app_id(): str(max(cid for cid, _ in todo))}
        if self.mode == "append":
            table.append(data, snapshot_properties=props)
        else:
            table.upsert(data, join_cols=list(self.key), snapshot_properties=props)
