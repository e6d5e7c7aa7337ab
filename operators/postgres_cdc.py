"""PostgreSQL tables as a replayable stream of changes: a consistent snapshot of the tables,
then change data capture from a logical replication slot (``pgoutput``).

The driver creates the slot with an exported snapshot and stages the tables as they were at
the slot's consistent point (operators/postgres_slot.py), once per job: a crash after that
reads the same snapshot again. The source's subtask then emits the staged rows as
``SNAPSHOT`` changes and streams every transaction committed after the consistent point as
``INSERT``, ``UPDATE``, ``DELETE`` and ``TRUNCATE`` changes (abs_engine/changes.py).

Its offset in every checkpoint is (staged chunk, row) during the snapshot, then (LSN, n):
the end of the last transaction emitted whole and the changes already emitted of the next.
The slot is told a position is safe only when a checkpoint holding it completes, so a
restore from the newest completed checkpoint always finds the changes after its offset.

Invariants:
- A change is emitted once per checkpointed run: the stream restarts at the offset's LSN and
  skips the transactions that end at or before it and the first n changes of the next.
- A slot that was dropped, or moved past the offset restored (an older checkpoint, another
  reader), is a PostgresSourceError naming it, never a silent gap.
- One subtask reads a slot (a slot is one ordered stream): ``max_subtasks = 1``.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any, Sequence

import msgpack
import psycopg
from psycopg import sql

from abs_engine import fs
from abs_engine.changes import Change, ChangeKind
from abs_engine.errors import InputError

from . import pgoutput, postgres_cdc_checks, postgres_schema, postgres_slot
from .base import OperatorContext, Source
from .progress import SourceProgress
from .postgres_schema import PostgresProblem, PostgresSourceError
from .postgres_slot import CHUNK_ROWS, Manifest, TableShape

__all__ = ["Change", "ChangeKind", "PostgresCDCSource", "PostgresSourceError", "stop_stream"]

IDLE_WAIT = 0.02  #: seconds a read waits for the stream when nothing has arrived
STOP_PREFIX = "abs-engine.stop"  #: a logical message with this prefix and the slot's name ends the source
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def stop_stream(dsn: str, slot: str) -> str:
    """End the source reading ``slot`` of the server ``dsn`` at this point of the stream: it
    emits every change committed before the marker this writes (everything committed before
    the call, and perhaps some committed during it), then finishes (the job ends when its
    other sources have). Returns the marker's LSN. Used to drain a job, and by the tests.

    The slot must exist (the job has started): a marker written before it would never be
    read, so its absence is PostgresSourceError(SLOT_DROPPED)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if postgres_slot.slot_position(conn, slot) is None:
            raise PostgresSourceError(PostgresProblem.SLOT_DROPPED, (
                f"there is no replication slot {slot!r} at {postgres_schema.describe(dsn)}: the job has not created it "
                "yet (wait until it runs) or it was dropped; a stop marker now would never be read"))
        row = conn.execute("SELECT pg_logical_emit_message(true, %s, %s)::text", (STOP_PREFIX, slot)).fetchone()
    return str(row[0]) if row else ""


class PostgresCDCSource(Source[Change]):
    """The rows of ``tables`` (``"name"`` or ``"schema.name"``) of the server ``dsn`` (a libpq
    string or URI) and then every change made to them, as ``Change`` records, exactly once.

    ``slot``: the logical replication slot this source creates and owns (lowercase letters,
    digits and ``_``); ``staging_dir``: where the initial snapshot is staged (a local
    directory or an object store URI), the job's own. ``publication``: an existing
    publication of the tables, or None to create one named like the slot. ``batch_size``:
    the most rows or changes a batch holds; ``connect_timeout``: seconds to wait for a
    connection. A bad name is a ValueError.

    The server needs ``wal_level = logical``, a user with the REPLICATION attribute, and a
    primary key (or ``REPLICA IDENTITY FULL``) on each table. The stream has no end:
    ``stop_stream(dsn, slot)`` ends it at a point of your choosing. To start afresh, drop
    the slot and empty the staging location.
    """

    max_subtasks = 1
    preload = ("psycopg",)

    def __init__(self, dsn: str, tables: Sequence[str], slot: str, staging_dir: str | os.PathLike[str],
                 publication: str | None = None, connect_timeout: float = 10.0, batch_size: int = 4096):
        if isinstance(tables, str) or not tables:
            raise ValueError("tables must name at least one table (a list of names)")
        for what, name in (("slot", slot), ("publication", publication or slot)):
            if not _NAME.fullmatch(name):
                raise ValueError(f"{what} {name!r} must be 1 to 63 of a-z, 0-9 and _, not starting with a digit")
        self.dsn, self.tables, self.slot = dsn, tuple(tables), slot
        self.publication, self.owns_publication = publication or slot, publication is None
        location = os.fspath(staging_dir)
        self.staging = location if fs.is_remote(location) else fs.local_path(location)
        self.connect_timeout, self.batch_size = connect_timeout, batch_size
        self._dir: fs.Directory | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_dir", "_stream")} | {"_dir": None}

    def _staged(self) -> fs.Directory:
        if self._dir is None:
            self._dir = fs.open_dir(self.staging, private=True)
        return self._dir

    def _where(self) -> str:
        return postgres_schema.describe(self.dsn)

    def _connect(self, fatal: bool = True) -> psycopg.Connection[Any]:
        return postgres_schema.connect(self.dsn, self.connect_timeout, self._where(), fatal=fatal,
                                       error=PostgresSourceError)

    # ---- the driver ---------------------------------------------------------------------

    def check(self) -> None:
        """The server, the credentials, logical WAL, the replication privilege, the tables
        and their replica identity, the publication (created if it is the source's own)."""
        with self._connect() as conn:
            postgres_cdc_checks.check_source(conn, self.tables, self.publication, self.owns_publication,
                                             self._where())

    def driver_start(self) -> None:
        """Stage the snapshot and create the slot, unless this staging location holds them."""
        staged = self._staged()
        staged.make_root()
        with self._connect() as conn:
            position = postgres_slot.slot_position(conn, self.slot)
            manifest = self._manifest()
            if manifest is not None:
                if manifest.slot != self.slot:
                    raise PostgresSourceError(PostgresProblem.CORRUPT_STAGING, (
                        f"{staged.show()} holds the snapshot of slot {manifest.slot!r}, not {self.slot!r}: give "
                        "each source a staging location of its own"))
                if position is None:
                    raise PostgresSourceError(PostgresProblem.SLOT_DROPPED,
                                              postgres_slot.dropped(self.slot, self._where(), manifest.lsn))
                names = sorted(t.table for t in manifest.tables)
                wanted = sorted(postgres_cdc_checks.resolved(conn, self.tables))
                if names != wanted:
                    raise PostgresSourceError(PostgresProblem.CORRUPT_STAGING, (
                        f"{staged.show()} holds a snapshot of {names}, and this source reads {wanted}: to read other "
                        "tables start afresh (a new slot and staging location)"))
                return
            if position is not None:
                if not self._made_here():
                    raise PostgresSourceError(PostgresProblem.SLOT_EXISTS, (
                        f"replication slot {self.slot!r} already exists at {self._where()} and this source did not "
                        f"create it in {staged.show()}: choose another slot name, or drop it (SELECT "
                        f"pg_drop_replication_slot('{self.slot}')) if nothing needs it"))
                postgres_slot.drop_slot(conn, self.slot)  # ours, made by a run that died staging
        postgres_slot.create_and_stage(self.dsn, self.connect_timeout, self._where(), self.slot, self.tables, staged)

    def _made_here(self) -> bool:
        try:
            return self._staged().read((postgres_slot.CREATING,), 256).decode(errors="replace") == self.slot
        except FileNotFoundError:
            return False

    def _manifest(self) -> Manifest | None:
        staged = self._staged()
        try:
            data = staged.read((postgres_slot.MANIFEST,), 64 << 20)
        except FileNotFoundError:
            return None
        except fs.TooLarge as e:
            raise PostgresSourceError(PostgresProblem.CORRUPT_STAGING,
                                      f"{staged.show(postgres_slot.MANIFEST)} holds {e}: refused unread") from None
        return Manifest.unpack(data, staged.show(postgres_slot.MANIFEST))

    # ---- the worker ---------------------------------------------------------------------

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        if ctx.parallelism != 1:
            raise InputError(f"source {ctx.operator!r}: a replication slot is one ordered stream, read by one "
                             f"subtask, not {ctx.parallelism}: give the source parallelism=1")
        manifest = self._manifest()
        if manifest is None:
            raise PostgresSourceError(PostgresProblem.CORRUPT_STAGING, (
                f"{self._staged().show(postgres_slot.MANIFEST)} is missing: the staged snapshot was removed while "
                "the job ran; start afresh (drop the slot, empty the staging location)"))
        self.manifest = manifest
        self._shapes = {t.table: t for t in manifest.tables}
        self.chunk, self.row, self.lsn, self.skip = 0, 0, manifest.lsn, 0
        self.rows: list[list[Any]] | None = None  #: the chunk being read
        self._stream: postgres_slot.Stream | None = None
        self._relations: dict[int, pgoutput.Relation] = {}
        self._txn: tuple[int, float] | None = None  #: (commit LSN, time) of the transaction being read
        self._seen = 0  #: changes of that transaction passed (emitted or skipped)
        self._drop_txn = False  #: it ended before the offset: emitted whole already
        self._stopping = self._stopped = False
        self._offsets: dict[int, int] = {}  #: checkpoint id -> its LSN
        self._confirmed = 0
        self._chunks_gone = False

    def read_batch(self) -> list[Change] | None:
        if self.chunk < len(self.manifest.chunks):
            return self._read_snapshot()
        if self._stopped:
            return None
        return self._read_stream()

    def _read_snapshot(self) -> list[Change]:
        name, index = self.manifest.chunks[self.chunk]
        if self.rows is None:
            staged = self._staged()
            try:
                data = staged.read((name,), postgres_slot.MAX_CHUNK_BYTES)
                self.rows = msgpack.unpackb(data, raw=False)
            except FileNotFoundError:
                raise PostgresSourceError(PostgresProblem.CORRUPT_STAGING, (
                    f"staged snapshot chunk {staged.show(name)} is missing (removed, or this restores a checkpoint "
                    "from before the stream moved on): restore the newest checkpoint, or start afresh")) from None
            except (fs.TooLarge, ValueError, msgpack.UnpackException) as e:
                raise PostgresSourceError(PostgresProblem.CORRUPT_STAGING,
                                          f"staged snapshot chunk {staged.show(name)} is unreadable ({e})") from None
            if not isinstance(self.rows, list) or len(self.rows) > CHUNK_ROWS:
                raise PostgresSourceError(PostgresProblem.CORRUPT_STAGING,
                                          f"staged snapshot chunk {staged.show(name)} is not a chunk of rows")
        shape = self.manifest.tables[index]
        rows = self.rows[self.row:self.row + self.batch_size]
        out = [_snapshot_change(shape, r) for r in rows]
        self.row += len(rows)
        if self.row >= len(self.rows):
            self.chunk, self.row, self.rows = self.chunk + 1, 0, None
        return out

    def _open_stream(self) -> postgres_slot.Stream:
        with self._connect(fatal=False) as conn:
            position = postgres_slot.slot_position(conn, self.slot)
        if position is None:
            raise PostgresSourceError(PostgresProblem.SLOT_DROPPED, postgres_slot.dropped(self.slot, self._where(),
                                                                                         self.lsn))
        if position > self.lsn:
            raise PostgresSourceError(PostgresProblem.SLOT_AHEAD,
                                      postgres_slot.ahead(self.slot, self._where(), position, self.lsn))
        stream = postgres_slot.Stream(self.dsn, self.connect_timeout, self._where(), self.slot, self.publication,
                                      self.lsn)
        if self._confirmed:
            stream.confirm(self._confirmed)
        return stream

    def _read_stream(self) -> list[Change]:
        if self._stream is None:
            self._stream = self._open_stream()
        stream = self._stream
        out: list[Change] = []
        try:
            messages = stream.poll(IDLE_WAIT, self.batch_size)
            for m in messages:
                if isinstance(m, pgoutput.Keepalive):
                    if self._txn is None and self.skip == 0 and not self._stopping:
                        self.lsn = max(self.lsn, m.end)  # everything committed before m.end has come
                    if m.reply:
                        stream.confirm(self._confirmed)
                    continue
                self._decode(m.data, out)
                if self._stopped:
                    break
        except pgoutput.ProtocolViolation as e:
            raise PostgresSourceError(PostgresProblem.PROTOCOL, f"slot {self.slot!r}: {e}") from None
        return out

    def _decode(self, data: bytes, out: list[Change]) -> None:
        m = pgoutput.message(data, self._relation)
        if isinstance(m, pgoutput.Relation):
            self._relations[m.oid] = m
        elif isinstance(m, pgoutput.Begin):
            self._txn, self._seen = (m.final_lsn, m.committed), 0
            self._drop_txn = m.final_lsn < self.lsn  # (its end is past its commit record's start)
        elif isinstance(m, pgoutput.Commit):
            self._txn = None
            if not self._drop_txn:
                self.lsn, self.skip = max(self.lsn, m.end_lsn), 0
            if self._stopping:
                self._stopped = True
        elif isinstance(m, pgoutput.LogicalMessage):
            if m.prefix == STOP_PREFIX and m.content == self.slot.encode() and not self._drop_txn:
                self._stopping = True
        elif m is not None:
            changes = self._changes(m)
            for c in changes:
                self._seen += 1
                if self._drop_txn or self._seen <= self.skip:
                    continue
                out.append(c)
                self.skip = self._seen

    def _relation(self, oid: int) -> pgoutput.Relation:
        try:
            return self._relations[oid]
        except KeyError:
            raise pgoutput.ProtocolViolation(f"a change of relation {oid}, which the stream never described") from None

    def _changes(self, m: pgoutput.RowChange | pgoutput.Truncate) -> list[Change]:
        """The changes of ``m`` to the tables this source reads (a publication may cover more:
        the others are passed over, every time alike)."""
        lsn, committed = self._txn if self._txn is not None else (0, None)
        if isinstance(m, pgoutput.Truncate):
            return [Change(ChangeKind.TRUNCATE, t, None, {}, None, lsn, committed)
                    for t in (self._relation(oid).table for oid in m.relations) if t in self._shapes]
        rel = self._relation(m.relation)
        shape = self._shapes.get(rel.table)
        if shape is None:
            return []
        old = dict(zip(rel.columns, m.old)) if m.old is not None else None
        new = dict(zip(rel.columns, m.new)) if m.new is not None else None
        if new is not None:
            for c, v in list(new.items()):
                if v is pgoutput.UNCHANGED:  # an unchanged TOASTed value: from the old row, or left out
                    if old is not None and not m.old_is_key and old.get(c) is not pgoutput.UNCHANGED:
                        new[c] = old[c]
                    else:
                        del new[c]
        basis = old if old is not None else new or {}
        key = {c: basis.get(c) for c in shape.key}  # (the primary key, also under REPLICA IDENTITY FULL)
        before = {c: v for c, v in old.items() if not m.old_is_key or c in rel.key} if old is not None else None
        kind = {"insert": ChangeKind.INSERT, "update": ChangeKind.UPDATE, "delete": ChangeKind.DELETE}[m.kind]
        if kind is ChangeKind.UPDATE and new is not None and any(new.get(c, v) != v for c, v in key.items()):
            # The key moved: a delete of the old key and an insert of the new row, each keyed
            # by its own key, so that a stream keyed by ``key`` keeps every key's order.
            return [Change(ChangeKind.DELETE, rel.table, None, key, before, lsn, committed),
                    Change(ChangeKind.INSERT, rel.table, new, {c: new.get(c) for c in shape.key}, None, lsn,
                           committed)]
        return [Change(kind, rel.table, new, key, before, lsn, committed)]

    def snapshot(self, checkpoint_id: int) -> Any:
        self._offsets[checkpoint_id] = self.lsn
        return {"chunk": self.chunk, "row": self.row, "lsn": self.lsn, "skip": self.skip}

    def restore(self, state: Any) -> None:
        self.chunk, self.row = int(state["chunk"]), int(state["row"])
        self.lsn, self.skip = int(state["lsn"]), int(state["skip"])
        self.rows = None

    def progress(self) -> SourceProgress:
        chunks = len(self.manifest.chunks)
        if self.chunk < chunks:  # the snapshot: its staged chunks are the input
            return SourceProgress(chunks - self.chunk, chunks, "chunks", f"snapshot chunk {self.chunk}, row {self.row:,}")
        return SourceProgress(None, None, "changes", f"LSN {pgoutput.lsn_text(self.lsn)}"
                                                     + (f" + {self.skip} changes" if self.skip else ""))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        done = [c for c in self._offsets if c <= checkpoint_id]
        if not done:
            return
        lsn = max(self._offsets[c] for c in done)
        for c in done:
            del self._offsets[c]
        if lsn > self._confirmed:
            self._confirmed = lsn
            if self._stream is not None:
                self._stream.confirm(lsn)
            if lsn > self.manifest.lsn and not self._chunks_gone:
                # The slot is past the snapshot: no restore can read the staged rows again.
                self._chunks_gone = True
                for name, _ in self.manifest.chunks:
                    self._staged().delete_file(name)

    def close(self) -> None:
        if getattr(self, "_stream", None) is not None:
            self._stream.close()  # type: ignore[union-attr]
            self._stream = None


def _snapshot_change(shape: TableShape, values: list[Any]) -> Change:
    row = dict(zip(shape.columns, values))
    return Change(ChangeKind.SNAPSHOT, shape.table, row, {c: row[c] for c in shape.key})
