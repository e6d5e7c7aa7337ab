"""The statements of a PostgreSQL sink's commit (operators/postgres.py), run inside its
transaction: lock the progress row as its owner, then write the rows.

Invariant: ``lock_progress`` returns only to the row's owner, with the row locked until the
transaction ends; anyone else gets ``FencedOut`` and the transaction rolls back.
"""

from __future__ import annotations

from typing import Any, Sequence

import psycopg
from psycopg import sql

from abs_engine.errors import FencedOut


def lock_progress(cur: psycopg.Cursor[Any], progress: str, ident: tuple[str, str, str, int], owner: str) -> int:
    """The checkpoint committed so far, the progress row locked; FencedOut if another
    attempt owns it now."""
    cur.execute(f"SELECT checkpoint, owner FROM {progress} WHERE job = %s AND sink = %s AND target = %s "
                "AND subtask = %s FOR UPDATE", ident)
    row = cur.fetchone()
    if row is None or row[1] != owner:
        raise FencedOut(f"sink {ident[1]!r} subtask {ident[3]} of job {ident[0]!r}: attempt {owner!r} no longer "
                        f"owns its progress row in {progress} (now {row[1] if row else 'nobody'!r}): a newer attempt "
                        "replaced this one, which must not commit")
    return int(row[0])


def write(cur: psycopg.Cursor[Any], target: str, columns: Sequence[str], mode: str, key: Sequence[str],
          rows: list[list[Any]]) -> None:
    """``rows`` into ``target``: COPY (append), or COPY into a temporary table and one
    INSERT ... ON CONFLICT (upsert, the last row of a key winning)."""
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    if mode == "append":
        with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(sql.SQL(target), cols)) as copy:
            for r in rows:
                copy.write_row(r)
        return
    at = [columns.index(k) for k in key]
    last: dict[tuple[Any, ...], list[Any]] = {}
    for r in rows:
        last[tuple(r[i] for i in at)] = r  # (an upsert may not touch one row twice in a statement)
    stage = sql.Identifier("abs_engine_stage")
    cur.execute(sql.SQL("CREATE TEMPORARY TABLE IF NOT EXISTS {} (LIKE {} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS")
                .format(stage, sql.SQL(target)))
    with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(stage, cols)) as copy:
        for r in last.values():
            copy.write_row(r)
    others = [c for c in columns if c not in key]
    action = (sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(
        sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c)) for c in others))
        if others else sql.SQL("DO NOTHING"))
    cur.execute(sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} ON CONFLICT ({}) {}").format(
        sql.SQL(target), cols, cols, stage, sql.SQL(", ").join(sql.Identifier(k) for k in key), action))
