"""Tests of abs_engine/codec.py (msgpack, frames) and abs_engine/messages.py (control messages)."""

from __future__ import annotations

import dataclasses
import math
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from abs_engine import codec, messages
from abs_engine.api import Dataflow
from abs_engine.codec import FrameKind, FrameReader, pack
from operators.base import Sink, Source

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------------------------------
# FrameReader
# ---------------------------------------------------------------------------------------

frames_st = st.lists(
    st.tuples(st.integers(0, 255), st.binary(max_size=300)),
    max_size=20,
)


def drain(reader: FrameReader) -> list[tuple[int, bytes]]:
    out = []
    while (f := reader.next_frame()) is not None:
        out.append(f)
    return out


def wire(frames: list[tuple[int, bytes]]) -> bytes:
    return b"".join(codec.frame(kind, payload) for kind, payload in frames)


def test_frame_layout() -> None:
    data = codec.frame(FrameKind.BARRIER, codec.pack(7))
    length, kind = struct.unpack("!IB", data[:5])
    assert kind == FrameKind.BARRIER
    assert codec.HEADER_SIZE == 5
    assert length == len(data) - codec.HEADER_SIZE
    assert codec.unpack(data[codec.HEADER_SIZE:]) == 7
    assert codec.frame(FrameKind.END) == struct.pack("!IB", 0, FrameKind.END)


@SETTINGS
@given(frames_st)
def test_frames_fed_byte_by_byte(frames: list[tuple[int, bytes]]) -> None:
    r = FrameReader()
    got = []
    data = wire(frames)
    for i in range(len(data)):
        r.feed(data[i : i + 1])
        got += drain(r)
        # a frame only comes out once all its bytes are in
        assert sum(codec.HEADER_SIZE + len(p) for _, p in got) <= i + 1
    assert got == frames
    assert r.buffered() == 0
    assert r.next_frame() is None


@SETTINGS
@given(frames_st, st.lists(st.integers(1, 64), min_size=1), st.booleans())
def test_frames_fed_in_random_chunks(
    frames: list[tuple[int, bytes]], sizes: list[int], drain_each_time: bool
) -> None:
    data = wire(frames)
    r = FrameReader()
    got: list[tuple[int, bytes]] = []
    pos, i = 0, 0
    while pos < len(data):
        n = sizes[i % len(sizes)]
        i += 1
        r.feed(data[pos : pos + n])
        pos += n
        if drain_each_time:
            got += drain(r)
            # whatever was fed and not yet returned as a frame is still buffered
            assert r.buffered() == min(pos, len(data)) - sum(codec.HEADER_SIZE + len(p) for _, p in got)
    got += drain(r)
    assert got == frames
    assert r.buffered() == 0


def test_partial_frame_is_held_back() -> None:
    r = FrameReader()
    data = codec.frame(FrameKind.RECORDS, b"abcdef")
    r.feed(data[:3])  # not even a header
    assert r.next_frame() is None
    r.feed(data[3:8])  # header and part of the payload
    assert r.next_frame() is None
    assert r.buffered() == 8
    r.feed(data[8:] + data[:2])  # the rest, and the start of the next frame
    assert r.next_frame() == (FrameKind.RECORDS, b"abcdef")
    assert r.next_frame() is None
    assert r.buffered() == 2
    r.feed(data[2:])
    assert r.next_frame() == (FrameKind.RECORDS, b"abcdef")


def test_large_frames_survive_buffer_compaction() -> None:
    # frames of ~300 KB fed in chunks of 1.5 MB: the reader compacts its buffer while
    # a partial frame is pending, which must not lose or reorder bytes.
    frames = [(i % 5, bytes([i]) * (300_000 + 7 * i)) for i in range(12)]
    data = wire(frames)
    r = FrameReader()
    got: list[tuple[int, bytes]] = []
    step = 1_500_001
    for pos in range(0, len(data), step):
        r.feed(data[pos : pos + step])
        got += drain(r)
    assert got == frames
    assert r.buffered() == 0


def test_records_frame_matches_frame() -> None:
    batch = ["a", 1, [2, 3], {"k": None}]
    data = codec.records_frame(batch)
    assert data == codec.frame(FrameKind.RECORDS, codec.pack(batch))
    r = FrameReader()
    r.feed(data)
    kind, payload = r.next_frame()  # type: ignore[misc]
    assert kind == FrameKind.RECORDS
    assert codec.unpack(payload) == ("a", 1, (2, 3), {"k": None})


# ---------------------------------------------------------------------------------------
# pack / unpack
# ---------------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
)
keys = st.recursive(
    st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=8), st.binary(max_size=8)),
    lambda k: st.tuples(k, k),
    max_leaves=4,
)
values = st.recursive(
    scalars,
    lambda v: st.one_of(st.lists(v, max_size=5), st.tuples(v, v), st.dictionaries(keys, v, max_size=5)),
    max_leaves=15,
)


def as_decoded(x: Any) -> Any:
    """What msgpack gives back: arrays as tuples, maps as dicts, the rest unchanged."""
    if isinstance(x, (list, tuple)):
        return tuple(as_decoded(v) for v in x)
    if isinstance(x, dict):
        return {as_decoded(k): as_decoded(v) for k, v in x.items()}
    return x


def same(a: Any, b: Any) -> bool:
    """Equality that also tells list from tuple, int from bool, and 0.0 from -0.0."""
    if type(a) is not type(b):
        return False
    if isinstance(a, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return len(a) == len(b) and all(k in b and same(v, b[k]) for k, v in a.items())
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return a == b


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values)
def test_pack_unpack_round_trip(x: Any) -> None:
    y = codec.unpack(codec.pack(x))
    assert same(y, as_decoded(x)), (x, y)
    # decoding is stable: what comes back re-encodes to the same bytes
    assert codec.pack(y) == codec.pack(x)
    assert same(codec.unpack(memoryview(codec.pack(x))), y)


def test_lists_come_back_as_tuples_and_can_be_keys() -> None:
    y = codec.unpack(codec.pack({(1, "a"): [1, [2]], 3: b"x", b"k": "v"}))
    assert y == {(1, "a"): (1, (2,)), 3: b"x", b"k": "v"}
    assert type(y[(1, "a")]) is tuple and type(y[(1, "a")][1]) is tuple
    assert type(y[3]) is bytes and type(y[b"k"]) is str


def test_pack_rejects_objects() -> None:
    with pytest.raises(TypeError):
        codec.pack(object())
    with pytest.raises(TypeError):
        codec.pack({1, 2})


# ---------------------------------------------------------------------------------------
# control messages
# ---------------------------------------------------------------------------------------


class _Src(Source):
    def read_batch(self) -> list[Any] | None:
        return None

    def snapshot(self, checkpoint_id: int) -> Any:
        return 0

    def restore(self, state: Any) -> None:
        pass


class _Sink(Sink):
    def process(self, batch: list[Any]) -> list[Any]:
        return []


def _plan_dict() -> dict[str, Any]:
    flow = Dataflow("msg", parallelism=2)
    flow.source(_Src(), name="src").key_by().count(name="count").sink(_Sink(), name="out", parallelism=1)
    return flow.compile().to_dict()


text = st.text(max_size=30)
i64 = st.integers(-(2**63), 2**63 - 1)
port = st.integers(0, 65535)
restore_st = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {"checkpoint_id": st.integers(1, 10**6), "path": text, "size": st.integers(0, 2**40), "sha256": text}
    ),
)

MESSAGE_STRATEGIES: dict[type[messages.Message], st.SearchStrategy[Any]] = {
    messages.Deploy: st.builds(
        messages.Deploy,
        plan=st.just(_plan_dict()),
        code=st.binary(max_size=100),
        peers=st.dictionaries(text, st.tuples(text, port), max_size=5),
        restore=restore_st,
        restore_final=st.booleans(),
        checkpoint_dir=text,
    ),
    messages.Trigger: st.builds(messages.Trigger, checkpoint_id=i64),
    messages.NotifyComplete: st.builds(messages.NotifyComplete, checkpoint_id=i64, final=st.booleans()),
    messages.Shutdown: st.builds(messages.Shutdown),
    messages.Hello: st.builds(messages.Hello, task=text, generation=i64, host=text, port=port, pid=i64),
    messages.Running: st.builds(messages.Running, task=text),
    messages.Ack: st.builds(
        messages.Ack,
        checkpoint_id=i64,
        task=text,
        file=text,
        size=st.integers(0, 2**63 - 1),
        sha256=text,
        alignment_ms=st.floats(allow_nan=False),
        logged=st.integers(0, 2**63 - 1),
        finished=st.booleans(),
    ),
    messages.Finished: st.builds(messages.Finished, task=text, records_in=i64, records_out=i64,
                                 late=st.dictionaries(text, i64, max_size=3)),
    messages.Progress: st.builds(messages.Progress, task=text, records_in=i64, records_out=i64),
    messages.Committed: st.builds(messages.Committed, task=text),
    messages.InputsEnded: st.builds(messages.InputsEnded, task=text),
    messages.EndLoop: st.builds(messages.EndLoop, checkpoint_id=i64),
    messages.Pause: st.builds(messages.Pause, checkpoint_id=i64),
    messages.Resume: st.builds(messages.Resume, checkpoint_id=i64),
    messages.CountRequest: st.builds(messages.CountRequest, wave=i64),
    messages.Snapshot: st.builds(messages.Snapshot, checkpoint_id=i64),
    messages.Counts: st.builds(messages.Counts, task=text, wave=i64,
                               sent=st.dictionaries(text, st.integers(0, 2**63 - 1), max_size=3),
                               received=st.dictionaries(text, st.integers(0, 2**63 - 1), max_size=3)),
    messages.Failed: st.builds(messages.Failed, task=text, cause=st.sampled_from(messages.FailureCause),
                               operator=st.none() | text, traceback=text, fatal=st.booleans(),
                               record=text, digest=text, peer=st.none() | text),
    messages.Heartbeat: st.builds(messages.Heartbeat, task=text, late=st.dictionaries(text, i64, max_size=3)),
    messages.Skipped: st.builds(messages.Skipped, task=text, operator=text, record=text, error=text),
    messages.Latency: st.builds(messages.Latency, task=text, ms=st.floats(0, 1e9)),
}


def test_every_message_class_is_covered_and_registered() -> None:
    defined = set(messages.Message.__subclasses__())
    assert set(MESSAGE_STRATEGIES) == defined
    assert set(messages._REGISTRY.values()) == defined
    tags = [cls.TAG for cls in defined]
    assert all(tags) and len(set(tags)) == len(tags)


def decode_frame(data: bytes) -> messages.Message:
    r = FrameReader()
    r.feed(data)
    f = r.next_frame()
    assert f is not None and r.buffered() == 0
    kind, payload = f
    assert kind == FrameKind.CONTROL
    return messages.decode(payload)


@pytest.mark.parametrize("cls", list(MESSAGE_STRATEGIES), ids=lambda c: c.__name__)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_message_round_trip(cls: type[messages.Message], data: st.DataObject) -> None:
    msg = data.draw(MESSAGE_STRATEGIES[cls])
    back = decode_frame(messages.encode(msg))
    assert type(back) is cls
    assert back == msg
    for f in dataclasses.fields(msg):
        assert type(getattr(back, f.name)) is type(getattr(msg, f.name)), f.name


def test_deploy_plan_survives_the_wire() -> None:
    from abs_engine.plan import Plan

    plan = _plan_dict()
    msg = messages.Deploy(plan, b"code", {"src#0": ("127.0.0.1", 4000)}, None, False, "/tmp/ck")
    back = decode_frame(messages.encode(msg))
    assert isinstance(back, messages.Deploy)
    assert Plan.from_dict(back.plan) == Plan.from_dict(plan)
    assert back.peers == {"src#0": ("127.0.0.1", 4000)}
    assert type(back.peers["src#0"]) is tuple


@pytest.mark.parametrize("payload", [
    b"", b"\xc1", pack(42), pack([]), pack([7, 1]), pack(["no-such-tag", 1]), pack(["ack", 1]),
    pack(["failed", "t", "op"]), pack({"tag": "ack"}),
    pack(["failed", "t", "no-such-cause", None, "tb", False]),  # a cause that is not one
    pack(["failed", "t", 3, None, "tb", False]),
    pack(["hello", {"a": 1}, 0, "h", 1, 2]),  # a task that is a map: it would crash a dict lookup
    pack(["ack", "1", "t", "f", 1, "0" * 64, 0.0, 0, False]),  # a checkpoint id that is a string
])
def test_malformed_control_messages_raise_protocol_error_never_anything_else(payload: bytes) -> None:
    from abs_engine.errors import ProtocolError, ProtocolErrorReason

    with pytest.raises(ProtocolError) as info:
        messages.decode(payload)
    assert info.value.reason is ProtocolErrorReason.MALFORMED


def test_frame_reader_refuses_an_oversized_frame_before_buffering_it() -> None:
    from abs_engine.errors import ProtocolError, ProtocolErrorReason

    r = FrameReader(max_frame=1024)
    r.feed(codec.HEADER.pack(1536 << 20, FrameKind.RECORDS) + b"x" * 10)  # announces 1.5 GiB
    with pytest.raises(ProtocolError) as info:
        r.next_frame()
    assert info.value.reason is ProtocolErrorReason.FRAME_TOO_LARGE
    ok = FrameReader(max_frame=1024)
    ok.feed(codec.frame(FrameKind.RECORDS, b"y" * 1024))
    assert ok.next_frame() == (FrameKind.RECORDS, b"y" * 1024)
