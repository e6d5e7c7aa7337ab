"""Records the sources read in a run, over every attempt (``JobResult.source_records``).

Each source task reports how many records it read in its attempt, from its restored offset
on (``Progress``, ``Finished``). A new attempt's sources count from zero again: what the
earlier attempts read is kept, so the run's count only grows (records re-read after a
restore count again: they are work done). ``JobResult.attempt_source_records`` holds each
attempt's own count.
"""

from __future__ import annotations

from typing import Iterable

from .config import JobResult


class SourceRecords:
    def __init__(self, result: JobResult):
        self.result = result
        self.attempt: dict[str, int] = {}  #: source task -> records it read in this attempt
        self.before = 0  #: records the sources read in earlier attempts of this run
        #: records read in this attempt by source workers since replaced (a region
        #: restarted alone, executors/regions.py: its new workers count from zero again)
        self.replaced = 0

    def report(self, task: str, records_in: int) -> None:
        """Source task ``task`` has read ``records_in`` records in this attempt."""
        self.attempt[task] = records_in

    def restarted(self, tasks: Iterable[str]) -> None:
        """``tasks`` restart in new workers of the same attempt (a region restarted alone):
        what their old workers read is kept, and the new ones count from zero."""
        for t in tasks:
            self.replaced += self.attempt.pop(t, 0)

    def new_attempt(self) -> None:
        """An attempt starts: the previous one's count is final."""
        self.count()
        self.before += sum(self.attempt.values()) + self.replaced
        self.attempt, self.replaced = {}, 0
        self.result.attempt_source_records.append(0)

    def count(self) -> int:
        """Records the sources read in this run so far, written into the result."""
        this = sum(self.attempt.values()) + self.replaced
        if self.result.attempt_source_records:
            self.result.attempt_source_records[-1] = this
        self.result.source_records = self.before + this
        return self.result.source_records
