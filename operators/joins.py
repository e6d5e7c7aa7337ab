"""A two-input keyed interval join: every pair ``(left, right)`` of one key with
``left_ts + lower <= right_ts <= left_ts + upper`` gives ``fn(left, right)`` (Flink's
IntervalJoin).

Both inputs arrive as one stream of ``(side, record)`` (0: left, 1: right), keyed by the
side's key function, so that one subtask holds both sides of a key. A left record waits
in state until the watermark passes ``left_ts + upper`` (no right record that it could
join can come after that), a right one until it passes ``right_ts - lower``; each is
removed by an event-time timer. A record at or behind the watermark is late: it is
reported as skipped and not joined (a join across a late record would depend on how fast
each side ran). Without late records the output is the exact batch join.

User functions that raise (operators/base.py, ``Guarded``): either input's key or
timestamp function, or ``fn``, names the record (as ``(side, record)``, side 0 or 1) and
the function; with ``on_error="skip"`` the record is dropped and reported before anything
of it is kept (its pairs are computed first, then it is buffered).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from .base import check_on_error, function_label
from .keyed_process import KeyState
from .timers import KeyedTimedProcess, TimerContext
from .windows import LateRecord

LEFT, RIGHT = 0, 1

#: Nothing here for users to import: ``Stream.interval_join`` makes the operator.
__all__: list[str] = []


class IntervalJoin(KeyedTimedProcess):
    """The join of the module docstring: ``fn(left, right)`` for pairs within ``lower`` and
    ``upper`` of each other; ``key_fns`` and ``timestamps`` are each side's functions (left,
    right), ``on_error`` applies to all of them."""

    def __init__(self, lower: Any, upper: Any, fn: Callable[[Any, Any], Any],
                 key_fns: tuple[Callable[[Any], Any], Callable[[Any], Any]],
                 timestamps: tuple[Callable[[Any], Any], Callable[[Any], Any]], on_error: str = "fail"):
        if lower > upper:
            raise ValueError(f"interval join: lower ({lower}) must be at most upper ({upper})")
        self.lower, self.upper, self.fn = lower, upper, fn
        self.key_fns, self.timestamps = key_fns, timestamps
        self.key_fn = self._key
        self.timestamp_fn = self._ts
        self.skipped: list[tuple[Any, BaseException]] = []
        self.on_error = self.key_on_error = check_on_error(on_error)

    @property
    def reports_skipped(self) -> bool:
        return True  # late records are reported as skipped, whatever on_error says

    def function(self, role: str, record: Any) -> str:
        side = "left" if record[0] == LEFT else "right"
        if role == "key":
            return f"{side} input's {function_label('key', self.key_fns[record[0]])}"
        if role == "timestamp":
            return f"{side} input's {function_label('timestamp', self.timestamps[record[0]])}"
        return function_label("join", self.fn)

    def _key(self, tagged: Any) -> Any:
        return self.key_fns[tagged[0]](tagged[1])

    def _ts(self, tagged: Any) -> Any:
        return self.timestamps[tagged[0]](tagged[1])

    def process_key(self, key: Any, record: Any, state: KeyState, ctx: TimerContext) -> Iterable[Any] | None:
        side, rec = record
        ts = ctx.timestamp
        assert ts is not None
        if ctx.is_late:
            self.skipped.append((rec, LateRecord(f"late record not joined: timestamp {ts} is at or behind the "
                                                 f"watermark {ctx.watermark}")))
            return None
        buffers = state.value
        # Compute first (fn may raise: then nothing of this record is kept), then commit.
        if side == LEFT:
            lo, hi = ts + self.lower, ts + self.upper
            out = [self.fn(rec, r) for rts, r in buffers[RIGHT] if lo <= rts <= hi] if buffers else []
            expires = ts + self.upper
        else:
            lo, hi = ts - self.upper, ts - self.lower
            out = [self.fn(l, rec) for lts, l in buffers[LEFT] if lo <= lts <= hi] if buffers else []
            expires = ts - self.lower
        if buffers is None:
            buffers = state.value = [[], []]
        buffers[side].append([ts, rec])
        ctx.register_event_time(expires)
        return out

    def on_timer(self, key: Any, timestamp: float, domain: int, state: KeyState,
                 ctx: TimerContext) -> Iterable[Any] | None:
        buffers = state.value
        if buffers is None:
            return None
        left = [e for e in buffers[LEFT] if e[0] + self.upper > timestamp]
        right = [e for e in buffers[RIGHT] if e[0] - self.lower > timestamp]
        state.value = [left, right] if left or right else None
        return None

    def restore_keyed(self, values: dict[Any, Any]) -> None:
        super().restore_keyed({k: [list(v[0]), list(v[1])] for k, v in values.items()})
