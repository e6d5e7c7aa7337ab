"""What a task's heartbeat says of its health, beyond its record counters: its watermark,
the keys and timers its operators hold, the late records its windows met, and its process's
CPU time and resident memory, and a source's progress through its input (for the
dashboard, ``/metrics`` and the report).

Read by the watchdog thread while the task thread runs (runtime/watchdog.py), so only what
can be read without a lock: numbers the task thread replaces whole, and ``len()`` of maps.
A count that cannot be read at that instant (a timer map resized under it) is -1, unknown,
never a wrong number.

Invariant: nothing here changes the task or calls user code.
"""

from __future__ import annotations

import os
import resource
from typing import Any

from .watermarks import MAX_WATERMARK, MIN_WATERMARK

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """This process's resident memory now (Linux), or its peak where /proc is missing."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def cpu_seconds() -> float:
    """CPU time this process has used (user and system, every thread)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return float(r.ru_utime + r.ru_stime)


def watermark_of(task: Any) -> float | None:
    """The task's event-time watermark (a source's: the last it sent); None: no event time
    reached it yet, or the input has ended (the final watermark is not a time)."""
    time = getattr(task, "time", None)
    if time is None:
        return None
    w = time.sent if time.source is not None and isinstance(time.sent, (int, float)) else time.watermark
    return None if w in (MIN_WATERMARK, MAX_WATERMARK) else float(w)


def held(task: Any) -> tuple[int, int, dict[str, int]]:
    """(keys, timers, late records by operator name) of the task's operators; -1 where not
    known now; an operator that met no late record is left out of the map."""
    keys = timers = 0
    unknown = False
    for op in getattr(task.chain, "ops", []):
        state = op.keyed_state() if hasattr(op, "keyed_state") else getattr(op, "state", None)
        if isinstance(state, dict) and op.state_layout is not None:
            keys += len(state)
        service = getattr(op, "timers", None)
        if service is not None and hasattr(service, "__len__"):
            try:
                timers += len(service)
            except RuntimeError:  # resized by the task thread while counted
                unknown = True
    return keys, -1 if unknown else timers, late_by_operator(task.chain)


def late_by_operator(chain: Any) -> dict[str, int]:
    """The late records each operator of ``chain`` met this attempt, by its name; an
    operator that met none is left out."""
    late: dict[str, int] = {}
    for name, op in zip(getattr(chain, "names", []), getattr(chain, "ops", [])):
        if n := int(getattr(op, "late_records", 0)):
            late[name] = late.get(name, 0) + n
    return late


def progress_of(task: Any) -> tuple[int, int, str, str]:
    """A source task's (left, total, unit, position) (``task``: a task or its chain, whichever
    holds ``source``): -1 for a count not known, unit "" when the source says nothing (or its
    answer raised, read mid-change: the next heartbeat asks again)."""
    source = getattr(task, "source", None)
    try:
        p = source.progress() if source is not None else None
    except Exception:  # noqa: BLE001 - a read racing the task thread; never kill the watchdog
        p = None
    if p is None:
        return -1, -1, "", ""
    return (-1 if p.left is None else int(p.left), -1 if p.total is None else int(p.total), str(p.unit),
            str(p.position)[:200])


def measure(task: Any) -> tuple[Any, ...]:
    """The heartbeat's health fields, in messages.Heartbeat's order: watermark, cpu seconds,
    rss bytes, keys, timers, late records by operator, then the source's progress (``progress_of``)."""
    keys, timers, late = held(task)
    return (watermark_of(task), cpu_seconds(), rss_bytes(), keys, timers, late, *progress_of(task))
