"""A task's out-edges: partition a batch over the edge's channels, one frame per channel.

A hash edge sends each record to the consumer subtask that owns its key's key group
(keygroups.py), never by Python's hash(): the same placement in every process, machine and
interpreter, and the one a rescale re-splits state by."""

from __future__ import annotations

import struct
from typing import Any, Callable

from .. import codec, keygroups
from ..errors import KeyTypeError, SerializationError
from ..plan import OutputSpec
from .channel import OutputChannel


_NO_RECORD = object()


class OperatorFailure(Exception):
    """User code of ``operator`` raised (the cause holds the user's exception). ``record``
    is the record it failed on, when known."""

    def __init__(self, operator: str, fatal: bool = False, record: Any = _NO_RECORD):
        super().__init__(operator)
        self.operator = operator
        self.fatal = fatal
        self.record = record

    @property
    def has_record(self) -> bool:
        return self.record is not _NO_RECORD


ROUTE_CACHE = 1 << 20  #: distinct keys whose channel an Output remembers


class Output:
    """One out-edge: partitions a batch over its channels and sends one frame per channel."""

    def __init__(self, spec: OutputSpec, channels: list[OutputChannel], key_fn: Callable[[Any], Any] | None,
                 producer: str, max_parallelism: int = keygroups.DEFAULT_MAX_PARALLELISM):
        self.channels = channels
        self.partition = spec.partition
        self.key_fn = key_fn
        self.producer = producer
        self.consumer = spec.key_operator
        self.side = spec.side
        self.rr = 0
        self.max_parallelism = max_parallelism
        #: key group -> channel (the consumer subtask that owns the group)
        self.owner = keygroups.owners(max_parallelism, len(channels)) if len(channels) > 1 else [0]
        #: key -> channel: a key's group is a pure function of its value, so it is worked
        #: out once per distinct key (bounded; cleared when full)
        self.route: dict[Any, int] = {}

    def _channel_of(self, key: Any) -> int:
        if len(self.route) >= ROUTE_CACHE:
            self.route.clear()
        c = self.route[key] = self.owner[keygroups.key_group(key, self.max_parallelism)]
        return c

    def _send(self, ch: OutputChannel, batch: list[Any]) -> None:
        """One frame, or several if the batch encodes above the frame bound (a reader
        refuses bigger frames); counted as sent before the send, as before."""
        try:
            frame = codec.records_frame(batch)
        except (TypeError, ValueError, OverflowError) as e:
            raise OperatorFailure(self.producer, fatal=True) from SerializationError("a record", self.producer, str(e))
        except struct.error:  # 4 GiB or more: split like any batch over the bound
            frame = b""
            too_big = True
        else:
            too_big = len(frame) - codec.HEADER_SIZE > codec.MAX_FRAME
        if too_big:
            if len(batch) > 1:
                half = len(batch) // 2
                self._send(ch, batch[:half])
                self._send(ch, batch[half:])
                return
            raise OperatorFailure(self.producer, fatal=True, record=batch[0]) from SerializationError(
                "a record", self.producer, f"it encodes to more than the {codec.MAX_FRAME:,}-byte frame limit")
        ch.records += len(batch)
        ch.send(frame)

    def _key_failure(self, batch: list[Any], e: Exception) -> OperatorFailure:
        """Which record made the key function (or hashing its key) fail: blame key_by."""
        fn = self.key_fn
        label = f"key_by({getattr(fn, '__name__', type(fn).__name__) if fn else 'record'}) of {self.consumer!r}"
        for r in batch:
            try:
                key = fn(r) if fn is not None else r
                hash(key)
                keygroups.key_group(key, self.max_parallelism)
            except KeyTypeError as kte:  # deterministic: retrying cannot help
                failure = OperatorFailure(label, fatal=True, record=r)
                failure.__cause__ = kte
                return failure
            except TypeError as te:
                if "unhashable" in str(te):  # deterministic: retrying cannot help
                    err = TypeError(f"the key {type(fn(r) if fn else r).__name__} is unhashable ({te}); "
                                    "key_by needs a hashable key: return a tuple or a str instead of a list or dict")
                    failure = OperatorFailure(label, fatal=True, record=r)
                    failure.__cause__ = err
                    return failure
                failure = OperatorFailure(label, record=r)
                failure.__cause__ = te
                return failure
            except Exception as ke:
                failure = OperatorFailure(label, record=r)
                failure.__cause__ = ke
                return failure
        failure = OperatorFailure(label)
        failure.__cause__ = e
        return failure

    def emit(self, batch: list[Any]) -> None:
        chans = self.channels
        n = len(chans)
        if n == 1:
            self._send(chans[0], batch)
        elif self.partition == "hash":
            parts: list[list[Any]] = [[] for _ in range(n)]
            appends = [p.append for p in parts]
            key_fn = self.key_fn
            get, slow = self.route.get, self._channel_of
            try:
                if key_fn is None:
                    for r in batch:
                        c = get(r)
                        appends[slow(r) if c is None else c](r)
                else:
                    for r in batch:
                        k = key_fn(r)
                        c = get(k)
                        appends[slow(k) if c is None else c](r)
            except Exception as e:
                raise self._key_failure(batch, e)  # noqa: B904 - its cause is the key function's error
            for ch, part in zip(chans, parts):
                if part:
                    self._send(ch, part)
        else:  # rebalance: round robin, a batch at a time
            ch = chans[self.rr % n]
            self._send(ch, batch)
            self.rr += 1

    def broadcast(self, data: bytes) -> None:
        for ch in self.channels:
            ch.send(data)
