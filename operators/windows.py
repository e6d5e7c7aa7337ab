"""Event-time windows per key: tumbling, sliding and session; reduce, aggregate or a
process-window function; allowed lateness; late records on a side output.

Semantics (Flink's, with its EventTimeTrigger):

- A window is ``[start, end)``; its last timestamp is ``end - 1``. A record belongs to the
  windows its timestamp falls in (one tumbling, ``size / slide`` sliding, one session
  window that merges with every session of its key it touches: ``gap`` after a record,
  inclusive).
- A window fires when the watermark reaches ``end - 1``. It is kept ``allowed_lateness``
  more: a record for it that arrives meanwhile fires it again at once, with the updated
  result. At ``end - 1 + allowed_lateness`` it is purged.
- A record none of whose windows is still kept is late: it goes to the side output
  (``.late``) if the dataflow takes it, otherwise it is dropped and reported (as a
  skipped record: the job's ``skipped_records`` counts it and the log names it). Never
  silently.
- Results: reduce and aggregate emit ``(key, start, end, value)``; a process-window
  function ``fn(key, start, end, records)`` emits what it returns. The results of one
  watermark come out in (timer timestamp, key encoding) order: a deterministic order.

State: per key, its windows ``[start, end, accumulator]`` (a process-window function's
accumulator is the window's records), its timers and the watermark: exactly what a
restore needs to fire each window once with the same contents. Sliding windows of an
aggregate with ``merge`` (size a multiple of the slide) are kept as panes of one slide,
``[pane start, pane end, accumulator]``: a record updates one pane, and a window merges
its panes, in start order, into a fresh accumulator when it fires.

User functions that raise (operators/base.py, ``Guarded``; ``on_error`` of ``reduce``,
``aggregate`` or ``process``, the key function's of ``key_by``):

- On a record (its key, its timestamp, or the functions that add it to its windows, and
  the result of a window it fires again because it came late): the record is named, and
  a skipped record leaves its key's windows and the output as they were. A window's
  (pane's, session's) new accumulator is computed before it is stored; what a record
  stored before a later function of it raised (an earlier of its sliding windows, or a
  pane whose window then fires again) is put back, and its output dropped. A timer that a
  window or pane put back registered stays: when it fires it finds nothing, or a window
  that registered the same timer. The one exception: a function that changes its
  accumulator argument in place before it or a later function of the same record raises
  (an ``add`` that appends to its accumulator, then a ``result`` that raises on a late
  re-fire; a ``merge`` of sessions that updates its first argument, then an ``add`` that
  raises) leaves that change.
- When a window fires (``result``, ``process``, or merging panes): the window ``(key,
  start, end)`` is named as the record (a restore fires it again: a repeat is a poison
  record). Skipped, that window's output is left out and it is purged as it would be.
"""

from __future__ import annotations

from typing import Any

from .window_assigners import SessionWindows, SlidingWindows, TumblingWindows, Windows
from .window_base import _CREATED, AGGREGATE, PROCESS, REDUCE, LateRecord
from .window_panes import PaneWindows
from .window_sessions import SessionMerging

#: What the window operator's users give it or get from it (the assigners, the kinds,
#: LateRecord): they import them from here, wherever they are defined. WindowOperator,
#: defined here, is the engine's (``KeyedStream.window`` makes it): not in the reference.
__all__ = ["AGGREGATE", "PROCESS", "REDUCE", "LateRecord", "SessionWindows", "SlidingWindows", "TumblingWindows",
           "Windows"]


class WindowOperator(SessionMerging, PaneWindows):
    """Windows of one key function (see the module docstring). ``kind`` is REDUCE
    (``fn(acc, record)``), AGGREGATE (``create``, ``add``, ``result``, ``merge``) or PROCESS
    (``fn(key, start, end, records)``). What every kind of window shares is in
    ``WindowBase`` (``operators/window_base.py``), sessions' merging in ``SessionMerging``,
    panes in ``PaneWindows``; here: a batch of records, sliding windows' undo, firing, and
    restoring."""

    #: both of its process paths record the keys they touch (incremental checkpoints:
    #: operators/timers.py)
    tracks_keys = True

    def process(self, batch: list[Any]) -> list[Any]:
        if self.panes:
            return self._process_panes(batch)
        out: list[Any] = []
        key_fn, ts_fn, state = self.key_fn, self.timestamp, self.state
        sessions = self.sessions
        w = self.windows
        size = 0 if sessions else w.size  # type: ignore[union-attr]
        slide = getattr(w, "slide", size)
        offset = getattr(w, "offset", 0)
        # Invariants of this batch (the watermark moves between batches only): a window is
        # kept while its end > keep_after, and has fired once its end <= fired_upto.
        fired_upto = self.watermark + 1
        keep_after = fired_upto - self.allowed_lateness
        proc = self.kind == PROCESS
        fn = self.fn
        olds: list[Any] = []  #: sliding windows: a record's undo list (below), one list for the batch
        changed = self.changed
        for record in batch:
            if key_fn is None:
                key = record
            else:
                try:
                    key = key_fn(record)
                except Exception as e:
                    self.record_failed(record, self._label("key"), e, self.key_on_error)
                    continue
            if changed is not None:
                changed.add(key)
            try:
                ts = ts_fn(record)
                # The latest window's start (then one slide earlier each); a session's: the
                # timestamp. Arithmetic on a timestamp that is no number fails here, as its.
                start = ts - (ts - offset) % slide if slide else ts - 0
            except Exception as e:
                self.record_failed(record, self._label("timestamp"), e)
                continue
            wins = state.get(key)
            if wins is None:
                wins = state[key] = {}
            if sessions:
                accepted = self._add_to_session(key, wins, ts, record, out)
            elif slide == size:  # tumbling: one window, its new accumulator computed, then stored
                end = start + size
                accepted = end > keep_after
                if accepted:
                    win = wins.get(start)
                    try:
                        acc = None if win is None else win[2]
                        # (reduce and add alike on a window that has records; else _updated)
                        new = fn(acc, record) if win is not None and not proc else \
                            self._updated(acc, record, win is None)
                        again = self._emit(key, [start, end, self._with(acc, new, record)]) \
                            if end <= fired_upto else None  # fired already, still kept: again
                    except Exception as e:
                        self.record_failed(record, self._function_of(e), e)  # skipped: nothing changed
                    else:  # (the commit: no user function runs from here)
                        if win is None:
                            wins[start] = [start, end, [record] if proc else new]
                            self._timers_for(key, end, fired_upto)
                        elif proc:
                            win[2].append(record)
                        else:
                            win[2] = new
                        if again:
                            out.extend(again)
            else:
                # Sliding: window after window (latest first), each one's new accumulator
                # computed, then stored, its old one noted in ``olds``. The kept windows are
                # a prefix of that order (their ends only decrease), so ``olds[i]`` is the
                # window starting at ``latest - i * slide``. If a function raises, the windows
                # changed before it are put back (the ones it created dropped): the key's
                # windows are as they were; output waits until every one succeeded. (A timer
                # of a dropped window stays: fire() looks its window up and finds nothing.)
                olds.clear()
                refired: list[Any] | None = None
                latest = start
                try:
                    while start > ts - size:
                        end = start + size
                        if end > keep_after:
                            win = wins.get(start)
                            if win is None:
                                win = [start, end, [record] if proc else self._updated(None, record, True)]
                                wins[start] = win
                                olds.append(_CREATED)
                                self._timers_for(key, end, fired_upto)
                            elif proc:
                                olds.append(len(win[2]))
                                win[2].append(record)
                            else:
                                olds.append(win[2])
                                win[2] = fn(win[2], record)  # (reduce and add alike, on a window that has records)
                            if end <= fired_upto:  # fired already, still kept: fire again with this record
                                if refired is None:
                                    refired = []
                                refired.extend(self._emit(key, win))
                        start -= slide
                except Exception as e:
                    self._put_back(wins, latest, olds)
                    self.record_failed(record, self._function_of(e), e)
                    accepted = True  # skipped, not late
                else:
                    if refired:
                        out.extend(refired)
                    accepted = bool(olds)
            if not wins:
                del state[key]
                self.sessions_of.pop(key, None)
            if not accepted:
                self._late(record, ts)
        return out

    def _put_back(self, wins: dict[Any, list[Any]], latest: Any, olds: list[Any]) -> None:
        """Undo a record's changes to sliding windows: ``olds[i]`` is what the window
        starting at ``latest - i * slide`` held (``_CREATED``: it did not exist; for a
        process function, how many records it had)."""
        slide = self.windows.slide  # type: ignore[union-attr]
        for i, old in enumerate(olds):
            start = latest - i * slide
            if old is _CREATED:
                del wins[start]
            elif self.kind == PROCESS:
                del wins[start][2][old:]
            else:
                wins[start][2] = old

    # -- firing -----------------------------------------------------------------------------

    def fire(self, key: Any, timestamp: float, domain: int) -> list[Any]:
        """The key's window whose last timestamp is ``timestamp`` fires; the one whose
        lateness ends there is purged (every window registered both timers when it took its
        final end). Fixed-size windows are found by their start (exact: whole parameters),
        sessions in their index of timer times (a merged session's old timers find nothing,
        or the session that now ends there)."""
        wins = self.state.get(key)
        if not wins:
            return []
        out: list[Any] = []
        if self.sessions:
            _, fire_at, purge_at = self.sessions_of[key]
            start = fire_at.get(timestamp)
            if start is not None:
                session = wins[start]
                try:
                    out.extend(self._emit(key, session))
                except Exception as e:
                    self._fire_failed(key, session[0], session[1], e)
            start = purge_at.get(timestamp)
            if start is not None:
                self._drop_session(key, wins, wins[start])
        elif self.panes:
            size = self.windows.size  # type: ignore[union-attr]
            try:
                out.extend(self._emit_panes(key, wins, timestamp + 1))
            except Exception as e:
                self._fire_failed(key, timestamp + 1 - size, timestamp + 1, e)
            wins.pop(timestamp + 1 - self.allowed_lateness - size, None)  # its last window is purged
        else:
            size = self.windows.size  # type: ignore[union-attr]
            w = wins.get(timestamp + 1 - size)
            if w is not None:
                try:
                    out.extend(self._emit(key, w))
                except Exception as e:
                    self._fire_failed(key, w[0], w[1], e)
                if not self.allowed_lateness:
                    del wins[w[0]]
            if self.allowed_lateness:
                wins.pop(timestamp + 1 - self.allowed_lateness - size, None)
        if not wins:
            del self.state[key]
            self.sessions_of.pop(key, None)
        return out

    # -- state ------------------------------------------------------------------------------

    def keyed_state(self) -> dict[Any, Any]:
        """key -> start -> its window (or pane) ``[start, end, acc]``: the live map, not a
        copy. The task encodes it, or forks a process that does, before the next record, so
        a checkpoint's share of the task thread stays small however many windows are open."""
        return self.state

    def restore_keyed(self, values: dict[Any, Any]) -> None:
        # Decoded windows are tuples: lists again (and a process function's records too).
        proc = self.kind == PROCESS
        self.state = {k: {w[0]: [w[0], w[1], list(w[2]) if proc else w[2]] for w in wins.values()}
                      for k, wins in values.items()}
        self.sessions_of = {}
        if self.sessions:
            for k, wins in self.state.items():
                for w in wins.values():
                    self._index_session(k, w)
