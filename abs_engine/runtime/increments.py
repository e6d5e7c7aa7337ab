"""A task's side of incremental checkpoints: which file a snapshot builds on, and which
keys it must write (the format and the chain rules: checkpoint/incremental.py).

An operator takes part if it tracks the keys it changes (operators/keyed.py's
``track_changes`` / ``take_changes``) and its state is a map; everything else is written
whole. Invariants:
- A delta is only ever written on a file of this task for a checkpoint that the
  coordinator has *completed* and told this task of (``completed``), in this attempt: its
  files are committed, and the coordinator protects them from retention from the moment
  this task reports it knows of them (``known`` in every acknowledgement) on.
- The keys a delta on base b holds are those changed in every epoch after b (an epoch:
  the records between two snapshots), so a snapshot whose base completes late is still
  exact; epochs at or before the newest completed base are dropped.
- A full file is written for the first snapshot of an attempt (after a restore or a
  rescale, nothing of this attempt is committed to build on), after MAX_CHAIN deltas, and
  for an operator whose changes reach half of its state (a delta that large saves nothing).
"""

from __future__ import annotations

from typing import Any

from ..checkpoint.incremental import MAX_CHAIN, delta

MIN_FULL = 1024  #: a state smaller than this is written as a delta however much of it changed


class Increments:
    """Per task: the epochs of changed keys, the files written, the base to build on."""

    def __init__(self, operators: list[tuple[str, Any]], enabled: bool, max_chain: int = MAX_CHAIN):
        self.tracked: dict[str, Any] = {}
        if enabled:
            for name, op in operators:
                if callable(getattr(op, "track_changes", None)) and callable(getattr(op, "take_changes", None)):
                    op.track_changes()
                    self.tracked[name] = op
        self.max_chain = max_chain
        #: The newest completed checkpoint this task was told of (0: none; -1: no deltas ever).
        self.known = 0 if self.tracked else -1
        self.written: dict[int, int] = {}  #: checkpoint id -> deltas under its file (0: a full file)
        self.epochs: dict[str, list[tuple[int, set[Any]]]] = {name: [] for name in self.tracked}

    def prepare(self, checkpoint_id: int, states: dict[str, Any]) -> tuple[int, list[str], int]:
        """Turn ``states`` (operator -> snapshot()) into what snapshot ``checkpoint_id``
        writes: deltas replace the states of operators written incrementally. Returns the
        base (-1: a full file), the operators written as deltas, and the number of entries
        to encode (for the encoder's choice of fork or inline)."""
        for name, op in self.tracked.items():
            self.epochs[name].append((checkpoint_id, op.take_changes()))
        base = self.known if self.known in self.written else -1
        if base < 0 or self.written[base] >= self.max_chain:
            self.written[checkpoint_id] = 0
            return -1, [], _entries(states, [])
        deltas: list[str] = []
        for name in self.tracked:
            state = states.get(name)
            if not isinstance(state, dict):
                continue
            changed: set[Any] = set()
            for cid, keys in self.epochs[name]:
                if cid > base:
                    changed |= keys
            if len(changed) * 2 >= len(state) and len(state) >= MIN_FULL:
                continue  # most of it changed: write it whole
            states[name] = delta(state, changed)
            deltas.append(name)
        if not deltas:
            self.written[checkpoint_id] = 0
            return -1, [], _entries(states, [])
        self.written[checkpoint_id] = self.written[base] + 1
        return base, deltas, _entries(states, deltas)

    def completed(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is complete: build on its file from now on."""
        if checkpoint_id not in self.written or checkpoint_id <= self.known:
            return
        self.known = checkpoint_id
        for cid in [c for c in self.written if c < checkpoint_id]:
            del self.written[cid]
        for name, epochs in self.epochs.items():
            self.epochs[name] = [(c, k) for c, k in epochs if c > checkpoint_id]


def _entries(states: dict[str, Any], deltas: list[str]) -> int:
    n = 0
    for name, s in states.items():
        if name in deltas:
            n += len(s["upserts"]) + len(s["deletes"])
            continue
        try:
            n += len(s)
        except TypeError:
            n += 1
    return n
