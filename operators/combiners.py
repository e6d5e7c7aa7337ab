"""Combiners: the first half of a final count, run in the upstream task before the shuffle
(as Spark's ``reduceByKey`` combines map-side). ``count_final`` always has one (the plan
shows it as ``<name>_pre``, chained to the operator before it).

- ``PreCount``: counts records per key in C (``Counter.update``) across the batches it
  is given, and sends ``(key, n)`` pairs on only when it has counted ``FLUSH_RECORDS``
  records or holds ``FLUSH_KEYS`` keys, and at the end of the input. A word count then
  sends one pair per distinct word of a few hundred thousand words, not a record per word:
  the per-record routing, framing and decoding of the shuffle are paid per pair.
- ``SumCounts``: the keyed half: adds the pairs up per key; ``(key, count)`` once per key at
  the end. Its state is ``CountFinal``'s (key -> count), incremental like it.

Checkpoints: the counts a ``PreCount`` holds at a barrier are its snapshot (they were not
sent: the barrier follows everything it sent), so a restore resumes with them and nothing
is counted twice or lost. They are pre-shuffle partials, so on a rescale any new subtask
may hold them: the old subtasks' counts are summed into new subtask 0's.
"""

from __future__ import annotations

from collections import Counter
from operator import itemgetter
from typing import Any

from .base import Operator, Owns, RecordError
from .keyed import CountFinal, KeyFn, apply_key_fn

FLUSH_RECORDS = 1 << 18  #: records a PreCount counts before it sends its pairs on
FLUSH_KEYS = 1 << 15  #: ... or distinct keys it holds


class PreCount(Operator):
    """``count_final``'s combiner (see the module docstring)."""

    def __init__(self, key_fn: KeyFn = None, blame: str | None = None):
        self.key_fn = key_fn
        #: What a failing key function is blamed on: key_by of the count (its on_error applies)
        self.blame = blame
        self.counts: Counter[Any] = Counter()
        self.counted = 0

    def _keys(self, batch: list[Any]) -> list[Any]:
        if self.key_fn is None:
            return batch
        try:
            return apply_key_fn(self, self.key_fn, batch)[0]
        except RecordError as e:
            e.operator = self.blame
            raise

    def process(self, batch: list[Any]) -> list[Any]:
        keys = self._keys(batch)
        try:
            self.counts.update(keys)  # counted in C
        except TypeError:  # an unhashable key: sent as it is, the shuffle fails naming key_by
            return self._flush() + [(k, 1) for k in keys]
        self.counted += len(keys)
        if self.counted >= FLUSH_RECORDS or len(self.counts) >= FLUSH_KEYS:
            return self._flush()
        return []

    def _flush(self) -> list[Any]:
        out = list(self.counts.items())
        self.counts = Counter()
        self.counted = 0
        return out

    def finish(self) -> list[Any]:
        return self._flush()

    def snapshot(self, checkpoint_id: int) -> Any:
        return dict(self.counts) if self.counts else None

    def restore(self, state: Any) -> None:
        self.counts = Counter(dict(state)) if state else Counter()
        self.counted = sum(self.counts.values())

    def rescale_state(self, old: list[Any], index: int, parallelism: int, owns: Owns) -> Any:
        if index != 0:
            return None
        total: Counter[Any] = Counter()
        for state in old:
            if state:
                total.update(dict(state))
        return dict(total) or None


class SumCounts(CountFinal):
    """``count_final``'s keyed half: adds up its combiners' ``(key, n)`` pairs; ``(key,
    count)`` once per key at the end."""

    def __init__(self) -> None:
        super().__init__(itemgetter(0))

    def process(self, batch: list[Any]) -> list[Any]:
        state = self.state
        for k, n in batch:
            state[k] += n
        if self.changed is not None:
            self.changed.update(map(itemgetter(0), batch))  # (a set: the keys this batch touched)
        return []
