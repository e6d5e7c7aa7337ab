"""Change records (abs_engine/changes.py) cross channels and checkpoints as themselves: a
msgpack extension that decodes back to an equal Change, in records and in state; a
malformed one is refused. A source that one subtask must read (``max_subtasks``) gets one,
and more is a GraphError naming the fix."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from abs_engine import Dataflow, codec
from abs_engine.changes import CHANGE, Change, ChangeKind
from abs_engine.errors import GraphError
from abs_engine.testing import TestingSource
from operators.base import Source

CHANGES = [
    Change(ChangeKind.SNAPSHOT, "public.t", {"id": 1, "v": "a"}, {"id": 1}),
    Change(ChangeKind.UPDATE, "s.t", {"id": 2, "v": None, "b": b"\x00"}, {"id": 1}, {"id": 1}, 0x1_0000_0020,
           1_795_000_000.25),
    Change(ChangeKind.DELETE, "public.t", None, {"a": 1, "b": "x"}, {"a": 1, "b": "x"}, 40, 0.0),
    Change(ChangeKind.TRUNCATE, "public.t", None, {}, None, 41, 1.0),
]


def test_changes_round_trip_as_records_and_as_state() -> None:
    assert list(codec.unpack(codec.pack(CHANGES))) == CHANGES
    assert codec.unpack_state(codec.pack({"held": CHANGES})) == {"held": CHANGES}
    frame = codec.records_frame(CHANGES)
    assert list(codec.unpack(frame[codec.HEADER_SIZE:])) == CHANGES
    assert type(codec.unpack(codec.pack(CHANGES[0]))) is Change


def test_moved_key() -> None:
    assert CHANGES[1].moved_key
    assert not Change(ChangeKind.UPDATE, "t", {"id": 1, "v": "b"}, {"id": 1}).moved_key
    assert not CHANGES[2].moved_key


@pytest.mark.parametrize("payload", [
    msgpack.packb(["nonsense", "t", None, {}, None, 0, None]),  # not a kind
    msgpack.packb(["insert", "t", None, {}]),  # fields missing
    msgpack.packb(["insert", 5, None, {}, None, 0, None]),  # a table that is not a name
    msgpack.packb(["insert", "t", [1], {}, None, 0, None]),  # a row that is not a map
    b"\xc1",  # not msgpack
])
def test_a_malformed_change_is_refused(payload: bytes) -> None:
    with pytest.raises(ValueError, match="malformed change record"):
        codec.unpack(msgpack.packb(msgpack.ExtType(CHANGE, payload)))


class OneReader(Source[Any]):
    max_subtasks = 1

    def read_batch(self) -> list[Any] | None:
        return None

    def snapshot(self, checkpoint_id: int) -> Any:
        return None

    def restore(self, state: Any) -> None:
        pass


def test_a_single_reader_source_gets_one_subtask_and_refuses_more() -> None:
    flow = Dataflow("one", parallelism=4)
    flow.source(OneReader(), "r")
    flow.source(TestingSource([1]), "others")
    assert flow.graph.nodes["r"].parallelism == 1
    assert flow.graph.nodes["others"].parallelism is None  # the dataflow's default, 4
    with pytest.raises(GraphError, match="at most 1 subtask"):
        Dataflow("two").source(OneReader(), "r", parallelism=2)
