"""Where sinks write, compared: one output, one writer.

Two sinks of a dataflow that write the same file, directory or URI, or one inside the
other, would each truncate, roll back or delete what the other published (a FileSink's
restore truncates its file to its own committed length; a ParquetSink deletes its
subtasks' parts of later epochs). ``Stream.sink`` refuses the second with a GraphError
naming both (``conflicting``).

A place is compared after resolution: a local path (or ``file://`` URI) by its real path
(``..``, symlinks of the existing part and relative paths resolved), a remote URI by its
scheme, host and normalised path (its query, which holds endpoints and credentials, does
not make another place).
"""

from __future__ import annotations

import os
import posixpath
from urllib.parse import urlsplit

from . import fs


def place(location: str) -> tuple[str, str]:
    """(``scheme://host`` or ``""`` for local, the normalised path) of an output location."""
    if fs.is_remote(location):
        parts = urlsplit(location)
        path = posixpath.normpath("/" + parts.path.lstrip("/"))
        return f"{parts.scheme.lower()}://{parts.netloc.rsplit('@', 1)[-1].lower()}", path
    return "", os.path.realpath(fs.local_path(location))


def overlap(a: str, b: str) -> bool:
    """Whether outputs ``a`` and ``b`` are the same place or one holds the other."""
    (ra, pa), (rb, pb) = place(a), place(b)
    if ra != rb:
        return False
    if pa == pb:
        return True
    shorter, longer = sorted((pa, pb), key=len)
    return longer.startswith(shorter.rstrip("/") + "/")


def conflicting(new: list[str], existing: dict[str, list[str]]) -> tuple[str, str, str] | None:
    """(sink name, its output, the new output) of the first existing sink whose output
    overlaps one of ``new``; None if none does."""
    for name, outs in existing.items():
        for old in outs:
            for out in new:
                if overlap(old, out):
                    return name, old, out
    return None
