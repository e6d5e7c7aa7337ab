"""The statements of a PostgreSQL sink's commit (operators/postgres.py), run inside its
transaction: lock the progress row as its owner, then write the rows.

Invariant: ``lock_progress`` returns only to the row's owner, with the row locked until the
transaction ends; anyone else gets ``FencedOut`` and the transaction rolls back.
"""

from __future__ import annotations

from typing import Any, Sequence

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from abs_engine.changes import Change, ChangeKind
from abs_engine.errors import FencedOut

#: A row one longer than the sink's columns is a delete of its key (the last element marks it).
DELETE = True


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


def adapted(row: list[Any]) -> list[Any]:
    """A dict value as JSON (jsonb, json and text columns take it); the rest as psycopg adapts it."""
    return [Jsonb(v) if isinstance(v, dict) else v for v in row]


def rejected(table: str, epochs: list[tuple[int, list[list[Any]]]], e: BaseException) -> str:
    """What to say when the server refused a row of ``epochs`` (retrying cannot help)."""
    ids = ", ".join(str(cid) for cid, _ in epochs)
    first = str(e).strip().splitlines()
    return (f"PostgreSQL refused a row for table {table!r} (checkpoint(s) {ids}): "
            f"{' '.join(first[:3])}: fix the record upstream (to_row=) or the table; the job stopped here so "
            "that nothing after it is committed out of order")


def ahead(table: str, ident: tuple[str, str, str, int], committed: int, restored: int) -> str:
    return (f"table {table!r} already holds checkpoint {committed} of sink {ident[1]!r} subtask {ident[3]} (job "
            f"{ident[0]!r}), newer than the checkpoint restored ({restored}): restoring an older checkpoint or "
            "savepoint into it would lose or repeat rows. Restore the newest checkpoint, or empty the table and "
            "start the job afresh")


def change_rows(change: Change, columns: Sequence[str], key: Sequence[str], mode: str) -> list[Any]:
    """The rows an upsert sink writes for ``change``: the new row, and/or a delete row
    (``columns`` long plus the DELETE mark) for the key it removes; ValueError naming what
    is missing."""
    if mode != "upsert":
        raise ValueError("change records need mode='upsert' (with key=), which applies updates and deletes")
    if change.kind is ChangeKind.TRUNCATE:
        raise ValueError(f"a TRUNCATE of {change.table} cannot be applied key by key: empty the table yourself, "
                         "or filter truncates out before the sink")
    out: list[Any] = []
    if change.kind is ChangeKind.DELETE or change.moved_key:
        missing = [k for k in key if k not in change.key]
        if missing:
            raise ValueError(f"the change of {change.table} identifies its row by {list(change.key)}, not by the "
                             f"sink's key {list(key)} (missing {missing}): map it with to_row=")
        out.append([change.key.get(c) for c in columns] + [DELETE])
    if change.row is not None:
        missing = [c for c in columns if c not in change.row]
        if missing and change.kind is ChangeKind.UPDATE and all(k in change.row for k in key):
            # An update that left large (TOASTed) values unchanged: the server did not send
            # them, so only the columns it did send are set (a partial row, as a dict).
            out.append({c: change.row[c] for c in columns if c in change.row})
        elif missing:
            raise ValueError(f"the change of {change.table} carries no {missing} (its columns: {list(change.row)}): "
                             "fix columns= or map it with to_row=")
        else:
            out.append([change.row[c] for c in columns])
    return out


def write(cur: psycopg.Cursor[Any], target: str, columns: Sequence[str], mode: str, key: Sequence[str],
          rows: list[list[Any]]) -> None:
    """``rows`` into ``target``: COPY (append), or COPY into a temporary table and one
    INSERT ... ON CONFLICT (upsert, the last row of a key winning)."""
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    if mode == "append":
        with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(sql.SQL(target), cols)) as copy:
            for r in rows:
                copy.write_row(adapted(r))
        return
    at = [columns.index(k) for k in key]
    last: dict[tuple[Any, ...], Any] = {}
    for r in rows:
        if isinstance(r, dict):  # a partial update: onto the key's row of this epoch, if any
            k = tuple(r[c] for c in key)
            before = last.get(k)
            if isinstance(before, list) and len(before) == len(columns):
                r = [r.get(c, v) for c, v in zip(columns, before)]
            elif isinstance(before, dict):
                r = before | r
            last[k] = r
        else:
            last[tuple(r[i] for i in at)] = r  # (an upsert may not touch one row twice in a statement)
    gone = [r for r in last.values() if isinstance(r, list) and len(r) > len(columns)]
    if gone:
        _delete(cur, target, key, [[r[i] for i in at] for r in gone])
    for r in last.values():
        if isinstance(r, dict):
            sets = [c for c in r if c not in key]
            cur.execute(sql.SQL("UPDATE {} SET {} WHERE {}").format(
                sql.SQL(target), sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in sets),
                sql.SQL(" AND ").join(sql.SQL("{} = %s").format(sql.Identifier(k)) for k in key)),
                adapted([r[c] for c in sets] + [r[k] for k in key]))
    upserts = [r for r in last.values() if isinstance(r, list) and len(r) == len(columns)]
    if not upserts:
        return
    stage = _staged(cur, "abs_engine_stage", target, columns, upserts)
    others = [c for c in columns if c not in key]
    action = (sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(
        sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c)) for c in others))
        if others else sql.SQL("DO NOTHING"))
    cur.execute(sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} ON CONFLICT ({}) {}").format(
        sql.SQL(target), cols, cols, stage, sql.SQL(", ").join(sql.Identifier(k) for k in key), action))


def _delete(cur: psycopg.Cursor[Any], target: str, key: Sequence[str], keys: list[list[Any]]) -> None:
    """The rows of ``keys`` deleted from ``target`` (COPY into a temporary table, one DELETE)."""
    gone = _staged(cur, "abs_engine_gone", target, key, keys)
    cur.execute(sql.SQL("DELETE FROM {} t USING {} g WHERE {}").format(sql.SQL(target), gone, sql.SQL(" AND ").join(
        sql.SQL("t.{} = g.{}").format(sql.Identifier(k), sql.Identifier(k)) for k in key)))


def _staged(cur: psycopg.Cursor[Any], name: str, target: str, columns: Sequence[str],
            rows: list[list[Any]]) -> sql.Identifier:
    """``rows`` copied into temporary table ``name``, of ``target``'s ``columns`` only (not its
    constraints: an identity key the rows do not carry must not make it refuse them), emptied
    at the commit."""
    stage, cols = sql.Identifier(name), sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    cur.execute(sql.SQL("CREATE TEMPORARY TABLE IF NOT EXISTS {} ON COMMIT DELETE ROWS AS SELECT {} FROM {} "
                        "WITH NO DATA").format(stage, cols, sql.SQL(target)))
    with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(stage, cols)) as copy:
        for r in rows:
            copy.write_row(adapted(r))
    return stage
