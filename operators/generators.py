"""Sources that generate their records: replayable by construction."""

from __future__ import annotations

import heapq
from abc import abstractmethod
from typing import Any, Callable, Sequence

from .base import OperatorContext, Source, T
from .progress import SourceProgress


class Progressions:
    """What a subtask has left to read of ``range(stop)``: arithmetic progressions
    ``[next, step]``, read merged in increasing index order (so a subtask's records stay in
    index order after a rescale too: where the index is event time, as in Nexmark, its
    timestamps stay ascending and an ``ascending()`` watermark stays true). Subtask k of p
    starts with one, ``[k, p]``.

    Rescaling pools every old subtask's unread progressions and splits each of them
    ``parallelism`` ways (subtask i takes ``[next + i*step, step*parallelism]``), so every
    unread index goes to exactly one new subtask and the shares stay even."""

    def __init__(self, stop: int, todo: list[list[int]]):
        self.stop = stop
        self.todo = [[a, s] for a, s in todo if a < stop]

    @staticmethod
    def of_subtask(stop: int, index: int, parallelism: int) -> "Progressions":
        return Progressions(stop, [[index, parallelism]])

    @staticmethod
    def from_state(stop: int, state: Any, parallelism: int, index: int) -> "Progressions":
        """From a snapshot: a list of [next, step], or (older checkpoints) the next index
        of this subtask's single progression, step ``parallelism``."""
        if isinstance(state, int):
            return Progressions(stop, [[state, parallelism]])
        return Progressions(stop, [[int(a), int(s)] for a, s in state])

    def take(self, n: int) -> Sequence[int] | None:
        """The next ``n`` (or fewer) unread indices in increasing order, or None when all
        are read."""
        todo = self.todo = [p for p in self.todo if p[0] < self.stop]
        if not todo:
            return None
        if len(todo) == 1:
            a, s = todo[0]
            end = min(self.stop, a + s * n)
            todo[0][0] = a + s * len(range(a, end, s))
            return range(a, end, s)
        out: list[int] = []  # several (after a rescale): merged
        heap = [(a, i) for i, (a, _) in enumerate(todo)]
        heapq.heapify(heap)
        while heap and len(out) < n:
            a, i = heap[0]
            out.append(a)
            todo[i][0] = a + todo[i][1]
            if todo[i][0] < self.stop:
                heapq.heapreplace(heap, (todo[i][0], i))
            else:
                heapq.heappop(heap)
        return out

    def progress(self) -> SourceProgress:
        """The indices left to read, of ``stop`` in all (a list the task thread may be
        changing: read into a copy first)."""
        todo = [(a, s) for a, s in list(self.todo) if a < self.stop]
        left = sum(len(range(a, self.stop, s)) for a, s in todo)
        return SourceProgress(left, self.stop, "records", f"index {min(a for a, _ in todo):,}" if todo else "end")

    def state(self) -> list[list[int]]:
        return [list(p) for p in self.todo]

    @staticmethod
    def rescale(stop: int, old: list[Any], old_parallelism: int, index: int, parallelism: int) -> list[list[int]]:
        pooled: list[list[int]] = []
        for k, state in enumerate(old):
            pooled += Progressions.from_state(stop, state, old_parallelism, k).todo
        return [[a + index * s, s * parallelism] for a, s in pooled if a + index * s < stop]


Owns = Callable[[Any], bool]


class IndexSource(Source[T]):
    """A source of the records at indices ``0 <= i < count`` (``records`` makes them):
    subtask k of p emits those with i % p == k, in increasing order. Its offset is what it
    has left to emit (``Progressions``), which is also what lets it rescale."""

    count: int
    batch_size: int

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self.todo = Progressions.of_subtask(self.count, ctx.subtask_index, ctx.parallelism)

    @abstractmethod
    def records(self, indices: Sequence[int]) -> list[T]:
        """The records at ``indices``."""

    def read_batch(self) -> list[T] | None:
        r = self.todo.take(self.batch_size)
        return None if r is None else self.records(r)

    def snapshot(self, checkpoint_id: int) -> Any:
        return self.todo.state()

    def restore(self, state: Any) -> None:
        self.todo = Progressions.from_state(self.count, state, self.ctx.parallelism, self.ctx.subtask_index)

    def rescale_state(self, old: list[Any], index: int, parallelism: int, owns: Owns) -> Any:
        return Progressions.rescale(self.count, old, len(old), index, parallelism)

    def progress(self) -> SourceProgress:
        return self.todo.progress()


class RangeSource(IndexSource[int]):
    """The integers ``start <= i < stop`` (``stop`` None: ``RangeSource(n)`` is ``0 <= i < n``);
    subtask k of p emits those with i % p == k (relative to start), in increasing order,
    ``batch_size`` per batch (an IndexSource)."""

    def __init__(self, start: int, stop: int | None = None, batch_size: int = 1000):
        if stop is None:
            start, stop = 0, start
        self.start, self.stop, self.batch_size = start, stop, batch_size
        self.count = stop - start

    def records(self, indices: Sequence[int]) -> list[int]:
        if isinstance(indices, range):
            return list(range(self.start + indices.start, self.start + indices.stop, indices.step))
        return [self.start + i for i in indices]

    def restore(self, state: Any) -> None:
        # older checkpoints: the absolute next integer
        super().restore(state - self.start if isinstance(state, int) else state)

    def rescale_state(self, old: list[Any], index: int, parallelism: int, owns: Owns) -> Any:
        return super().rescale_state([s - self.start if isinstance(s, int) else s for s in old], index, parallelism,
                                     owns)
