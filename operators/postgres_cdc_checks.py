"""What the change data capture source (operators/postgres_cdc.py) checks in the driver
before a job starts, each failure a ``PostgresSourceError`` naming its fix: logical WAL, the
replication privilege, the tables and their replica identity, and the publication (created
when it is the source's own)."""

from __future__ import annotations

from typing import Any, Sequence

import psycopg
from psycopg import sql

from .postgres_schema import PostgresProblem, PostgresSourceError


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def resolved(conn: psycopg.Connection[Any], tables: Sequence[str]) -> list[str]:
    """``schema.name`` of each table (as the stream names it); a missing one is left out."""
    out = []
    for table in tables:
        row = conn.execute("SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n ON "
                           "n.oid = c.relnamespace WHERE c.oid = to_regclass(%s)", (table,)).fetchone()
        if row is not None:
            out.append(_text(row[0]))
    conn.rollback()
    return out


def check_source(conn: psycopg.Connection[Any], tables: Sequence[str], publication: str, owns_publication: bool,
                 where: str) -> None:
    encoding = conn.execute("SHOW server_encoding").fetchone()
    if encoding is None or _text(encoding[0]) != "UTF8":
        raise PostgresSourceError(PostgresProblem.UNSUPPORTED, (
            f"the database at {where} is encoded {_text(encoding[0]) if encoding else '?'}: the replication stream "
            "carries text in the database's encoding, and this source reads UTF8 databases only (CREATE DATABASE "
            "... ENCODING 'UTF8')"))
    level = conn.execute("SHOW wal_level").fetchone()
    if level is None or _text(level[0]) != "logical":
        raise PostgresSourceError(PostgresProblem.NO_LOGICAL_WAL, (
            f"PostgreSQL at {where} runs with wal_level = {level[0] if level else '?'}, and change data capture needs "
            "logical: set wal_level = logical in postgresql.conf (ALTER SYSTEM SET wal_level = logical) and restart "
            "the server"))
    # (the attribute, or membership of a role that has it, or of rds_replication on Amazon RDS)
    allowed = conn.execute("SELECT coalesce(bool_or(rolreplication OR rolsuper OR rolname = 'rds_replication'), false) "
                           "FROM pg_roles WHERE pg_has_role(current_user, oid, 'member')").fetchone()
    if not allowed or not allowed[0]:
        raise PostgresSourceError(PostgresProblem.NO_REPLICATION, (
            f"the user of {where} may not read a replication slot: ALTER ROLE <user> REPLICATION (as a superuser)"))
    names, partitioned = [], False
    for table in tables:
        row = conn.execute("SELECT c.relkind, n.nspname || '.' || c.relname, c.relreplident, EXISTS (SELECT 1 FROM "
                           "pg_index i WHERE i.indrelid = c.oid AND i.indisprimary) FROM pg_class c JOIN pg_namespace "
                           "n ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s) AND c.relkind IN ('r', 'p')",
                           (table,)).fetchone()
        if row is None:
            raise PostgresSourceError(PostgresProblem.MISSING_TABLE,
                                      f"table {table!r} does not exist at {where}: create it, or fix the name")
        kind, name, identity, has_pk = row
        partitioned = partitioned or kind == "p"
        if identity == "n" or (identity == "d" and not has_pk):
            raise PostgresSourceError(PostgresProblem.NO_REPLICA_IDENTITY, (
                f"table {name!r} has no primary key, so its updates and deletes cannot be captured: add a primary "
                f"key, or ALTER TABLE {name} REPLICA IDENTITY FULL"))
        names.append(name)
    conn.rollback()
    exists = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)).fetchone()
    if exists is None:
        if not owns_publication:
            raise PostgresSourceError(PostgresProblem.MISSING_PUBLICATION, (
                f"publication {publication!r} does not exist at {where}: CREATE PUBLICATION {publication} FOR TABLE "
                f"{', '.join(names)}, or pass publication=None and the source creates its own"))
        # (a partitioned table's changes under its own name, as the snapshot has them)
        conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH (publish = 'insert, update, delete, truncate', "
                             "publish_via_partition_root = true)").format(
            sql.Identifier(publication), sql.SQL(", ").join(sql.Identifier(*n.split(".", 1)) for n in names)))
        conn.commit()
        return
    _check_publication(conn, publication, names, partitioned)
    covered = {r[0] for r in conn.execute("SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE "
                                          "pubname = %s", (publication,)).fetchall()}
    conn.rollback()
    missing = [n for n in names if n not in covered]
    if missing:
        hint = (f"the source made it for other tables: drop it (DROP PUBLICATION {publication}) or pass another slot"
                if owns_publication else f"ALTER PUBLICATION {publication} ADD TABLE {', '.join(missing)}")
        raise PostgresSourceError(PostgresProblem.MISSING_PUBLICATION,
                                  f"publication {publication!r} does not publish {missing}: {hint}")


def _check_publication(conn: psycopg.Connection[Any], publication: str, names: list[str], partitioned: bool) -> None:
    """A publication the source did not make publishes every change of the tables whole: a
    missing kind of change, a row filter or a column list would make the stream disagree
    with the snapshot, silently."""
    ins, upd, dele, viaroot = conn.execute("SELECT pubinsert, pubupdate, pubdelete, pubviaroot FROM pg_publication "
                                           "WHERE pubname = %s", (publication,)).fetchone() or (True, True, True, True)
    problems = [f"it does not publish {what}" for what, on in (("inserts", ins), ("updates", upd),
                                                                 ("deletes", dele)) if not on]
    if partitioned and not viaroot:
        problems.append("it names a partitioned table's changes by partition (publish_via_partition_root = false)")
    if conn.info.server_version >= 150000:
        filtered = conn.execute("SELECT n.nspname || '.' || c.relname FROM pg_publication_rel r JOIN pg_publication p ON "
                                "p.oid = r.prpubid JOIN pg_class c ON c.oid = r.prrelid JOIN pg_namespace n ON "
                                "n.oid = c.relnamespace WHERE p.pubname = %s AND (r.prqual IS NOT NULL OR r.prattrs IS "
                                "NOT NULL)", (publication,)).fetchall()
        hit = sorted({_text(r[0]) for r in filtered} & set(names))
        if hit:
            problems.append(f"it filters rows or columns of {hit}")
    conn.rollback()
    if problems:
        raise PostgresSourceError(PostgresProblem.MISSING_PUBLICATION, (
            f"publication {publication!r} would make the stream disagree with the snapshot: {'; '.join(problems)}. "
            "Publish every change of the tables whole, or pass publication=None and the source creates its own"))
