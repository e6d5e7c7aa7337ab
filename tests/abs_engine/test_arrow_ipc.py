"""Arrow record batches as msgpack extensions (abs_engine/arrow_ipc.py): in channel frames
and in operator state, round trip exact; anything malformed is a ValueError."""

from __future__ import annotations

import msgpack
import pyarrow as pa
import pytest

from abs_engine import codec
from abs_engine.arrow_ipc import ARROW_BATCH


def sample() -> pa.RecordBatch:
    return pa.record_batch({"word": ["ä", None, "b"], "n": [1, 2, None], "x": [0.5, 1.5, 2.5]})


def test_a_batch_in_a_records_frame_comes_back_equal_beside_other_records() -> None:
    b = sample()
    frame = codec.records_frame([b, ("k", 1), b.slice(1, 2)])
    out = codec.unpack(frame[codec.HEADER_SIZE:])
    assert out[0].equals(b) and out[1] == ("k", 1) and out[2].equals(b.slice(1, 2))
    assert out[0].schema == b.schema


def test_a_batch_in_operator_state_comes_back_equal() -> None:
    state = {"pending": [[3, [sample()]]]}
    back = codec.unpack_state(codec.pack(state))
    assert back["pending"][0][0] == 3 and back["pending"][0][1][0].equals(sample())


@pytest.mark.parametrize("payload", [b"", b"garbage", b"\xff" * 64])
def test_a_malformed_arrow_extension_is_a_value_error_not_an_arrow_one(payload: bytes) -> None:
    with pytest.raises(ValueError, match="malformed Arrow record batch"):
        codec.unpack(msgpack.packb(msgpack.ExtType(ARROW_BATCH, payload)))


def test_two_batches_in_one_extension_are_refused() -> None:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, sample().schema) as w:
        w.write_batch(sample())
        w.write_batch(sample())
    with pytest.raises(ValueError, match="more than one batch"):
        codec.unpack(msgpack.packb(msgpack.ExtType(ARROW_BATCH, sink.getvalue().to_pybytes())))


def test_an_unknown_extension_type_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown msgpack extension type 9"):
        codec.unpack(msgpack.packb(msgpack.ExtType(9, b"x")))


def test_what_msgpack_cannot_encode_is_still_a_type_error() -> None:
    with pytest.raises(TypeError, match="set"):
        codec.records_frame([{1, 2}])
    with pytest.raises(TypeError, match="Table"):
        codec.pack(pa.table({"a": [1]}))
