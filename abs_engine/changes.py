"""Change records: one row's insert, update or delete in a database table, as a change data
capture source (operators/postgres_cdc.py) reads them and a sink that understands them
(operators/postgres.py in upsert mode) applies them.

A ``Change`` crosses channels and checkpoints as a msgpack extension (``CHANGE``, whose
payload is the msgpack array of its fields), so it arrives downstream as a ``Change``, not
as a bare tuple.

Invariants:
- ``key`` always holds the row's replica identity (its primary key, or the columns the table
  names for it), as it was *before* the change for a delete, so a consumer can find the row
  the change applies to. A source splits an update that changes a row's key into a DELETE of
  the old key and an INSERT of the new row (as Debezium does): each change then belongs to
  one key, and a stream keyed by ``key`` keeps every key's changes in order.
- ``row`` is the whole row after the change (None for a delete or a truncate); a column the
  server did not send (an unchanged large value) is absent from it unless ``before`` held it.
- Values are bool, int, float, str, bytes or None; every other type (numeric, timestamps,
  JSON, arrays...) is PostgreSQL's own text for it, the same in the snapshot and in the
  stream, which a sink's server parses back.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass
from typing import Any

import msgpack

CHANGE = 2  #: the msgpack extension type of a Change (1 is an Arrow record batch)


class ChangeKind(str, enum.Enum):
    """What a ``Change`` did to its row (a str: ``"insert"``...)."""

    SNAPSHOT = "snapshot"  #: a row of the initial snapshot (it was there before the stream began)
    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"
    TRUNCATE = "truncate"  #: the whole table was emptied (``row`` and ``key`` empty)


@dataclass(frozen=True, slots=True)
class Change:
    """One row's change in a table (see the module docstring); frozen. A source makes
    them; ``Change(kind, table, row, key, ...)`` builds one for a test or an upsert sink."""

    kind: ChangeKind  #: what happened to the row
    table: str  #: ``schema.name``
    row: dict[str, Any] | None  #: the row after the change; None for a delete or a truncate
    key: dict[str, Any]  #: the replica identity's columns (before the change, for a delete or a key move)
    before: dict[str, Any] | None = None  #: the old row or old key, when the server sent it
    lsn: int = 0  #: the commit LSN of the change's transaction (0: a snapshot row)
    committed: float | None = None  #: the transaction's commit time (UNIX seconds); None: a snapshot row

    @property
    def moved_key(self) -> bool:
        """An update that changed the row's key: the row under ``key`` is gone, ``row`` is new."""
        return (self.kind is ChangeKind.UPDATE and self.row is not None
                and any(self.row.get(c, v) != v for c, v in self.key.items()))

    def encode(self) -> msgpack.ExtType:
        packer = getattr(_local, "packer", None)
        if packer is None:
            packer = _local.packer = msgpack.Packer(use_bin_type=True)
        return msgpack.ExtType(CHANGE, packer.pack(
            (self.kind.value, self.table, self.row, self.key, self.before, self.lsn, self.committed)))

    @staticmethod
    def decode(data: bytes) -> "Change":
        """The Change of ``data``, a ``CHANGE`` extension's payload; ValueError if it is not one."""
        try:
            kind, table, row, key, before, lsn, committed = msgpack.unpackb(data, raw=False, use_list=False,
                                                                            strict_map_key=False)
            change = Change(_KINDS[kind], table, row, key, before, lsn, committed)
        except (ValueError, TypeError, KeyError, msgpack.UnpackException) as e:
            raise ValueError(f"a malformed change record ({type(e).__name__}: {e})") from None
        if not (isinstance(table, str) and isinstance(key, dict) and isinstance(lsn, int)
                and (row is None or isinstance(row, dict)) and (before is None or isinstance(before, dict))):
            raise ValueError("a malformed change record (a field of the wrong type)")
        return change


_KINDS = {k.value: k for k in ChangeKind}
#: One packer per thread, reused (a record's encoding is on the hot path; a Packer is not
#: thread-safe, and a task's snapshot writer encodes on a thread of its own).
_local = threading.local()
