"""How far a source has read: ``Source.progress()`` says it from the source's offset, the
worker's heartbeat carries it (runtime/task_health.py), and the dashboard, ``/metrics`` and
the report show it per subtask and per source.

Invariant: ``progress()`` runs on the worker's watchdog thread while the task thread reads,
so it only reads attributes (no I/O, no lock, no user code); a value read mid-change is off
by one batch at most, and one that raised is left out of that heartbeat.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SourceProgress:
    """One source subtask's progress through its input, read off its offset.

    ``left``: units this subtask still has to read (None: unbounded, or not known).
    ``total``: units of the whole input, every subtask's together (None: unbounded, or not
    known); the source's progress is ``total`` minus every subtask's ``left``.
    ``unit``: what is counted: ``"records"``, ``"bytes"``, ``"row groups"``,
    ``"partitions"``, ``"chunks"``, ``"batches"`` or ``"changes"``.
    ``position``: the offset as a person reads it (``"byte 1,234,567"``,
    ``"partition 3, row 20,000"``, ``"LSN 0/16B3F20"``).
    """

    left: int | None
    total: int | None
    unit: str
    position: str = ""
