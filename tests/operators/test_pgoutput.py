"""The pgoutput decoder (operators/pgoutput.py) on messages built by hand: every message
kind, NULLs and unchanged TOASTed values, values by type, LSN text, and malformed input
refused as ProtocolViolation, never turned into a record."""

from __future__ import annotations

import pytest

from operators import pgoutput
from operators.pgoutput import ProtocolViolation

from . import pgoutput_bytes as pb

REL = pgoutput.Relation(16384, "public.t", ("id", "v", "n", "b"), (23, 25, 1700, 16), ("id",))


def decode(data: bytes) -> pgoutput.Message:
    return pgoutput.message(data, {REL.oid: REL}.__getitem__)


def test_relation_names_its_columns_types_and_key() -> None:
    m = decode(pb.relation(16384, "public", "t", [("id", 23, True), ("v", 25, False), ("n", 1700, False),
                                                   ("b", 16, False)]))
    assert m == REL


def test_begin_and_commit_carry_lsns_and_unix_times() -> None:
    b = decode(pb.begin(0x1_0000_0010, ts=1_000_000))
    assert b == pgoutput.Begin(0x1_0000_0010, pgoutput.PG_EPOCH + 1.0)
    c = decode(pb.commit(0x10, 0x48, ts=2_500_000))
    assert c == pgoutput.Commit(0x10, 0x48, pgoutput.PG_EPOCH + 2.5)


def test_rows_decode_by_type_with_nulls_and_unchanged_values() -> None:
    assert decode(pb.insert(16384, [1, "x", "12.50", "t"])) == pgoutput.RowChange(
        "insert", 16384, (1, "x", "12.50", True), None, False)
    u = decode(pb.update(16384, [2, None, "<unchanged>", "f"], old=[1, None, None, None]))
    assert isinstance(u, pgoutput.RowChange)
    assert u.new == (2, None, pgoutput.UNCHANGED, False) and u.old == (1, None, None, None) and u.old_is_key
    full = decode(pb.update(16384, [2, "y", "1", "t"], old=[2, "x", "1", "t"], old_kind=b"O"))
    assert isinstance(full, pgoutput.RowChange) and not full.old_is_key and full.old == (2, "x", "1", True)
    d = decode(pb.delete(16384, [3, None, None, None]))
    assert d == pgoutput.RowChange("delete", 16384, None, (3, None, None, None), True)


def test_truncate_and_logical_messages() -> None:
    assert decode(pb.truncate(16384, 16385)) == pgoutput.Truncate((16384, 16385))
    assert decode(pb.logical_message("abs-engine.stop", b"slot1")) == pgoutput.LogicalMessage("abs-engine.stop",
                                                                                               b"slot1")
    assert decode(b"Y" + b"\0" * 8) is None  # a type announcement: nothing for us


@pytest.mark.parametrize("oid, text, value", [
    (23, "-7", -7), (20, "9223372036854775807", 2**63 - 1), (21, "3", 3), (700, "1.5", 1.5),
    (701, "-Infinity", float("-inf")), (16, "f", False), (25, "héllo", "héllo"), (1043, "", ""),
    (17, "\\x00ff", b"\x00\xff"), (1700, "1.10", "1.10"), (1184, "2026-11-27 04:00:00+00", "2026-11-27 04:00:00+00"),
    (3802, '{"a": [1, 2]}', '{"a": [1, 2]}'), (1007, "{1,2}", "{1,2}"),
])
def test_values_by_type(oid: int, text: str, value: object) -> None:
    assert pgoutput.value(oid, text) == value


def test_lsn_text_round_trips() -> None:
    for lsn in (0, 0x16B3748, 0x1_0000_0000, 0xFFFF_FFFF_FFFF_FFFF):
        assert pgoutput.parse_lsn(pgoutput.lsn_text(lsn)) == lsn
    assert pgoutput.parse_lsn("0/16B3748") == 0x16B3748


def test_copy_messages_and_the_status_we_send() -> None:
    assert pgoutput.copy_message(pb.xlog(b"B...", 5, 9)) == pgoutput.XLogData(5, 9, b"B...")
    assert pgoutput.copy_message(pb.keepalive(77, reply=True)) == pgoutput.Keepalive(77, True)
    status = pgoutput.standby_status(0x48, pgoutput.PG_EPOCH + 1.0)
    assert status[:1] == b"r" and len(status) == 34
    assert int.from_bytes(status[9:17], "big") == 0x48  # flushed: what the slot may drop


@pytest.mark.parametrize("data", [
    pb.insert(16384, [1, "x", "1", "t"])[:-2],  # cut short
    pb.insert(16384, [1, "x", "1"]),  # a column missing
    b"I" + (16384).to_bytes(4, "big") + b"X",  # not a new row
    b"D" + (16384).to_bytes(4, "big") + b"N" + pb.tuple_data([1, None, None, None]),  # a delete with no old key
    b"Z",  # unknown
    pb.insert(16384, ["one", "x", "1", "t"]),  # not an int
    pb.insert(16384, [1, "x", "1", "t"]).replace(b"t\x00", b"b\x00", 1),  # binary mode, not asked for
])
def test_malformed_messages_are_refused(data: bytes) -> None:
    with pytest.raises(ProtocolViolation):
        decode(data)


def test_a_change_of_an_unannounced_relation_is_refused() -> None:
    def unknown(oid: int) -> pgoutput.Relation:
        raise ProtocolViolation(f"relation {oid} never described")

    with pytest.raises(ProtocolViolation, match="never described"):
        pgoutput.message(pb.insert(99, [1]), unknown)
    with pytest.raises(ProtocolViolation):
        pgoutput.copy_message(b"q")
    with pytest.raises(ProtocolViolation):
        pgoutput.copy_message(b"w\0\0")
