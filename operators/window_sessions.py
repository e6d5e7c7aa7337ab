"""Session windows (``operators/windows.py`` gives the semantics): a record's session
``[ts, ts + gap)`` merges with every session of its key it touches, and the index of a
key's sessions that finds the ones a record touches and the one a timer fires or purges."""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from typing import Any

from .timers import EVENT
from .window_base import AGGREGATE, PROCESS, REDUCE, WindowBase


class SessionMerging(WindowBase):
    """A window operator's sessions: its state is key -> start -> session ``[start, end,
    acc]``, and ``sessions_of`` indexes each key's sessions (``WindowBase.__init__``
    says how). ``WindowOperator.process`` adds a record with ``_add_to_session``."""

    def _add_to_session(self, key: Any, wins: dict[Any, list[Any]], ts: Any, record: Any, out: list[Any]) -> bool:
        start, end = ts, ts + self.windows.gap  # type: ignore[union-attr]
        starts = self.sessions_of[key][0] if key in self.sessions_of else []
        # The sessions it touches: starting at or before its end, ending at or after its start
        # (a few, found from the right in start order: however many the key has open).
        touching: list[list[Any]] = []
        i = bisect_right(starts, end)
        while i > 0 and wins[starts[i - 1]][1] >= start:
            i -= 1
            touching.append(wins[starts[i]])
        touching.reverse()  # merged in start order: the same in every run and after a restore
        for w in touching:
            start, end = min(start, w[0]), max(end, w[1])
        if self._is_late(end):
            return False
        # The merged session's accumulator (and its output if it fired already) before any
        # session is changed: a function that raises leaves the key's sessions as they were.
        acc: Any = None
        try:
            for w in touching:
                acc = w[2] if acc is None else self._merged(acc, w[2])
            new = self._updated(acc, record, acc is None)
            again = self._emit(key, [start, end, self._with(acc, new, record)]) if end - 1 <= self.watermark else None
        except Exception as e:
            self.record_failed(record, self._function_of(e), e)
            return True  # skipped, not late
        for w in touching:
            self._drop_session(key, wins, w)
        merged = wins[start] = [start, end, self._committed(acc, new, record)]
        self._index_session(key, merged)
        self._timers_for(key, end, self.watermark + 1)
        if again:
            out.extend(again)
        return True

    def _merged(self, a: Any, b: Any) -> Any:
        if self.kind == REDUCE:
            return self.fn(a, b)
        if self.kind == AGGREGATE:
            return self.merge(a, b)  # type: ignore[misc]
        return a + b

    def _committed(self, acc: Any, new: Any, record: Any) -> Any:
        """The accumulator to store: ``new``, or a process function's records with ``record``."""
        if self.kind != PROCESS:
            return new
        if acc is None:
            return [record]
        acc.append(record)
        return acc

    def _is_late(self, end: Any) -> bool:
        return bool(end - 1 + self.allowed_lateness <= self.watermark)

    def _index_session(self, key: Any, w: list[Any]) -> None:
        """Session ``w`` of ``key`` into the key's index (made on its first session)."""
        index = self.sessions_of.get(key)
        if index is None:
            fire_at: dict[Any, Any] = {}
            index = self.sessions_of[key] = ([], fire_at, {} if self.allowed_lateness else fire_at)
        starts, fire_at, purge_at = index
        insort(starts, w[0])
        fire_at[w[1] - 1] = w[0]
        purge_at[w[1] - 1 + self.allowed_lateness] = w[0]

    def _drop_session(self, key: Any, wins: dict[Any, list[Any]], w: list[Any]) -> None:
        """Session ``w`` of ``key`` is gone (merged into a new one, or purged): its timers
        too. Invariant: a key's timers are those of its live sessions (one to fire, one to
        purge), so timer state stays as small as the sessions; an extended session does not
        leave a timer behind for each record that extended it. (Its new end's timers are
        registered after this: a merged session that ends where an old one did keeps them.)"""
        starts, fire_at, purge_at = self.sessions_of[key]
        del wins[w[0]]
        del starts[bisect_left(starts, w[0])]
        fire_at.pop(w[1] - 1, None)
        purge_at.pop(w[1] - 1 + self.allowed_lateness, None)
        self.timers.delete(EVENT, key, w[1] - 1)
        if self.allowed_lateness:
            self.timers.delete(EVENT, key, w[1] - 1 + self.allowed_lateness)
