"""A task's out-edges: partition a batch over the edge's channels, one frame per channel."""

from __future__ import annotations

from typing import Any, Callable

from .. import codec
from ..errors import SerializationError
from ..plan import OutputSpec
from .channel import OutputChannel


class OperatorFailure(Exception):
    """User code of ``operator`` raised (the cause holds the user's exception)."""

    def __init__(self, operator: str, fatal: bool = False):
        super().__init__(operator)
        self.operator = operator
        self.fatal = fatal


class Output:
    """One out-edge: partitions a batch over its channels and sends one frame per channel."""

    def __init__(self, spec: OutputSpec, channels: list[OutputChannel], key_fn: Callable[[Any], Any] | None, producer: str):
        self.channels = channels
        self.partition = spec.partition
        self.key_fn = key_fn
        self.producer = producer
        self.rr = 0

    def _frame(self, batch: list[Any]) -> bytes:
        try:
            return codec.records_frame(batch)
        except (TypeError, ValueError, OverflowError) as e:
            raise OperatorFailure(self.producer, fatal=True) from SerializationError("a record", self.producer, str(e))

    def emit(self, batch: list[Any]) -> None:
        chans = self.channels
        n = len(chans)
        if n == 1:
            chans[0].records += len(batch)
            chans[0].send(self._frame(batch))
        elif self.partition == "hash":
            parts: list[list[Any]] = [[] for _ in range(n)]
            appends = [p.append for p in parts]
            key_fn = self.key_fn
            try:
                if key_fn is None:
                    for r in batch:
                        appends[hash(r) % n](r)
                else:
                    for r in batch:
                        appends[hash(key_fn(r)) % n](r)
            except Exception as e:
                raise OperatorFailure(self.producer) from e
            for ch, part in zip(chans, parts):
                if part:
                    ch.records += len(part)
                    ch.send(self._frame(part))
        else:  # rebalance: round robin, a batch at a time
            ch = chans[self.rr % n]
            ch.records += len(batch)
            ch.send(self._frame(batch))
            self.rr += 1

    def broadcast(self, data: bytes) -> None:
        for ch in self.channels:
            ch.send(data)
