"""msgpack encoding for everything that crosses a process boundary or touches disk.

Invariants:
- No pickle: channel frames, control messages and checkpoint files are msgpack only.
- In records (``unpack``) msgpack arrays decode as tuples (hashable, so they can be keys):
  a list a user emits arrives downstream as a tuple. In operator state (``unpack_state``)
  arrays decode as lists, as the operator snapshotted them, except map keys (tuples).
  Maps may have non-string keys.
- Two msgpack extensions carry typed records: ``pyarrow.RecordBatch`` (arrow_ipc.py) and
  ``Change`` (changes.py); anything else msgpack cannot encode raises TypeError.
- A frame on the wire is ``!IB`` (payload length, kind) followed by the payload.
- Arrow record batches (``pyarrow.RecordBatch`` records) travel as a msgpack extension
  holding an Arrow IPC stream (arrow_ipc.py): columnar, never converted row by row.
- A reader refuses a frame whose header announces more than its ``max_frame`` bytes before
  it buffers the payload (ProtocolError(FRAME_TOO_LARGE)); writers split record batches so
  that no legitimate frame comes near the bound.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack

from . import arrow_ipc
from .changes import CHANGE, Change
from .errors import ProtocolError, ProtocolErrorReason

HEADER = struct.Struct("!IB")
HEADER_SIZE = HEADER.size
MAX_FRAME = 256 << 20  #: data frames (record batches); a batch is split long before this
MAX_CONTROL_FRAME = 16 << 20  #: what the driver accepts from a worker (acks, failures, counts)


def _default(obj: Any) -> msgpack.ExtType:
    """msgpack's ``default`` hook: the typed records as extensions, else TypeError."""
    if type(obj) is Change:
        return obj.encode()
    return arrow_ipc.encode(obj)


def _ext_hook(code: int, data: bytes) -> Any:
    """msgpack's ``ext_hook``: a Change or a RecordBatch; ValueError for anything else."""
    if code == CHANGE:
        return Change.decode(data)
    return arrow_ipc.decode(code, data)


class FrameKind:
    RECORDS = 0  #: payload: msgpack array of records
    BARRIER = 1  #: payload: msgpack int (checkpoint id), or [id, 1] when unaligned
    END = 2  #: payload: empty; end of stream on this channel
    CONTROL = 3  #: payload: msgpack control message (see messages.py)
    HELLO = 4  #: payload: msgpack channel id, first frame on a data connection
    WATERMARK = 5  #: payload: msgpack number (event time; the input is active), or nil: idle
    LATENCY = 6  #: payload: msgpack number, the wall time a source sent this latency marker


def pack(obj: Any) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True, default=_default)
    return data


def unpack(data: bytes | memoryview) -> Any:
    return msgpack.unpackb(data, raw=False, use_list=False, strict_map_key=False, ext_hook=_ext_hook)


def frame(kind: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(len(payload), kind) + payload


def records_frame(batch: list[Any]) -> bytes:
    payload: bytes = msgpack.packb(batch, use_bin_type=True, default=_default)
    return HEADER.pack(len(payload), FrameKind.RECORDS) + payload


def _array_head(payload: bytes) -> tuple[int, int]:
    """(elements, header bytes) of the msgpack array ``payload`` starts with."""
    first = payload[0]
    if 0x90 <= first <= 0x9F:
        return first & 0x0F, 1
    if first == 0xDC:
        return int.from_bytes(payload[1:3], "big"), 3
    if first == 0xDD:
        return int.from_bytes(payload[1:5], "big"), 5
    raise ValueError(f"not a msgpack array (first byte 0x{first:02x})")


def array_length(payload: bytes) -> int:
    """The number of elements of the msgpack array ``payload`` (a RECORDS frame's batch),
    read from its header alone."""
    return _array_head(payload)[0]


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def join_arrays(payloads: list[bytes]) -> bytes:
    """One msgpack array of every element of the arrays ``payloads`` (logged frames become
    one packed list of records without decoding them)."""
    if len(payloads) == 1:
        return payloads[0]
    total, bodies = 0, []
    for p in payloads:
        n, head = _array_head(p)
        total += n
        bodies.append(memoryview(p)[head:])
    return _array_header(total) + b"".join(bodies)


def barrier_payload(checkpoint_id: int, unaligned: bool) -> bytes:
    """A barrier's payload: the checkpoint id, and ``[id, 1]`` for an unaligned checkpoint's
    barrier (its receiver snapshots at once instead of aligning)."""
    return pack([checkpoint_id, 1] if unaligned else checkpoint_id)


def parse_barrier(payload: bytes) -> tuple[int, bool]:
    v = unpack(payload)
    if isinstance(v, int) and not isinstance(v, bool):
        return v, False
    if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], int):
        return v[0], bool(v[1])
    raise ProtocolError(ProtocolErrorReason.MALFORMED, f"a barrier frame carries {v!r}, not a checkpoint id")


def watermark_frame(watermark: float | None) -> bytes:
    """A watermark frame: ``watermark`` (the sender is active), or None: the sender is idle."""
    return frame(FrameKind.WATERMARK, pack(watermark))


def latency_frame(created: float) -> bytes:
    """A latency marker (runtime/latency.py): the wall time a source sent it."""
    return frame(FrameKind.LATENCY, pack(created))


def parse_latency(payload: bytes) -> float:
    v = unpack(payload)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    raise ProtocolError(ProtocolErrorReason.MALFORMED, f"a latency marker carries {v!r}, not a time")


def parse_watermark(payload: bytes) -> float | None:
    v = unpack(payload)
    if v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)):
        return v
    raise ProtocolError(ProtocolErrorReason.MALFORMED, f"a watermark frame carries {v!r}, not a number or nil")


class FrameReader:
    """Incremental parser of length-prefixed frames read from a byte stream.

    ``feed`` appends bytes; ``next_frame`` returns (kind, payload) or None when the
    buffer does not hold a whole frame yet. Frames come out in the order they went in.
    """

    __slots__ = ("_buf", "_pos", "max_frame")

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self._pos = 0
        self.max_frame = max_frame

    def feed(self, data: bytes) -> None:
        if self._pos and self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        elif self._pos > 1 << 20:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def next_frame(self) -> tuple[int, bytes] | None:
        buf, pos = self._buf, self._pos
        if len(buf) - pos < HEADER_SIZE:
            return None
        length, kind = HEADER.unpack_from(buf, pos)
        if length > self.max_frame:
            raise ProtocolError(ProtocolErrorReason.FRAME_TOO_LARGE,
                                f"a frame of {length:,} bytes exceeds the maximum of {self.max_frame:,}")
        end = pos + HEADER_SIZE + length
        if len(buf) < end:
            return None
        payload = bytes(buf[pos + HEADER_SIZE : end])
        self._pos = end
        return kind, payload

    def take_rest(self) -> bytes:
        """The bytes buffered after the last frame (to hand them to another reader)."""
        rest = bytes(self._buf[self._pos:])
        self._buf.clear()
        self._pos = 0
        return rest

    def buffered(self) -> int:
        return len(self._buf) - self._pos


def freeze(obj: Any) -> Any:
    """A decoded key made hashable: lists (msgpack arrays) become tuples, recursively (a
    key was hashable, so an array in it was a tuple)."""
    if isinstance(obj, list):
        return tuple(freeze(v) for v in obj)
    return obj


def _state_map(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    try:
        return dict(pairs)
    except TypeError:  # a key is an array: freeze it (values stay lists)
        return {freeze(k): v for k, v in pairs}


def unpack_state(data: bytes | memoryview) -> Any:
    """Operator state as the operator snapshotted it, as far as msgpack can tell: arrays
    decode as *lists* (state is mutable), except map keys, which decode as tuples (they
    must be hashable). Records use ``unpack`` (arrays as tuples) instead."""
    try:  # fast path: no map has an array as a key
        return msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=False, ext_hook=_ext_hook)
    except TypeError:  # unhashable key: build maps through the hook, which freezes keys
        return msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=False, object_pairs_hook=_state_map,
                               ext_hook=_ext_hook)
