"""PostgresCDCSource's reading of a replication stream, without a server: the messages a
walsender would send (built by hand) go through the source's own decoding, offsets and
restore. Exactly once at the level of the stream: a restore from any offset, even inside a
transaction, emits each change once; keepalives move the offset only between
transactions; the stop marker ends the source after its transaction."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from abs_engine import fs
from abs_engine.changes import Change, ChangeKind
from operators import pgoutput
from operators.base import OperatorContext
from operators.postgres_cdc import STOP_PREFIX, PostgresCDCSource
from operators.postgres_slot import MANIFEST, Manifest, TableShape

from . import pgoutput_bytes as pb

OID = 16384
RELATION = pb.relation(OID, "public", "t", [("id", 23, True), ("v", 25, False)])
CONSISTENT = 100


class FakeStream:
    """What Stream.poll would return: the messages queued, then nothing."""

    def __init__(self, messages: list[bytes]):
        self.queue = [pgoutput.copy_message(m) for m in messages]
        self.confirmed: list[int] = []

    def poll(self, wait: float, limit: int = 4096) -> list[Any]:
        out, self.queue = self.queue[:limit], self.queue[limit:]
        return out

    def confirm(self, lsn: int, reply: bool = False) -> None:
        self.confirmed.append(lsn)

    def close(self) -> None:
        pass


def source(tmp_path: Path, messages: list[bytes], state: Any = None) -> tuple[PostgresCDCSource, FakeStream]:
    staging = tmp_path / "staging"
    d = fs.open_dir(str(staging), private=True)
    d.make_root()
    d.put((MANIFEST,), Manifest("s1", CONSISTENT, (TableShape("public.t", ("id", "v"), (23, 25), ("id",)),),
                                ()).pack())
    src = PostgresCDCSource("postgresql://u@127.0.0.1:1/db", ["t"], "s1", staging)
    src.open(OperatorContext("cdc", 0, 1, 0, state is not None))
    if state is not None:
        src.restore(state)
    stream = FakeStream(messages)
    src._stream = stream  # type: ignore[assignment]
    return src, stream


def read_all(src: PostgresCDCSource) -> list[Change]:
    out: list[Change] = []
    while (batch := src.read_batch()) is not None and (batch or src._stream.queue):  # type: ignore[union-attr]
        out.extend(batch)
    return out


def txn(final: int, end: int, *changes: bytes) -> list[bytes]:
    return [pb.xlog(pb.begin(final)), *(pb.xlog(c) for c in changes), pb.xlog(pb.commit(final, end))]


def ids(changes: list[Change]) -> list[tuple[str, Any]]:
    return [(c.kind.value, (c.row or c.key)["id"]) for c in changes]


def test_changes_are_typed_and_the_offset_follows_commits(tmp_path: Path) -> None:
    msgs = [pb.xlog(RELATION), *txn(110, 120, pb.insert(OID, [1, "a"]), pb.update(OID, [1, "b"])),
            *txn(130, 140, pb.delete(OID, [1, None]))]
    src, _ = source(tmp_path, msgs)
    got = read_all(src)
    assert [c.kind for c in got] == [ChangeKind.INSERT, ChangeKind.UPDATE, ChangeKind.DELETE]
    assert got[0] == Change(ChangeKind.INSERT, "public.t", {"id": 1, "v": "a"}, {"id": 1}, None, 110,
                            pgoutput.PG_EPOCH)
    assert got[2].row is None and got[2].key == {"id": 1} and got[2].before == {"id": 1}
    assert src.snapshot(1) == {"chunk": 0, "row": 0, "lsn": 140, "skip": 0}


def test_a_restore_inside_a_transaction_emits_each_change_once(tmp_path: Path) -> None:
    first = txn(110, 120, pb.insert(OID, [1, "a"]))
    second = txn(130, 160, *(pb.insert(OID, [i, "x"]) for i in range(2, 7)))
    src, stream = source(tmp_path, [pb.xlog(RELATION), *first, *second[:4]])  # stops after 3 changes of the second
    before = read_all(src)
    state = src.snapshot(1)
    assert state["lsn"] == 120 and state["skip"] == 3
    # the server replays from the offset's LSN, and may send the first transaction again
    again, _ = source(tmp_path, [pb.xlog(RELATION), *first, *second], state=state)
    after = read_all(again)
    assert ids(before + after) == [("insert", i) for i in range(1, 7)]
    assert again.snapshot(2)["lsn"] == 160 and again.snapshot(2)["skip"] == 0


def test_keepalives_move_the_offset_only_between_transactions(tmp_path: Path) -> None:
    second = txn(130, 160, pb.insert(OID, [2, "x"]), pb.insert(OID, [3, "y"]))
    msgs = [pb.xlog(RELATION), *txn(110, 120, pb.insert(OID, [1, "a"])), pb.keepalive(125), *second[:2],
            pb.keepalive(150), *second[2:], pb.keepalive(170, reply=True)]
    src, stream = source(tmp_path, msgs[:5])
    read_all(src)
    assert src.snapshot(1)["lsn"] == 125  # idle between transactions: everything before 125 has come
    stream.queue += [pgoutput.copy_message(m) for m in msgs[5:8]]
    read_all(src)
    assert src.snapshot(2) == {"chunk": 0, "row": 0, "lsn": 125, "skip": 1}  # inside one: not moved
    stream.queue += [pgoutput.copy_message(m) for m in msgs[8:]]
    read_all(src)
    assert src.snapshot(3)["lsn"] == 170
    src.notify_checkpoint_complete(2)
    assert stream.confirmed[-1] == 125  # only what a completed checkpoint holds; the reply re-sent it
    assert 170 not in stream.confirmed


def test_a_key_move_is_a_delete_and_an_insert_and_truncates(tmp_path: Path) -> None:
    full = pb.relation(OID, "public", "t", [("id", 23, True), ("v", 25, False)])
    msgs = [pb.xlog(full), *txn(110, 120, pb.update(OID, [9, "<unchanged>"], old=[1, "big"], old_kind=b"O"),
                                pb.update(OID, [10, "<unchanged>"], old=[9, None]), pb.truncate(OID))]
    src, _ = source(tmp_path, msgs)
    gone, moved, gone2, keyed, trunc = read_all(src)
    # a key move is a delete of the old key and an insert under the new one
    assert (gone.kind, gone.key, gone.row, gone.before) == (ChangeKind.DELETE, {"id": 1}, None, {"id": 1, "v": "big"})
    assert (moved.kind, moved.row, moved.key) == (ChangeKind.INSERT, {"id": 9, "v": "big"}, {"id": 9})
    assert (gone2.kind, gone2.key) == (ChangeKind.DELETE, {"id": 9})
    assert keyed.row == {"id": 10} and keyed.key == {"id": 10}  # the unchanged value is not known: left out
    assert trunc.kind is ChangeKind.TRUNCATE and trunc.table == "public.t"


def test_the_stop_marker_ends_the_source_after_its_transaction(tmp_path: Path) -> None:
    msgs = [pb.xlog(RELATION), *txn(110, 120, pb.insert(OID, [1, "a"])),
            *txn(130, 140, pb.logical_message(STOP_PREFIX, b"other-slot")),
            *txn(150, 160, pb.insert(OID, [2, "b"]), pb.logical_message(STOP_PREFIX, b"s1")),
            *txn(170, 180, pb.insert(OID, [3, "c"]))]
    src, _ = source(tmp_path, msgs)
    got: list[Change] = []
    while (batch := src.read_batch()) is not None:
        got.extend(batch)
    assert ids(got) == [("insert", 1), ("insert", 2)]
    assert src.snapshot(1)["lsn"] == 160
