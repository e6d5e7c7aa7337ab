"""A sink subtask's output as one part file per epoch, ``part-<subtask>-<epoch><suffix>``, in a
local directory or under an object-store prefix (abs_engine/fs.py): what ParquetSink and
FileSink on an object store publish.

Invariants:
- A part is written whole or not at all (locally: temp file, fsync, rename; on an object
  store: one put), and its name carries its epoch, so writing it again is idempotent.
- After a restore from checkpoint n, this subtask's parts of epochs after n are deleted (a
  failed attempt published them; they will be written again from the replay), and so are
  the temporary files a crash left mid-write.
- A run that starts afresh deletes this subtask's parts, and subtask 0 those of subtasks an
  earlier, wider run had.
- Every change is made under the engine's fence (the caller holds ``ctx.guard()``).
"""

from __future__ import annotations

import re
from typing import Any

from abs_engine import fs


class EpochParts:
    """Subtask ``subtask``'s parts in ``out`` (an ``fs.open_dir``)."""

    def __init__(self, out: Any, subtask: int, suffix: str):
        self.out, self.subtask, self.suffix = out, subtask, suffix
        self.pattern = re.compile(r"^part-(\d{5})-(\d{6,})" + re.escape(suffix) + "$")

    def name(self, epoch: int) -> str:
        return f"part-{self.subtask:05d}-{epoch:06d}{self.suffix}"

    def start(self, restored: bool, parallelism: int) -> None:
        """Before anything is written: leftovers of a crash removed; a fresh start removes
        this subtask's parts (subtask 0: also those of subtasks beyond ``parallelism``)."""
        for name in self.out.list():
            was = fs.leftover_of(name)
            m = self.pattern.match(was) if was else None
            if m and int(m.group(1)) == self.subtask:
                self.out.delete_file(name)  # a crash mid-write
        if not restored:
            self.rollback(after=-1)
            if self.subtask == 0:
                for name in self.out.list():
                    m = self.pattern.match(name)
                    if m and int(m.group(1)) >= parallelism:
                        self.out.delete_file(name)

    def mine(self) -> list[tuple[int, str]]:
        """(epoch, name) of this subtask's parts."""
        out = []
        for name in self.out.list():
            m = self.pattern.match(name)
            if m and int(m.group(1)) == self.subtask:
                out.append((int(m.group(2)), name))
        return out

    def rollback(self, after: int) -> None:
        """Delete this subtask's parts of epochs after ``after``."""
        for epoch, name in self.mine():
            if epoch > after:
                self.out.delete_file(name)

    def put(self, epoch: int, data: bytes) -> None:
        self.out.put((self.name(epoch),), data)
