"""pgoutput protocol messages built by hand, as a walsender sends them (PostgreSQL's
docs, "Logical Replication Message Formats"), for the decoder's and the source's tests."""

from __future__ import annotations

import struct
from typing import Any


def cstr(s: str) -> bytes:
    return s.encode() + b"\0"


def relation(oid: int, schema: str, name: str, columns: list[tuple[str, int, bool]]) -> bytes:
    body = b"R" + struct.pack("!I", oid) + cstr(schema) + cstr(name) + b"d" + struct.pack("!h", len(columns))
    for col, typ, key in columns:
        body += struct.pack("!b", 1 if key else 0) + cstr(col) + struct.pack("!Ii", typ, -1)
    return body


def tuple_data(values: list[Any]) -> bytes:
    out = struct.pack("!h", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v == "<unchanged>":
            out += b"u"
        else:
            text = str(v).encode()
            out += b"t" + struct.pack("!I", len(text)) + text
    return out


def begin(final_lsn: int, ts: int = 0, xid: int = 7) -> bytes:
    return b"B" + struct.pack("!QqI", final_lsn, ts, xid)


def commit(lsn: int, end: int, ts: int = 0) -> bytes:
    return b"C" + struct.pack("!bQQq", 0, lsn, end, ts)


def insert(oid: int, values: list[Any]) -> bytes:
    return b"I" + struct.pack("!I", oid) + b"N" + tuple_data(values)


def update(oid: int, values: list[Any], old: list[Any] | None = None, old_kind: bytes = b"K") -> bytes:
    head = b"U" + struct.pack("!I", oid)
    if old is not None:
        head += old_kind + tuple_data(old)
    return head + b"N" + tuple_data(values)


def delete(oid: int, old: list[Any], old_kind: bytes = b"K") -> bytes:
    return b"D" + struct.pack("!I", oid) + old_kind + tuple_data(old)


def truncate(*oids: int) -> bytes:
    return b"T" + struct.pack("!Ib", len(oids), 0) + b"".join(struct.pack("!I", o) for o in oids)


def logical_message(prefix: str, content: bytes, lsn: int = 0) -> bytes:
    return b"M" + struct.pack("!bQ", 1, lsn) + cstr(prefix) + struct.pack("!I", len(content)) + content


def xlog(data: bytes, start: int = 0, end: int = 0) -> bytes:
    return b"w" + struct.pack("!QQQ", start, end, 0) + data


def keepalive(end: int, reply: bool = False) -> bytes:
    return b"k" + struct.pack("!QQB", end, 0, int(reply))
