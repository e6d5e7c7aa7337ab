"""A ``JobResult`` as plain msgpack data and back: how a supervised driver, a process of
its own (executors/supervisor.py), hands its result to the caller's process. Data, never
pickle: the decoder builds only the dataclasses and enums of the result's own field types.

``to_data`` turns dataclasses into maps of their fields, enums into their values, tuples
into lists; ``from_data`` rebuilds them from the field types (``typing.get_type_hints``),
and raises ValueError for anything that does not fit them.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any

from .. import codec, errors
from ..errors import AbsEngineError, JobFailed
from .result import JobResult

MAX_RESULT = 64 << 20  #: bytes of an encoded result read at most


def to_data(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_data(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [to_data(v) for v in obj]
    if isinstance(obj, dict):
        return {to_data(k): to_data(v) for k, v in obj.items()}
    return obj


def from_data(cls: Any, data: Any) -> Any:
    origin = typing.get_origin(cls)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(cls)
        if data is None and type(None) in options:
            return None
        for option in options:
            if option is not type(None):
                try:
                    return from_data(option, data)
                except (ValueError, TypeError):
                    continue
        raise ValueError(f"{data!r} fits none of {cls}")
    if origin in (list, tuple):
        args = typing.get_args(cls)
        if not isinstance(data, (list, tuple)):
            raise ValueError(f"expected a list for {cls}, got {type(data).__name__}")
        items = [from_data(args[0] if args else Any, v) for v in data]
        return items if origin is list else tuple(items)
    if origin is dict:
        k, v = typing.get_args(cls)
        if not isinstance(data, dict):
            raise ValueError(f"expected a map for {cls}, got {type(data).__name__}")
        return {from_data(k, key): from_data(v, value) for key, value in data.items()}
    if cls is Any:
        return data
    if isinstance(cls, type) and issubclass(cls, enum.Enum):
        return cls(data)
    if isinstance(cls, type) and dataclasses.is_dataclass(cls):
        if not isinstance(data, dict):
            raise ValueError(f"expected a map for {cls.__name__}, got {type(data).__name__}")
        hints = typing.get_type_hints(cls)
        known = {f.name for f in dataclasses.fields(cls) if f.init}
        return cls(**{name: from_data(hints[name], value) for name, value in data.items() if name in known})
    if cls is float and isinstance(data, int) and not isinstance(data, bool):
        return float(data)
    if isinstance(cls, type) and not isinstance(data, cls):
        raise ValueError(f"expected {cls.__name__}, got {type(data).__name__}")
    return data


def encode(result: JobResult) -> bytes:
    return codec.pack(to_data(result))


def decode(data: bytes) -> JobResult:
    if len(data) > MAX_RESULT:
        raise ValueError(f"a job result of {len(data)} bytes (at most {MAX_RESULT})")
    result: JobResult = from_data(JobResult, codec.unpack(data))
    return result


def error_to_data(e: BaseException) -> dict[str, Any]:
    """What a supervised driver says of the error that ended its job: its type's name, its
    message, and its attributes (plain values, the engine's reason enums by value)."""
    attrs: dict[str, Any] = {}
    for name, value in vars(e).items():
        if isinstance(value, enum.Enum):
            attrs[name] = {"$enum": type(value).__name__, "value": value.value}
        elif value is None or isinstance(value, (str, int, float, bool)):
            attrs[name] = value
        elif isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float)) for v in value):
            attrs[name] = list(value)
    return {"type": type(e).__name__, "message": str(e), "attrs": attrs}


def error_from_data(d: Any) -> AbsEngineError:
    """The same error in the supervisor's process: one of the engine's own error types (so
    that ``except CheckpointError`` and its ``reason`` still work), with its attributes;
    anything else a JobFailed naming its type. Only types of abs_engine.errors are built."""
    if not isinstance(d, dict) or not isinstance(d.get("type"), str) or not isinstance(d.get("message"), str):
        return JobFailed(f"the supervised driver failed and said {d!r:.300}")
    kind, message = d["type"], d["message"]
    cls = getattr(errors, kind, None)
    if not (isinstance(cls, type) and issubclass(cls, AbsEngineError)):
        return JobFailed(f"the supervised driver failed: {kind}: {message}")
    err: AbsEngineError = cls.__new__(cls)
    Exception.__init__(err, message)
    attrs = d.get("attrs")
    for name, value in (attrs.items() if isinstance(attrs, dict) else ()):
        if not isinstance(name, str) or name.startswith("_"):
            continue
        if isinstance(value, dict):
            kind_of = getattr(errors, str(value.get("$enum")), None)
            if not (isinstance(kind_of, type) and issubclass(kind_of, enum.Enum)):
                continue
            try:
                value = kind_of(value.get("value"))
            except ValueError:
                continue
        elif isinstance(value, (list, tuple)):
            value = tuple(value)
        setattr(err, name, value)
    return err
