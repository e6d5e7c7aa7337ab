"""How a task batches the records of its input frames: gathered across frames and channels
into one batch, as large as allowed, then processed together.

Invariants:
- A batch holds at most ``GATHER_MAX`` records, however many a frame holds: a loop whose
  operators emit more than they take in would otherwise double its batches, and the frames
  they become, on every trip (measured: one batch of 800k records, 400 MB, in 8 s). A frame
  that fits is gathered whole.
- The task flushes what is gathered before it handles any barrier or end of stream
  (runtime/task.py), so every record is processed on the same side of a snapshot as it
  would be alone.
- When unaligned checkpoints can happen (``responsive``) a batch is kept to about
  ``BATCH_WORK`` seconds of work at the measured cost per record, so a trigger waits for at
  most that; before anything was measured, batches are small (``FIRST_BATCH``).
"""

from __future__ import annotations

from typing import Any, Callable

from .clock import Clock

GATHER_MAX = 8192  # records gathered from buffered frames before they are processed
#: With unaligned checkpoints possible, a gathered batch is kept to about this much work
#: (measured per record), so a trigger waits for at most that: a slow stage's batch of
#: GATHER_MAX records could otherwise hold the task for a second.
BATCH_WORK = 0.01
#: Responsive, before a batch has been measured: a small first batch (a slow stage's first
#: batch of GATHER_MAX records could hold up the job's first unaligned checkpoint).
FIRST_BATCH = 64

__all__ = ["BATCH_WORK", "FIRST_BATCH", "GATHER_MAX", "Batcher"]


class Batcher:
    """The records gathered so far (``gathered``) and how many make a batch (``gather_max``)."""

    def __init__(self, responsive: bool, clock: Clock):
        self.responsive, self.clock = responsive, clock
        self.gathered: list[Any] = []
        self.gather_max = FIRST_BATCH if responsive else GATHER_MAX
        self._per_record = 0.0

    def add(self, batch: list[Any], flush: Callable[[], None]) -> None:
        """Gather a frame's ``batch``; ``flush()`` whenever a batch is full (it must empty
        ``gathered``, by ``run``)."""
        i, n = 0, len(batch)
        while len(self.gathered) + n - i > GATHER_MAX:
            j = i + GATHER_MAX - len(self.gathered)
            self.gathered.extend(batch[i:j])
            i = j
            flush()
        self.gathered.extend(batch[i:] if i else batch)
        if len(self.gathered) >= self.gather_max:
            flush()

    def run(self, process: Callable[[list[Any]], None]) -> None:
        """``process`` what is gathered as one batch (measured, when responsive)."""
        batch, self.gathered = self.gathered, []
        if not self.responsive:
            process(batch)
            return
        clock = self.clock
        began = clock.perf_counter()
        process(batch)
        per = (clock.perf_counter() - began) / len(batch)
        self._per_record = per if not self._per_record else 0.8 * self._per_record + 0.2 * per
        self.gather_max = max(1, min(GATHER_MAX, int(BATCH_WORK / max(self._per_record, 1e-9))))
