"""What the change data capture source (operators/postgres_cdc.py) checks in the driver
before a job starts, each failure a ``PostgresSourceError`` naming its fix: logical WAL, the
replication privilege, the tables and their replica identity, and the publication (created
when it is the source's own)."""

from __future__ import annotations

from typing import Any, Sequence

import psycopg
from psycopg import sql

from .postgres_schema import PostgresProblem, PostgresSourceError


def check_source(conn: psycopg.Connection[Any], tables: Sequence[str], publication: str, owns_publication: bool,
                 where: str) -> None:
    level = conn.execute("SHOW wal_level").fetchone()
    if level is None or level[0] != "logical":
        raise PostgresSourceError(PostgresProblem.NO_LOGICAL_WAL, (
            f"PostgreSQL at {where} runs with wal_level = {level[0] if level else '?'}, and change data capture needs "
            "logical: set wal_level = logical in postgresql.conf (ALTER SYSTEM SET wal_level = logical) and restart "
            "the server"))
    allowed = conn.execute("SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
    if not allowed or not allowed[0]:
        raise PostgresSourceError(PostgresProblem.NO_REPLICATION, (
            f"the user of {where} may not read a replication slot: ALTER ROLE <user> REPLICATION (as a superuser)"))
    names = []
    for table in tables:
        row = conn.execute("SELECT c.oid, n.nspname || '.' || c.relname, c.relreplident, EXISTS (SELECT 1 FROM "
                           "pg_index i WHERE i.indrelid = c.oid AND i.indisprimary) FROM pg_class c JOIN pg_namespace "
                           "n ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s) AND c.relkind IN ('r', 'p')",
                           (table,)).fetchone()
        if row is None:
            raise PostgresSourceError(PostgresProblem.MISSING_TABLE,
                                      f"table {table!r} does not exist at {where}: create it, or fix the name")
        _, name, identity, has_pk = row
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
        conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
            sql.Identifier(publication), sql.SQL(", ").join(sql.Identifier(*n.split(".", 1)) for n in names)))
        conn.commit()
        return
    covered = {r[0] for r in conn.execute("SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE "
                                          "pubname = %s", (publication,)).fetchall()}
    conn.rollback()
    missing = [n for n in names if n not in covered]
    if missing:
        hint = (f"the source made it for other tables: drop it (DROP PUBLICATION {publication}) or pass another slot"
                if owns_publication else f"ALTER PUBLICATION {publication} ADD TABLE {', '.join(missing)}")
        raise PostgresSourceError(PostgresProblem.MISSING_PUBLICATION,
                                  f"publication {publication!r} does not publish {missing}: {hint}")
