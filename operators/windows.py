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

from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass
from typing import Any, Callable

from .base import check_on_error, function_label, raised_in
from .timers import EVENT, TimedOperator

REDUCE, AGGREGATE, PROCESS = "reduce", "aggregate", "process"
_CREATED = object()  #: in a record's undo list: the window did not exist before it


class LateRecord(Exception):
    """A record came after every window it belongs to was purged (its job takes no ``.late``
    stream): reported as a skipped record."""


@dataclass(frozen=True)
class TumblingWindows:
    size: int
    offset: int = 0

    def __post_init__(self) -> None:
        _whole("size", self.size)
        _whole("offset", self.offset, least=None)

    def assign(self, ts: Any) -> list[tuple[Any, Any]]:
        start = ts - (ts - self.offset) % self.size
        return [(start, start + self.size)]


@dataclass(frozen=True)
class SlidingWindows:
    size: int
    slide: int
    offset: int = 0

    def __post_init__(self) -> None:
        _whole("size", self.size)
        _whole("slide", self.slide)
        _whole("offset", self.offset, least=None)
        if self.slide > self.size:
            raise ValueError(f"slide ({self.slide}) must be at most size ({self.size}): a record would fall in no "
                             "window between them")

    def assign(self, ts: Any) -> list[tuple[Any, Any]]:
        last = ts - (ts - self.offset) % self.slide
        out = []
        start = last
        while start > ts - self.size:
            out.append((start, start + self.size))
            start -= self.slide
        return out


@dataclass(frozen=True)
class SessionWindows:
    gap: int

    def __post_init__(self) -> None:
        _whole("gap", self.gap)

    def assign(self, ts: Any) -> list[tuple[Any, Any]]:
        return [(ts, ts + self.gap)]


Windows = TumblingWindows | SlidingWindows | SessionWindows


def _whole(name: str, v: Any, least: int | None = 1) -> None:
    """Window parameters are whole numbers of timestamp units (milliseconds by convention):
    then every window bound is exact even for fractional timestamps (a multiple of an
    integer, or a timestamp plus one), and a timer finds its window again by arithmetic."""
    if not isinstance(v, int) or isinstance(v, bool) or (least is not None and v < least):
        raise ValueError(f"window {name} must be an int{'' if least is None else f' >= {least}'} in timestamp units "
                         f"(milliseconds by convention), got {v!r}: give timestamps in a unit that makes it whole")


class WindowOperator(TimedOperator):
    """Windows of one key function (see the module docstring). ``kind`` is REDUCE
    (``fn(acc, record)``), AGGREGATE (``create``, ``add``, ``result``, ``merge``) or PROCESS
    (``fn(key, start, end, records)``)."""

    def __init__(self, windows: Windows, timestamp: Callable[[Any], Any], kind: str, fn: Callable[..., Any],
                 key_fn: Callable[[Any], Any] | None = None, allowed_lateness: int = 0,
                 create: Callable[[], Any] | None = None, result: Callable[[Any], Any] | None = None,
                 merge: Callable[[Any, Any], Any] | None = None, on_error: str = "fail"):
        self.windows = windows
        self.timestamp = timestamp
        self.kind = kind
        self.fn = fn
        self.key_fn = key_fn
        _whole("allowed_lateness", allowed_lateness, least=0)
        self.allowed_lateness = allowed_lateness
        self.create, self.result, self.merge = create, result, merge
        self.sessions = isinstance(windows, SessionWindows)
        #: Sliding windows of an aggregate that merges are kept as panes (slices of one slide):
        #: a record updates one pane, not size/slide windows; a window's result merges its
        #: panes when it fires. The state is then key -> pane start -> [start, end, acc].
        self.panes = (isinstance(windows, SlidingWindows) and kind == AGGREGATE and merge is not None
                      and windows.size % windows.slide == 0)
        self.late_stream = False  #: the dataflow takes ``.late``: late records go to the side output
        #: key -> start -> its window [start, end, acc] (a session's start moves when it merges)
        self.state: dict[Any, dict[Any, list[Any]]] = {}
        #: Sessions only: key -> (its sessions' starts in order, fire time -> start, purge time
        #: -> start; one map when there is no lateness). A key's sessions never touch
        #: (touching ones merge), so in start order their ends are in order too. The times
        #: are keyed exactly as their timers were registered (a session's start is a
        #: timestamp, so its bounds may be fractional: arithmetic could miss them).
        self.sessions_of: dict[Any, tuple[list[Any], dict[Any, Any], dict[Any, Any]]] = {}
        self.side: list[Any] = []
        self.skipped: list[tuple[Any, BaseException]] = []
        self.on_error = check_on_error(on_error)

    @property
    def reports_skipped(self) -> bool:
        return True  # late records without a late stream are reported as skipped, whatever on_error says

    # -- failures -------------------------------------------------------------------------

    def _label(self, role: str) -> str:
        fn = self.key_fn if role == "key" else self.timestamp
        return function_label(role, fn)

    def _function_of(self, e: BaseException) -> str:
        """Which of the window's functions raised ``e`` (the one whose frame is in its
        traceback; else the main one: reduce, add or process)."""
        main = {REDUCE: "reduce", AGGREGATE: "add", PROCESS: "process"}[self.kind]
        fns = [(main, self.fn), ("create", self.create), ("merge", self.merge), ("result", self.result)]
        for role, fn in fns:
            if fn is not None and raised_in(e, fn):
                return function_label(role, fn)
        return function_label(main, self.fn)

    # -- records --------------------------------------------------------------------------

    def _updated(self, acc: Any, record: Any, fresh: bool) -> Any:
        """A window's accumulator with ``record`` added, ``acc`` itself left as it is (for a
        process function None: the record is appended when the change is committed)."""
        if self.kind == REDUCE:
            return record if fresh else self.fn(acc, record)
        if self.kind == AGGREGATE:
            return self.fn(self.create() if fresh else acc, record)  # type: ignore[misc]
        return None

    def _with(self, acc: Any, new: Any, record: Any) -> Any:
        """The accumulator a window that fires again with ``record`` fires with."""
        if self.kind == PROCESS:
            return (list(acc) if acc is not None else []) + [record]
        return new

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

    def _committed(self, acc: Any, new: Any, record: Any) -> Any:
        """The accumulator to store: ``new``, or a process function's records with ``record``."""
        if self.kind != PROCESS:
            return new
        if acc is None:
            return [record]
        acc.append(record)
        return acc


    def _merged(self, a: Any, b: Any) -> Any:
        if self.kind == REDUCE:
            return self.fn(a, b)
        if self.kind == AGGREGATE:
            return self.merge(a, b)  # type: ignore[misc]
        return a + b

    def _is_late(self, end: Any) -> bool:
        return bool(end - 1 + self.allowed_lateness <= self.watermark)

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
        for record in batch:
            if key_fn is None:
                key = record
            else:
                try:
                    key = key_fn(record)
                except Exception as e:
                    self.record_failed(record, self._label("key"), e, self.key_on_error)
                    continue
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

    def _timers_for(self, key: Any, end: Any, fired_upto: Any) -> None:
        """A new window [.., end): it fires at end - 1 (unless that is past: then it fires
        at once, and never again by a timer) and is purged at end - 1 + lateness."""
        if end > fired_upto:
            self.timers.register(EVENT, key, end - 1)
        if self.allowed_lateness:
            self.timers.register(EVENT, key, end - 1 + self.allowed_lateness)

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
        # The old windows' timers stay: a timer finds what is due when it fires (lazily).
        self._timers_for(key, end, self.watermark + 1)
        if again:
            out.extend(again)
        return True

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
        starts, fire_at, purge_at = self.sessions_of[key]
        del wins[w[0]]
        del starts[bisect_left(starts, w[0])]
        fire_at.pop(w[1] - 1, None)
        purge_at.pop(w[1] - 1 + self.allowed_lateness, None)

    def _late(self, record: Any, ts: Any) -> None:
        if self.late_stream:
            self.side.append(record)
        else:
            self.skipped.append((record, LateRecord(
                f"late record dropped: timestamp {ts} is behind the watermark {self.watermark} by more than the "
                f"allowed lateness {self.allowed_lateness}; take the window's .late stream to keep such records")))

    def take_side_output(self) -> list[Any]:
        side, self.side = self.side, []
        return side

    # -- firing -----------------------------------------------------------------------------

    def _emit(self, key: Any, w: list[Any]) -> list[Any]:
        """What window ``w`` of ``key`` emits (its functions may raise: the caller names
        the record, or the window)."""
        start, end, acc = w
        if self.kind == PROCESS:
            got = self.fn(key, start, end, list(acc))
            return list(got) if got else []
        return [(key, start, end, self.result(acc) if self.result is not None else acc)]

    def _fire_failed(self, key: Any, start: Any, end: Any, e: Exception) -> None:
        """Window [start, end) of ``key`` raised ``e`` as it fired: the window ``(key, start,
        end)`` is the record (skipped: it emits nothing, and is purged as it would be)."""
        self.record_failed((key, start, end), self._function_of(e), e)

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


def check_windows(windows: Any) -> Windows:
    if not isinstance(windows, (TumblingWindows, SlidingWindows, SessionWindows)):
        raise TypeError(f"windows must be TumblingWindows, SlidingWindows or SessionWindows, got "
                        f"{type(windows).__name__}")
    return windows
