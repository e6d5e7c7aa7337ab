"""What every window operator shares (``WindowOperator``, ``operators/windows.py``, whose
docstring gives the semantics): its functions and state, which of its functions raised,
a window's accumulator with one more record, its timers, what a window emits, and late
records. Sessions merge in ``operators/window_sessions.py``, panes in
``operators/window_panes.py``."""

from __future__ import annotations

from typing import Any, Callable

from .base import check_on_error, function_label, raised_in
from .timers import EVENT, TimedOperator
from .window_assigners import SessionWindows, SlidingWindows, Windows, _whole

REDUCE, AGGREGATE, PROCESS = "reduce", "aggregate", "process"
_CREATED = object()  #: in a record's undo list: the window did not exist before it


class LateRecord(Exception):
    """A record came after every window it belongs to was purged (its job takes no ``.late``
    stream): reported as a skipped record."""


class WindowBase(TimedOperator):
    """Windows of one key function. ``kind`` is REDUCE (``fn(acc, record)``), AGGREGATE
    (``create``, ``add``, ``result``, ``merge``) or PROCESS (``fn(key, start, end,
    records)``)."""

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
        #: Sessions only (operators/window_sessions.py): key -> (its sessions' starts in
        #: order, fire time -> start, purge time -> start; one map when there is no
        #: lateness). A key's sessions never touch (touching ones merge), so in start order
        #: their ends are in order too. The times are keyed exactly as their timers were
        #: registered (a session's start is a timestamp, so its bounds may be fractional:
        #: arithmetic could miss them).
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

    def _timers_for(self, key: Any, end: Any, fired_upto: Any) -> None:
        """A new window [.., end): it fires at end - 1 (unless that is past: then it fires
        at once, and never again by a timer) and is purged at end - 1 + lateness."""
        if end > fired_upto:
            self.timers.register(EVENT, key, end - 1)
        if self.allowed_lateness:
            self.timers.register(EVENT, key, end - 1 + self.allowed_lateness)

    def _late(self, record: Any, ts: Any) -> None:
        self.late_records = getattr(self, "late_records", 0) + 1  #: (this attempt's: the dashboard's count)
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
