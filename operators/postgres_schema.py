"""PostgreSQL connections and the checks a sink (operators/postgres.py) and the change data
capture source (operators/postgres_cdc.py) make before a job starts: each failure a
``PostgresSinkError`` or ``PostgresSourceError`` with its ``PostgresProblem`` and the fix.

Invariant: no error message carries the connection string's password (``describe`` is what
names a server).
"""

from __future__ import annotations

import enum
from typing import Any, Sequence

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from abs_engine.errors import InputError


class PostgresProblem(enum.Enum):
    """What a PostgresSinkError or PostgresSourceError is about (its ``problem``)."""

    UNREACHABLE = "unreachable"
    AUTHENTICATION = "authentication"
    MISSING_TABLE = "missing table"
    SCHEMA_MISMATCH = "schema mismatch"
    NO_UNIQUE_KEY = "no unique key"
    REJECTED_ROW = "rejected row"  #: the server refused a row (a type, a constraint)
    AHEAD_OF_CHECKPOINT = "ahead of checkpoint"  #: the table holds epochs newer than the one restored
    # the change data capture source
    NO_LOGICAL_WAL = "wal_level is not logical"
    NO_REPLICATION = "no replication privilege"
    NO_REPLICA_IDENTITY = "no replica identity"  #: updates and deletes of the table cannot be published
    MISSING_PUBLICATION = "missing publication"
    SLOT_EXISTS = "slot exists"  #: a slot of that name that this source did not make
    SLOT_DROPPED = "slot dropped"
    SLOT_AHEAD = "slot ahead of checkpoint"  #: the slot moved past the position restored
    CORRUPT_STAGING = "corrupt staging"
    PROTOCOL = "replication protocol"  #: the stream held something this decoder does not know
    UNSUPPORTED = "unsupported"  #: a database this source cannot read (not UTF8)


class PostgresError(InputError):
    """A PostgreSQL connector cannot work as pointed; retrying cannot help (``fatal``)."""

    fatal = True

    def __init__(self, problem: PostgresProblem, message: str):
        super().__init__(message)
        self.problem = problem


class PostgresSinkError(PostgresError):
    """The sink cannot write where it was pointed: ``problem`` (a PostgresProblem) says
    what, ``message`` names the server or table and the fix."""


class PostgresSourceError(PostgresError):
    """The change data capture source cannot read what it was pointed at: ``problem`` (a
    PostgresProblem) says what, ``message`` names the server, table or slot and the fix."""


def describe(dsn: str) -> str:
    """``user@host:port/dbname`` of ``dsn`` (no password), for messages and identities."""
    try:
        d = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "(an unparsable connection string)"
    return f"{d.get('user', '')}@{d.get('host', 'localhost')}:{d.get('port', '5432')}/{d.get('dbname', '')}"


def connect(dsn: str, timeout: float, where: str, fatal: bool = True,
            error: type[PostgresError] = PostgresSinkError) -> psycopg.Connection[Any]:
    """A connection to ``dsn`` (waiting at most ``timeout`` seconds), or the typed error.
    ``fatal=False`` (a worker): a server that does not answer is a ConnectionError, which
    the job restarts on, not the fatal error the driver's check gives before the start."""
    try:
        return psycopg.connect(dsn, connect_timeout=max(1, int(timeout)))
    except psycopg.ProgrammingError:
        # (libpq's parse errors quote the string, password and all: not repeated here)
        raise error(PostgresProblem.UNREACHABLE, "the PostgreSQL connection string cannot be parsed: "
                                                 "give a libpq string or a postgresql:// URI") from None
    except psycopg.OperationalError as e:
        text = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        if not fatal and "password authentication failed" not in text:
            raise ConnectionError(f"cannot reach PostgreSQL at {where} ({text})") from None
        if "password authentication failed" in text or "no password supplied" in text:
            raise error(PostgresProblem.AUTHENTICATION,
                        f"PostgreSQL at {where} refused the credentials ({text}): fix the user or "
                        "password in the connection string") from None
        if "does not exist" in text and "database" in text:
            raise error(PostgresProblem.MISSING_TABLE,
                        f"PostgreSQL at {where}: {text}: create the database or fix its name") from None
        raise error(PostgresProblem.UNREACHABLE,
                    f"cannot reach PostgreSQL at {where} ({text}): start the server, or fix the host and "
                    "port in the connection string") from None


def quoted(conn: psycopg.Connection[Any], name: str) -> str:
    """``name`` (``table`` or ``schema.table``) as a quoted SQL identifier."""
    return sql.Identifier(*name.split(".", 1)).as_string(conn)


def check_target(conn: psycopg.Connection[Any], table: str, columns: Sequence[str], key: Sequence[str],
                 mode: str) -> None:
    """The table exists with ``columns``; for an upsert a unique index covers exactly ``key``."""
    schema, _, name = table.rpartition(".")
    with conn.cursor() as cur:
        cur.execute("SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE c.relname = %s AND c.relkind IN ('r', 'p') AND "
                    "(n.nspname = %s OR (%s = '' AND n.nspname = current_schema()))", (name, schema, schema))
        found = cur.fetchone()
        if found is None:
            raise PostgresSinkError(PostgresProblem.MISSING_TABLE,
                                    f"table {table!r} does not exist: create it (with the columns {list(columns)}) "
                                    "or fix the table name")
        oid = found[0]
        cur.execute("SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped "
                    "ORDER BY attnum", (oid,))
        have = [r[0] for r in cur.fetchall()]
        missing = [c for c in columns if c not in have]
        if missing:
            raise PostgresSinkError(PostgresProblem.SCHEMA_MISMATCH,
                                    f"table {table!r} has no column(s) {missing} (it has {have}): fix columns= or "
                                    "alter the table")
        if mode == "upsert":
            cur.execute("SELECT array_agg(a.attname ORDER BY a.attname) FROM pg_index i JOIN pg_attribute a "
                        "ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s AND "
                        "i.indisunique GROUP BY i.indexrelid", (oid,))
            uniques = [sorted(r[0]) for r in cur.fetchall()]
            if sorted(key) not in uniques:
                raise PostgresSinkError(PostgresProblem.NO_UNIQUE_KEY,
                                        f"table {table!r} has no unique index on exactly {list(key)} (its unique "
                                        f"indexes: {uniques or 'none'}), which an upsert needs: add a primary key or "
                                        f"unique index on {list(key)}")
    conn.rollback()
