"""A task's out-edges: partition a batch over the edge's channels, one frame per channel.

A hash edge sends each record to the consumer subtask that owns its key's key group
(keygroups.py), never by Python's hash(): the same placement in every process, machine and
interpreter, and the one a rescale re-splits state by.

A key function that raises on a record (or makes a key that cannot be placed) is blamed on
``key_by`` (``key_by(fn) of 'consumer'``) and goes through the operators' one rule
(operators/base.py, ``Guarded``) with ``key_by``'s ``on_error``: "fail" names the record
(an unplaceable key fails at once: retrying cannot help), "skip" sends the record nowhere
and notes it in ``skipped``, which the task reports as operators' skipped records are."""

from __future__ import annotations

import struct
from typing import Any, Callable

from operators.base import Guarded, KeyFunction, RecordError, function_label

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


def operator_failure(operator: str, error: BaseException, fatal: bool = False) -> OperatorFailure:
    """The one conversion of what code of ``operator`` raised into the task's failure
    (every call of operator, source and key-function code goes through it).

    A RecordError names its record (the driver digests it: the same record failing again
    after a restart fails the job at once) and is the failure's cause, so the error line
    names the function and the user's exception; the user's exception's ``fatal`` counts.
    An OSError on a record is the cause itself: the worker never takes an I/O error for a
    poison record (it may pass on a retry). Anything else fails the task without a record."""
    if isinstance(error, RecordError):
        cause = error.__cause__
        failure = OperatorFailure(error.operator or operator, fatal or bool(getattr(cause, "fatal", False)),
                                  record=error.record)
        failure.__cause__ = cause if isinstance(cause, OSError) else error
    else:
        failure = OperatorFailure(operator, fatal)
        failure.__cause__ = error
    return failure


ROUTE_CACHE = 1 << 20  #: distinct keys whose channel an Output remembers


class Output(Guarded):
    """One out-edge: partitions a batch over its channels and sends one frame per channel.
    ``key_fn`` may be a ``KeyFunction`` (``key_by(key, on_error="skip")``): its ``on_error``
    applies to the records whose key fails (see the module docstring)."""

    def __init__(self, spec: OutputSpec, channels: list[OutputChannel],
                 key_fn: Callable[[Any], Any] | KeyFunction | None,
                 producer: str, max_parallelism: int = keygroups.DEFAULT_MAX_PARALLELISM):
        self.channels = channels
        self.partition = spec.partition
        self.producer = producer
        self.consumer = spec.key_operator
        if isinstance(key_fn, KeyFunction):
            self.on_error, name, key_fn = key_fn.on_error, key_fn.name, key_fn.fn
        else:
            name = getattr(key_fn, "__name__", type(key_fn).__name__) if key_fn is not None else "record"
        self.key_fn = key_fn
        #: What a key failure names as the operator, and as the function.
        self.label = f"key_by({name}) of {self.consumer!r}"
        self.function = function_label("key", key_fn) if key_fn is not None else "key (the record itself)"
        self.skipped: list[tuple[Any, BaseException]] = []
        self.side = spec.side
        self.rr = 0
        self.markers = 0  #: latency markers sent (they go round the channels)
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

    def _route_each(self, batch: list[Any], first: Exception) -> list[list[Any]]:
        """The slow path, after the key function (or placing a key) raised on ``batch``:
        the batch partitioned record by record, each record whose key fails through
        ``_key_failed`` (skip: it goes to no channel). Order within a channel is the
        batch's, as on the fast path."""
        parts: list[list[Any]] = [[] for _ in self.channels]
        fn = self.key_fn
        failed = False
        for r in batch:
            try:
                key = fn(r) if fn is not None else r
            except Exception as e:
                failed = True
                self._key_failed(r, e)
                continue
            try:
                c = self.route.get(key)
                if c is None:
                    c = self._channel_of(key)
            except KeyTypeError as e:  # deterministic: retrying cannot help
                failed = True
                self._key_failed(r, e, fatal=True)
                continue
            except TypeError as e:
                failed = True
                if "unhashable" not in str(e):
                    self._key_failed(r, e)
                    continue
                self._key_failed(r, TypeError(  # deterministic: retrying cannot help
                    f"the key {type(key).__name__} is unhashable ({e}); key_by needs a hashable key: return a tuple "
                    "or a str instead of a list or dict"), fatal=True)
                continue
            parts[c].append(r)
        if not failed and self.on_error == "fail":
            raise operator_failure(self.label, first)  # no single record fails again: not reproducible
        return parts

    def _key_failed(self, record: Any, e: Exception, fatal: bool = False) -> None:
        """``record``'s key failed with ``e``: skipped (noted), or the task fails blaming key_by."""
        try:
            self.record_failed(record, self.function, e)
        except RecordError as failure:
            raise operator_failure(self.label, failure, fatal)  # noqa: B904 - its cause is the key's error

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
            first = None
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
                first = e
            if first is not None:  # starts over: what the fast path placed is dropped
                parts = self._route_each(batch, first)
            for ch, part in zip(chans, parts):
                if part:
                    self._send(ch, part)
        else:  # rebalance: round robin, a batch at a time
            ch = chans[self.rr % n]
            self._send(ch, batch)
            self.rr += 1

    def send_marker(self, data: bytes) -> None:
        """A latency marker on one of the edge's channels, each in turn (runtime/latency.py)."""
        self.channels[self.markers % len(self.channels)].send(data)
        self.markers += 1

    def broadcast(self, data: bytes) -> None:
        for ch in self.channels:
            ch.send(data)
