"""Sources that generate their records: replayable by construction."""

from __future__ import annotations

from typing import Any

from .base import OperatorContext, Source


class RangeSource(Source):
    """The integers ``start <= i < stop``; subtask k of p emits those with i % p == k
    (relative to start), in increasing order. Its offset is the next integer to emit."""

    def __init__(self, start: int, stop: int | None = None, batch_size: int = 1000):
        if stop is None:
            start, stop = 0, start
        self.start, self.stop, self.batch_size = start, stop, batch_size

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self.step = ctx.parallelism
        self.next = self.start + ctx.subtask_index

    def read_batch(self) -> list[Any] | None:
        if self.next >= self.stop:
            return None
        end = min(self.stop, self.next + self.step * self.batch_size)
        batch = list(range(self.next, end, self.step))
        self.next += self.step * len(batch)
        return batch

    def snapshot(self, checkpoint_id: int) -> Any:
        return self.next

    def restore(self, state: Any) -> None:
        self.next = int(state)
