"""Sliding windows kept as panes (``operators/windows.py`` gives the semantics): an
aggregate with ``merge`` whose size is a multiple of its slide keeps one accumulator per
pane of one slide, ``[pane start, pane end, acc]``; a record updates its pane, and a window
merges its panes, in start order, into a fresh accumulator when it fires."""

from __future__ import annotations

from typing import Any

from .timers import EVENT
from .window_assigners import SlidingWindows
from .window_base import _CREATED, WindowBase


class PaneWindows(WindowBase):
    """A window operator's panes: its state is key -> pane start -> ``[start, end, acc]``.
    ``WindowOperator.process`` hands its batch to ``_process_panes`` when ``self.panes``."""

    def _process_panes(self, batch: list[Any]) -> list[Any]:
        out: list[Any] = []
        key_fn, ts_fn, state, add, create = self.key_fn, self.timestamp, self.state, self.fn, self.create
        assert create is not None
        w: SlidingWindows = self.windows  # type: ignore[assignment]
        size, slide, offset = w.size, w.slide, w.offset
        fired_upto = self.watermark + 1
        keep_after = fired_upto - self.allowed_lateness
        for record in batch:
            try:
                ts = ts_fn(record)
                ps = ts - (ts - offset) % slide
            except Exception as e:
                self.record_failed(record, self._label("timestamp"), e)
                continue
            if ps + size <= keep_after:  # every window of its pane is purged
                self._late(record, ts)
                continue
            if key_fn is None:
                key = record
            else:
                try:
                    key = key_fn(record)
                except Exception as e:
                    self.record_failed(record, self._label("key"), e, self.key_on_error)
                    continue
            if self.changed is not None:
                self.changed.add(key)
            wins = state.get(key)
            if wins is None:
                wins = state[key] = {}
            pane = wins.get(ps)
            # The pane's new accumulator is stored only once computed (a function that
            # raises changes nothing); ``old`` puts it back if a window fires again and fails.
            if pane is not None:
                old = pane[2]
                try:
                    pane[2] = add(old, record)
                except Exception as e:
                    self.record_failed(record, self._function_of(e), e)  # skipped: nothing changed
                    continue
            else:
                old = _CREATED
                try:
                    new = add(create(), record)
                except Exception as e:
                    if not wins:
                        del state[key]
                    self.record_failed(record, self._function_of(e), e)  # skipped: nothing changed
                    continue
                pane = wins[ps] = [ps, ps + slide, new]
                end = ps + slide
                while end <= ps + size:  # the ends of the windows it is part of
                    if end > fired_upto:
                        self.timers.register(EVENT, key, end - 1)
                    end += slide
                if self.allowed_lateness:  # purged with the last of them
                    self.timers.register(EVENT, key, ps + size - 1 + self.allowed_lateness)
            if ps + slide <= fired_upto:  # some of its windows fired and are kept: again, updated
                n = len(out)
                try:
                    end = ps + size  # (latest first, as without panes)
                    while end >= ps + slide:
                        if keep_after < end <= fired_upto:
                            out.extend(self._emit_panes(key, wins, end))
                        end -= slide
                except Exception as e:  # nothing of this record stays: its output, its pane's change
                    del out[n:]
                    if old is _CREATED:
                        del wins[ps]  # (its timers stay: fire() finds no pane, or the same timers)
                        if not wins:
                            del state[key]
                    else:
                        pane[2] = old
                    self.record_failed(record, self._function_of(e), e)
        return out

    def _emit_panes(self, key: Any, wins: dict[Any, list[Any]], end: Any) -> list[Any]:
        """The window [end - size, end) from its panes, merged in start order into a fresh
        accumulator (a merge may update its first argument; panes stay as they are)."""
        size, slide = self.windows.size, self.windows.slide  # type: ignore[union-attr]
        acc, found = self.create(), False  # type: ignore[misc]
        ps = end - size
        while ps < end:
            pane = wins.get(ps)
            if pane is not None:
                acc, found = self.merge(acc, pane[2]), True  # type: ignore[misc]
            ps += slide
        return self._emit(key, [end - size, end, acc]) if found else []
