"""PostgreSQL's logical replication stream, decoded: the copy-both messages of a walsender
(``XLogData``, keepalives, the standby status we send back) and the ``pgoutput`` plugin's
protocol version 1 inside them (Begin, Relation, Insert, Update, Delete, Truncate, Commit,
and logical decoding messages).
Pure functions of bytes, so every message shape is tested without a server
(tests/operators/test_pgoutput.py); operators/postgres_cdc.py drives them.

Values arrive in PostgreSQL's text form and are decoded by ``value`` to what a record can
carry (abs_engine/changes.py): the same function decodes the snapshot's values (read as
text), so a row looks the same whether the snapshot or the stream delivered it.

Invariant: a malformed or unknown message raises ``ProtocolViolation``, never a wrong record.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Callable

PG_EPOCH = 946_684_800  #: 2000-01-01 in UNIX seconds: PostgreSQL timestamps count from it
UNCHANGED = object()  #: a value the server did not send (an unchanged TOASTed column)

_INT = {20, 21, 23, 26, 28}  # int8, int2, int4, oid, xid
_FLOAT = {700, 701}
_STR = {25, 1043, 1042, 19, 18}  # text, varchar, bpchar, name, char


class ProtocolViolation(ValueError):
    """The stream holds something this decoder does not understand."""


def value(oid: int, text: str) -> Any:
    """A column of type ``oid`` from its text form: numbers, booleans, strings and bytes
    become Python's; every other type (numeric, timestamps, JSON, arrays...) stays
    PostgreSQL's text, which a sink's server parses back (JSON arrays would arrive as tuples
    and could not be told from composite values)."""
    if oid in _INT:
        return int(text)
    if oid in _STR:
        return text
    if oid == 16:
        return text == "t"
    if oid in _FLOAT:
        return float(text)
    if oid == 17 and text.startswith("\\x"):
        return bytes.fromhex(text[2:])
    return text


def lsn_text(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def unix_time(pg_micros: int) -> float:
    return pg_micros / 1e6 + PG_EPOCH


def pg_micros(unix: float) -> int:
    return int((unix - PG_EPOCH) * 1e6)


# ---- the walsender's copy-both messages -------------------------------------------------

_XLOG = struct.Struct("!QQQ")
_KEEPALIVE = struct.Struct("!QQB")
_STATUS = struct.Struct("!cQQQQB")


@dataclass(frozen=True)
class XLogData:
    start: int  #: the WAL position of the message
    end: int  #: the server's WAL end when it sent it
    data: bytes  #: a pgoutput message


@dataclass(frozen=True)
class Keepalive:
    end: int  #: the server has sent everything decoded up to here
    reply: bool  #: it wants a status update now (or it drops the connection at wal_sender_timeout)


def copy_message(raw: bytes) -> XLogData | Keepalive:
    try:
        if raw[:1] == b"w":
            start, end, _ = _XLOG.unpack_from(raw, 1)
            return XLogData(start, end, raw[1 + _XLOG.size:])
        if raw[:1] == b"k":
            end, _, reply = _KEEPALIVE.unpack_from(raw, 1)
            return Keepalive(end, bool(reply))
    except struct.error as e:
        raise ProtocolViolation(f"a truncated replication message ({e})") from None
    raise ProtocolViolation(f"an unknown replication message {raw[:1]!r}")


def standby_status(flushed: int, now_unix: float, reply: bool = False) -> bytes:
    """Our status: everything up to ``flushed`` is safe (the slot may drop it), as written,
    flushed and applied."""
    return _STATUS.pack(b"r", flushed, flushed, flushed, pg_micros(now_unix), int(reply))


# ---- pgoutput -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Relation:
    oid: int
    table: str  #: schema.name
    columns: tuple[str, ...]
    types: tuple[int, ...]
    key: tuple[str, ...]  #: the replica identity's columns


@dataclass(frozen=True)
class Begin:
    final_lsn: int
    committed: float


@dataclass(frozen=True)
class Commit:
    lsn: int
    end_lsn: int  #: a restart at or after this LSN does not send the transaction again
    committed: float


@dataclass(frozen=True)
class RowChange:
    kind: str  #: "insert", "update", "delete"
    relation: int
    new: tuple[Any, ...] | None
    old: tuple[Any, ...] | None
    old_is_key: bool  #: ``old`` holds only the key's columns ("K"), not the whole old row ("O")


@dataclass(frozen=True)
class LogicalMessage:
    prefix: str
    content: bytes


@dataclass(frozen=True)
class Truncate:
    relations: tuple[int, ...]


Message = Begin | Commit | Relation | RowChange | Truncate | LogicalMessage | None


class _Reader:
    __slots__ = ("data", "at")

    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def take(self, fmt: struct.Struct) -> tuple[Any, ...]:
        out = fmt.unpack_from(self.data, self.at)
        self.at += fmt.size
        return out

    def string(self) -> str:
        end = self.data.index(b"\0", self.at)
        s = self.data[self.at:end].decode()
        self.at = end + 1
        return s

    def byte(self) -> bytes:
        b = self.data[self.at:self.at + 1]
        if not b:
            raise struct.error("no byte left")
        self.at += 1
        return b


_I8, _I16, _I32, _I64 = struct.Struct("!b"), struct.Struct("!h"), struct.Struct("!I"), struct.Struct("!Q")
_BEGIN, _COMMIT = struct.Struct("!QqI"), struct.Struct("!bQQq")


def _tuple(r: _Reader, types: tuple[int, ...]) -> tuple[Any, ...]:
    (n,) = r.take(_I16)
    if n != len(types):
        raise ProtocolViolation(f"a row of {n} columns for a relation of {len(types)}")
    out: list[Any] = []
    for oid in types:
        kind = r.byte()
        if kind == b"n":
            out.append(None)
        elif kind == b"u":
            out.append(UNCHANGED)
        elif kind == b"t":
            (length,) = r.take(_I32)
            text = r.data[r.at:r.at + length]
            if len(text) != length:
                raise ProtocolViolation("a value runs past the end of its message")
            r.at += length
            out.append(value(oid, text.decode()))
        else:
            raise ProtocolViolation(f"a value of unknown kind {kind!r} (binary mode is not used)")
    return tuple(out)


def message(data: bytes, relations: Callable[[int], Relation]) -> Message:
    """One pgoutput message; ``relations(oid)`` gives a relation announced earlier in the
    stream. None: a message with nothing for us (a type, an origin)."""
    r = _Reader(data)
    try:
        tag = r.byte()
        if tag == b"B":
            final_lsn, ts, _ = r.take(_BEGIN)
            return Begin(final_lsn, unix_time(ts))
        if tag == b"C":
            _, lsn, end, ts = r.take(_COMMIT)
            return Commit(lsn, end, unix_time(ts))
        if tag == b"R":
            (oid,) = r.take(_I32)
            schema, name = r.string(), r.string()
            r.byte()  # replica identity setting
            (n,) = r.take(_I16)
            cols, types, key = [], [], []
            for _ in range(n):
                (flags,) = r.take(_I8)
                col = r.string()
                typ, _ = r.take(struct.Struct("!Ii"))
                cols.append(col)
                types.append(typ)
                if flags & 1:
                    key.append(col)
            return Relation(oid, f"{schema or 'pg_catalog'}.{name}", tuple(cols), tuple(types), tuple(key))
        if tag in (b"I", b"U", b"D"):
            (oid,) = r.take(_I32)
            rel = relations(oid)
            old, old_is_key, new = None, False, None
            sub = r.byte()
            if sub in (b"K", b"O"):
                old, old_is_key = _tuple(r, rel.types), sub == b"K"
                if tag != b"D":
                    sub = r.byte()
            if tag != b"D":
                if sub != b"N":
                    raise ProtocolViolation(f"expected a new row, got {sub!r}")
                new = _tuple(r, rel.types)
            elif old is None:
                raise ProtocolViolation("a delete without its old key")
            return RowChange({b"I": "insert", b"U": "update", b"D": "delete"}[tag], oid, new, old, old_is_key)
        if tag == b"T":
            (n,) = r.take(_I32)
            r.byte()  # options (CASCADE, RESTART IDENTITY)
            return Truncate(tuple(r.take(_I32)[0] for _ in range(n)))
        if tag == b"M":
            r.take(_I8)  # flags (transactional)
            r.take(_I64)  # its LSN
            prefix = r.string()
            (length,) = r.take(_I32)
            content = r.data[r.at:r.at + length]
            if len(content) != length:
                raise ProtocolViolation("a message runs past its end")
            return LogicalMessage(prefix, content)
        if tag in (b"Y", b"O"):
            return None
    except (struct.error, ValueError, UnicodeDecodeError) as e:
        if isinstance(e, ProtocolViolation):
            raise
        raise ProtocolViolation(f"a malformed pgoutput message {data[:1]!r} ({e})") from None
    raise ProtocolViolation(f"an unknown pgoutput message {data[:1]!r}")
