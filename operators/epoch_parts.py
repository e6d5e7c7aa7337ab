"""A sink subtask's output as part files named by epoch, ``part-<subtask>-<epoch><suffix>``
(or ``part-<subtask>-<epoch>-<n><suffix>`` when an epoch is split into several files), in a
local directory or under an object-store prefix (abs_engine/fs.py), optionally under
``depth`` levels of partition directories (``column=value``): what ParquetSink and FileSink
on an object store publish.

Invariants:
- A part is written whole or not at all (locally: temp file, fsync, rename; on an object
  store: one put), and its name carries its epoch, so writing it again is idempotent (an
  epoch's rows split the same way every time).
- After a restore from checkpoint n, this subtask's parts of epochs after n are deleted (a
  failed attempt published them; they will be written again from the replay), and so are
  the temporary files a crash left mid-write.
- A run that starts afresh deletes this subtask's parts, and subtask 0 those of subtasks an
  earlier, wider run had.
- Every change is made under the engine's fence (the caller holds ``ctx.guard()``).
"""

from __future__ import annotations

import re
from typing import Any, Iterator

from abs_engine import fs


class EpochParts:
    """Subtask ``subtask``'s parts in ``out`` (an ``fs.open_dir``), ``depth`` partition
    directories deep."""

    def __init__(self, out: Any, subtask: int, suffix: str, depth: int = 0):
        self.out, self.subtask, self.suffix, self.depth = out, subtask, suffix, depth
        self.pattern = re.compile(r"^part-(\d{5})-(\d{6,})(?:-\d{3,})?" + re.escape(suffix) + "$")

    def name(self, epoch: int, piece: int | None = None) -> str:
        more = "" if piece is None else f"-{piece:03d}"
        return f"part-{self.subtask:05d}-{epoch:06d}{more}{self.suffix}"

    def _files(self) -> Iterator[tuple[str, ...]]:
        """Every file name (as path components) at the parts' depth."""
        dirs: list[tuple[str, ...]] = [()]
        for _ in range(self.depth):
            dirs = [d + (n,) for d in dirs for n in self.out.list(*d) if "=" in n]
        for d in dirs:
            for n in self.out.list(*d):
                yield d + (n,)

    def start(self, restored: bool, parallelism: int) -> None:
        """Before anything is written: leftovers of a crash removed; a fresh start removes
        this subtask's parts (subtask 0: also those of subtasks beyond ``parallelism``)."""
        for names in self._files():
            was = fs.leftover_of(names[-1])
            m = self.pattern.match(was) if was else None
            if m and int(m.group(1)) == self.subtask:
                self.out.delete_file(*names)  # a crash mid-write
        if not restored:
            self.rollback(after=-1)
            if self.subtask == 0:
                for names in self._files():
                    m = self.pattern.match(names[-1])
                    if m and int(m.group(1)) >= parallelism:
                        self.out.delete_file(*names)

    def mine(self) -> list[tuple[int, tuple[str, ...]]]:
        """(epoch, path components) of this subtask's parts."""
        out = []
        for names in self._files():
            m = self.pattern.match(names[-1])
            if m and int(m.group(1)) == self.subtask:
                out.append((int(m.group(2)), names))
        return out

    def rollback(self, after: int) -> None:
        """Delete this subtask's parts of epochs after ``after``."""
        for epoch, names in self.mine():
            if epoch > after:
                self.out.delete_file(*names)

    def put(self, epoch: int, data: bytes, where: tuple[str, ...] = (), piece: int | None = None) -> None:
        self.out.put((*where, self.name(epoch, piece)), data)
