"""Arrow record batches inside msgpack: how a ``pyarrow.RecordBatch`` record crosses a
process or lands in a checkpoint (docs/dataflows.md, "Columnar batches").

A record batch is a msgpack extension (type ``ARROW_BATCH``) whose payload is one Arrow
IPC *stream* (schema, then the batch): columnar buffers copied once into the frame, never
converted to Python objects. Decoding maps the batch onto the frame's bytes (zero copy).

Invariants:
- Only ``pyarrow.RecordBatch`` is encoded this way; anything else msgpack cannot encode
  still raises TypeError (the caller's SerializationError names it).
- pyarrow is imported on first use: a job without Arrow records never loads it.
- A payload that is not one well-formed IPC stream of exactly one batch raises
  ``ValueError`` (the frame's or checkpoint's reader turns it into its typed error), never
  an Arrow exception.
"""

from __future__ import annotations

from typing import Any

import msgpack

ARROW_BATCH = 1  #: the msgpack extension type of an Arrow record batch


def is_record_batch(obj: Any) -> bool:
    """Whether ``obj`` is a ``pyarrow.RecordBatch`` (without importing pyarrow)."""
    t = type(obj)
    return t.__name__ == "RecordBatch" and t.__module__.startswith("pyarrow")


def encode(obj: Any) -> msgpack.ExtType:
    """msgpack's ``default`` hook: a RecordBatch as an extension, else TypeError."""
    if not is_record_batch(obj):
        raise TypeError(f"can not serialize {type(obj).__name__!r} object")
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, obj.schema) as writer:
        writer.write_batch(obj)
    return msgpack.ExtType(ARROW_BATCH, sink.getvalue().to_pybytes())


def decode(code: int, data: bytes) -> Any:
    """msgpack's ``ext_hook``: the RecordBatch of an ``ARROW_BATCH`` extension."""
    if code != ARROW_BATCH:
        raise ValueError(f"unknown msgpack extension type {code} (this version knows {ARROW_BATCH}: Arrow batches, 2: change records)")
    import pyarrow as pa

    try:
        reader = pa.ipc.open_stream(pa.py_buffer(data))
        batch = reader.read_next_batch()
        try:
            reader.read_next_batch()
        except StopIteration:
            batch.validate()
            return batch
    except (pa.ArrowException, StopIteration, OSError) as e:
        raise ValueError(f"a malformed Arrow record batch ({type(e).__name__}: {e})") from None
    raise ValueError("an Arrow record batch extension holds more than one batch")
