"""A logical replication slot, for the change data capture source (operators/postgres_cdc.py):
creating it together with the consistent snapshot of the tables (staged, so the snapshot can
be read again after a crash), finding it again, and streaming its changes.

Invariants:
- The snapshot and the slot are one consistent cut: the slot is created with
  ``EXPORT_SNAPSHOT`` and the tables are read in that exported snapshot while the
  replication connection that made it stays open. Every transaction committed before the
  slot's consistent point is in the snapshot; every one after it is in the stream; none in
  both, none in neither.
- The staged snapshot is complete exactly when its manifest exists (written last, after
  every chunk). A slot is only ever dropped by this module when a ``_creating`` note in the
  same staging location says an earlier run of this source made it and died staging.
- The stream tells the server a position is safe (``confirm``) only when the source says
  so: the slot never moves past what a completed checkpoint holds.
"""

from __future__ import annotations

import select
import time
from dataclasses import dataclass
from typing import Any, Sequence

import msgpack
import psycopg
from psycopg import pq, sql
from psycopg.types.string import TextLoader

from abs_engine import fs

from . import pgoutput
from .postgres_schema import PostgresProblem, PostgresSourceError

MANIFEST, CREATING = "_snapshot", "_creating"
CHUNK_ROWS = 20_000  #: rows per staged chunk file
MAX_CHUNK_BYTES = 1 << 30  #: a staged chunk larger than this is refused unread
CHUNK_BYTES = 64 << 20  #: and at most about this many bytes of values per chunk
STATUS_EVERY = 10.0  #: seconds between status updates (the server drops a silent client at wal_sender_timeout)
#: The session settings that decide how values are written as text: the same for the snapshot
#: (read in the driver) and the stream (in a worker), whatever either's environment says.
SESSION = ("-c client_encoding=UTF8 -c TimeZone=UTC -c DateStyle=ISO -c IntervalStyle=postgres "
           "-c extra_float_digits=1 -c bytea_output=hex")


def pinned(dsn: str) -> dict[str, Any]:
    """psycopg.connect's keyword arguments that pin SESSION (after any options of ``dsn``)."""
    from psycopg.conninfo import conninfo_to_dict

    given = str(conninfo_to_dict(dsn).get("options") or "")
    return {"options": f"{given} {SESSION}".strip()}


@dataclass(frozen=True)
class TableShape:
    table: str  #: schema.name
    columns: tuple[str, ...]
    types: tuple[int, ...]
    key: tuple[str, ...]  #: the replica identity's columns


@dataclass(frozen=True)
class Manifest:
    slot: str
    lsn: int  #: the slot's consistent point: the stream starts after it
    tables: tuple[TableShape, ...]
    chunks: tuple[tuple[str, int], ...]  #: (file name, index of its table in ``tables``)

    def pack(self) -> bytes:
        data: bytes = msgpack.packb({"slot": self.slot, "lsn": self.lsn, "chunks": [list(c) for c in self.chunks],
                                     "tables": [[t.table, list(t.columns), list(t.types), list(t.key)]
                                                for t in self.tables]}, use_bin_type=True)
        return data

    @staticmethod
    def unpack(data: bytes, where: str) -> "Manifest":
        try:
            d = msgpack.unpackb(data, raw=False)
            return Manifest(str(d["slot"]), int(d["lsn"]),
                            tuple(TableShape(t, tuple(c), tuple(int(x) for x in ty), tuple(k))
                                  for t, c, ty, k in d["tables"]),
                            tuple((str(n), int(i)) for n, i in d["chunks"]))
        except (ValueError, TypeError, KeyError, msgpack.UnpackException) as e:
            raise PostgresSourceError(PostgresProblem.CORRUPT_STAGING,
                                      f"{where} is not a staged snapshot's manifest ({type(e).__name__}): the "
                                      "staging location was changed by something else; give the source a location "
                                      "of its own and start afresh") from None


def shape(cur: psycopg.Cursor[Any], table: str) -> TableShape:
    """The columns the stream carries (not generated ones) and the row's key: the primary key
    when there is one (also under REPLICA IDENTITY FULL, where the stream flags every column),
    else the replica identity index, else (FULL without a key) every column."""
    cur.execute("SELECT a.attname, a.atttypid, coalesce(a.attnum = ANY(p.indkey), false), "
                "coalesce(a.attnum = ANY(i.indkey), false), n.nspname, c.relname "
                "FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "LEFT JOIN pg_index p ON p.indrelid = c.oid AND p.indisprimary "
                "LEFT JOIN pg_index i ON i.indrelid = c.oid AND c.relreplident = 'i' AND i.indisreplident "
                "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' "
                "ORDER BY a.attnum", (table,))
    rows = cur.fetchall()
    key = [r[0] for r in rows if r[2]] or [r[0] for r in rows if r[3]] or [r[0] for r in rows]
    return TableShape(f"{rows[0][4]}.{rows[0][5]}", tuple(r[0] for r in rows), tuple(int(r[1]) for r in rows),
                      tuple(key))


def slot_position(conn: psycopg.Connection[Any], slot: str) -> int | None:
    """The slot's confirmed position, or None if there is no such slot; SLOT_DROPPED if the
    server invalidated it (it kept more WAL than ``max_slot_wal_keep_size`` allows)."""
    row = conn.execute("SELECT confirmed_flush_lsn::text, wal_status FROM pg_replication_slots WHERE slot_name = %s",
                       (slot,)).fetchone()
    conn.rollback()
    if row is None:
        return None
    if row[1] == "lost":
        raise PostgresSourceError(PostgresProblem.SLOT_DROPPED, (
            f"replication slot {slot!r} was invalidated by the server (it held more WAL than max_slot_wal_keep_size "
            "allows, so changes it had not confirmed are gone): start afresh (drop the slot, empty the staging "
            "location), and give the job more room or fewer pauses"))
    return pgoutput.parse_lsn(row[0]) if row[0] else 0


def replication_connection(dsn: str, timeout: float, where: str) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(dsn, autocommit=True, replication="database", connect_timeout=max(1, int(timeout)),
                               **pinned(dsn))
    except psycopg.OperationalError as e:
        text = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        if "replication" in text and ("pg_hba" in text or "permission" in text or "must be" in text):
            raise PostgresSourceError(PostgresProblem.NO_REPLICATION, f"PostgreSQL at {where} refused a replication "
                                      f"connection ({text}): give the user the REPLICATION attribute (ALTER ROLE "
                                      "... REPLICATION) and allow it in pg_hba.conf") from None
        raise ConnectionError(f"cannot open a replication connection to PostgreSQL at {where} ({text})") from None


def _command(conn: psycopg.Connection[Any], command: bytes) -> Any:
    res = conn.pgconn.exec_(command)
    if res.status not in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
        raise psycopg.OperationalError((res.error_message or b"").decode(errors="replace").strip())
    return res


# (Slot names reach the replication commands unquoted: the source admits only [a-z_][a-z0-9_]*.)


def create_and_stage(dsn: str, timeout: float, where: str, slot: str, tables: Sequence[str],
                     staged: fs.Directory) -> Manifest:
    """A new slot, and the tables as of its consistent point staged in ``staged``."""
    staged.put((CREATING,), slot.encode())
    with replication_connection(dsn, timeout, where) as rconn:
        res = _command(rconn, b"CREATE_REPLICATION_SLOT " + slot.encode()
                       + b" LOGICAL pgoutput EXPORT_SNAPSHOT")
        lsn = pgoutput.parse_lsn(res.get_value(0, 1).decode())
        exported = res.get_value(0, 2).decode()
        # The exported snapshot lives while rconn runs no other command: read everything now.
        with psycopg.connect(dsn, connect_timeout=max(1, int(timeout)), **pinned(dsn)) as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(exported)))
            shapes: list[TableShape] = []
            chunks: list[tuple[str, int]] = []
            for i, table in enumerate(tables):
                with conn.cursor() as cur:
                    s = shape(cur, table)
                shapes.append(s)
                cols = sql.SQL(", ").join(sql.Identifier(c) for c in s.columns)
                with conn.cursor(name=f"abs_engine_snapshot_{i}") as cur:
                    # Each value as the server's output function wrote it (text format, not
                    # loaded): the very text pgoutput sends for it (a ::text cast is not: it
                    # writes booleans as 'true', drops char(n) padding and inet masks).
                    for oid in set(s.types):
                        cur.adapters.register_loader(oid, TextLoader)
                    cur.execute(sql.SQL("SELECT {} FROM {}").format(cols, sql.Identifier(*s.table.split(".", 1))))
                    for values in _chunks(cur, s.types):
                        # (named by the consistent point: a crashed staging's chunks are never read)
                        name = f"chunk-{lsn:016x}-{len(chunks):06d}"
                        staged.put((name,), msgpack.packb(values, use_bin_type=True))
                        chunks.append((name, i))
            conn.rollback()
    manifest = Manifest(slot, lsn, tuple(shapes), tuple(chunks))
    staged.put((MANIFEST,), manifest.pack())
    ours = {n for n, _ in chunks}
    for name in staged.list():
        if name.startswith("chunk-") and name not in ours:
            staged.delete_file(name)  # left by a staging that died
    staged.delete_file(CREATING)
    return manifest


def _chunks(cur: psycopg.Cursor[Any], types: tuple[int, ...]) -> Any:
    """The rows decoded, in chunks of at most CHUNK_ROWS rows and about CHUNK_BYTES bytes."""
    chunk: list[list[Any]] = []
    size = 0
    while rows := cur.fetchmany(1_000):
        for r in rows:
            chunk.append([None if v is None else pgoutput.value(t, v) for v, t in zip(r, types)])
            size += sum(len(v) for v in r if v is not None) + 8
            if len(chunk) >= CHUNK_ROWS or size >= CHUNK_BYTES:
                yield chunk
                chunk, size = [], 0
    if chunk:
        yield chunk


def drop_slot(conn: psycopg.Connection[Any], slot: str) -> None:
    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    conn.commit()


class Stream:
    """The slot's changes from ``start`` on, as copy-both messages (pgoutput.copy_message)."""

    def __init__(self, dsn: str, timeout: float, where: str, slot: str, publication: str, start: int):
        self.conn = replication_connection(dsn, timeout, where)
        pg = self.conn.pgconn
        pg.send_query(b"START_REPLICATION SLOT " + slot.encode() + b" LOGICAL "
                      + pgoutput.lsn_text(start).encode() + b" (proto_version '1', messages 'true', publication_names "
                      + sql.Literal(publication).as_bytes(self.conn) + b")")
        res = pg.get_result()
        if res is None or res.status != pq.ExecStatus.COPY_BOTH:
            text = (res.error_message if res is not None else pg.error_message).decode(errors="replace").strip()
            self.conn.close()
            if "does not exist" in text and "slot" in text:
                raise PostgresSourceError(PostgresProblem.SLOT_DROPPED, dropped(slot, where, start))
            if "publication" in text and "does not exist" in text:
                raise PostgresSourceError(PostgresProblem.MISSING_PUBLICATION,
                                          f"PostgreSQL at {where}: {text}: create it (CREATE PUBLICATION ... FOR "
                                          "TABLE ...) or let the source create it (publication=None)")
            # (in use by another connection, say one of a replaced attempt the server has not
            # noticed gone yet: the job restarts and tries again)
            raise ConnectionError(f"slot {slot!r} at {where} did not start streaming: {text}")
        self.pg = pg
        self.flushed = start
        self.last_status = time.monotonic()

    def poll(self, wait: float, limit: int = 4096) -> list[pgoutput.XLogData | pgoutput.Keepalive]:
        """What has arrived (at most ``limit`` messages), waiting up to ``wait`` seconds for
        the first when nothing has."""
        out: list[pgoutput.XLogData | pgoutput.Keepalive] = []
        waited = False
        try:
            while len(out) < limit:
                n, data = self.pg.get_copy_data(1)
                if n > 0:
                    out.append(pgoutput.copy_message(bytes(data)))
                elif n == 0:
                    if out or waited:
                        break
                    select.select([self.pg.socket], [], [], wait)
                    self.pg.consume_input()
                    waited = True
                else:
                    res = self.pg.get_result()
                    text = (res.error_message if res is not None else b"").decode(errors="replace").strip()
                    raise ConnectionError(f"the replication stream ended: {text or 'the server closed it'}")
            if time.monotonic() - self.last_status > STATUS_EVERY:
                self.confirm(self.flushed)
        except psycopg.OperationalError as e:
            raise ConnectionError(f"the replication stream broke: {e}") from None
        return out

    def confirm(self, lsn: int, reply: bool = False) -> None:
        """Tell the server everything up to ``lsn`` is safe: the slot may move there."""
        self.flushed = max(self.flushed, lsn)
        try:
            self.pg.put_copy_data(pgoutput.standby_status(self.flushed, time.time(), reply))
            self.pg.flush()
        except psycopg.OperationalError as e:
            raise ConnectionError(f"the replication stream broke: {e}") from None
        self.last_status = time.monotonic()

    def close(self) -> None:
        self.conn.close()


def dropped(slot: str, where: str, lsn: int) -> str:
    return (f"replication slot {slot!r} at {where} does not exist (it was dropped): the changes after "
            f"{pgoutput.lsn_text(lsn)} that this job has not read are gone, and resuming would silently miss them. "
            "Start the job afresh with an empty staging location (it creates the slot and takes a new snapshot)")


def ahead(slot: str, where: str, confirmed: int, lsn: int) -> str:
    return (f"replication slot {slot!r} at {where} has moved to {pgoutput.lsn_text(confirmed)}, past the position "
            f"this run starts from ({pgoutput.lsn_text(lsn)}): the changes between were given to another reader (an "
            "older checkpoint or savepoint restored, or another job on this slot) and cannot be read again. Restore "
            "the newest checkpoint, or start afresh: drop the slot (SELECT pg_drop_replication_slot('"
            f"{slot}')) and empty the staging location")
