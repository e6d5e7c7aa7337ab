"""The window assigners: the windows ``[start, end)`` a record's timestamp falls in
(tumbling, sliding, session), and the checks of their parameters. What becomes of the
windows (accumulators, firing, lateness): ``operators/windows.py``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TumblingWindows:
    """Windows of ``size`` one after another: a record with timestamp ``ts`` is in the one
    ``[start, start + size)`` with ``start`` a multiple of ``size`` plus ``offset``. Both
    are ints in timestamp units (``size`` >= 1); ValueError otherwise."""

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
    """Windows of ``size`` that start every ``slide`` (a multiple of it plus ``offset``):
    a record is in every one that holds its timestamp (``size / slide`` of them when the
    slide divides the size). Ints in timestamp units, ``1 <= slide <= size``; ValueError
    otherwise."""

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
    """Sessions per key: a record with timestamp ``ts`` opens ``[ts, ts + gap)`` and merges
    with every session of its key that window touches, so a session ends after ``gap``
    without records. ``gap`` is an int >= 1 in timestamp units; ValueError otherwise.
    ``WindowedStream.aggregate`` over sessions needs a ``merge``."""

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
