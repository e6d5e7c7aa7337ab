"""A task's side of incremental checkpoints: which file a snapshot builds on, and which
keys it must write (the format and the chain rules: checkpoint/incremental.py).

An operator can take part if it tracks the keys it changes (operators/keyed.py's
``track_changes`` / ``take_changes``) and its state is a map; it starts tracking at the
first snapshot that finds its state at least MIN_STATE keys large (a small state is
cheaper written whole than tracked). Everything else is written whole. Invariants:
- A delta is only ever written on a file of this task for a checkpoint that the
  coordinator has *completed* and told this task of (``completed``), in this attempt: its
  files are committed, and the coordinator protects them from retention from the moment
  this task reports it knows of them (``known`` in every acknowledgement) on.
- The keys a delta on base b holds are those changed in every epoch after b (an epoch:
  the records between two snapshots), so a snapshot whose base completes late is still
  exact; an operator that began tracking after b is written whole; epochs at or before
  the newest completed base are dropped.
- A full file is written for the first snapshot of an attempt (after a restore or a
  rescale nothing of this attempt is committed to build on) and after ``max_chain``
  deltas; an operator whose changes exceed MAX_CHANGED_* of its state is written whole and
  stops tracking for PAUSE snapshots (its workload touches too much of its state for
  deltas to pay), then tries again.
- The task thread does O(1) per operator: the delta is built by the encoder
  (``PendingDelta``), in the forked child when the snapshot is forked.
"""

from __future__ import annotations

from typing import Any

from ..checkpoint.incremental import MAX_CHAIN, PendingDelta
from .snapshot_encoding import entry_count

MIN_STATE = 1024  #: an operator starts tracking changes once its state has this many keys
#: A delta is written only while its changes are at most this share of the state; above
#: it the full state is as cheap to write and cheaper to restore. Operators that record
#: their changed values (count, reduce) hand over a map that is encoded in order, as the
#: state is: half. Those that record keys only (the final variants) make the delta look
#: each key up in the state in random order, about ten times the cost per key of encoding
#: the state in order (benchmarks/results/incremental.md): an eighth.
MAX_CHANGED_VALUES = 1 / 2
MAX_CHANGED_KEYS = 1 / 8
PAUSE = 8  #: snapshots an operator stops tracking for after its changes exceeded the limit
KEY_COST = 10  #: a looked-up key costs about this many entries to encode (for auto's fork choice)


def _keyed_map(op: Any, state: Any) -> dict[Any, Any] | None:
    """The map of keys of an operator's snapshot that deltas are of (a timed operator's:
    its ``DELTA_FIELD``), or None if the snapshot has none."""
    field = getattr(op, "DELTA_FIELD", None)
    if field is not None:
        state = state.get(field) if isinstance(state, dict) else None
    return state if isinstance(state, dict) else None


class Increments:
    """Per task: the epochs of changed keys, the files written, the base to build on."""

    def __init__(self, operators: list[tuple[str, Any]], enabled: bool, max_chain: int = MAX_CHAIN):
        self.candidates: dict[str, Any] = {}
        if enabled:
            self.candidates = {name: op for name, op in operators if op.incremental}
        self.max_chain = max_chain
        #: The newest completed checkpoint this task was told of (0: none yet; None: none yet,
        #: and it writes no deltas: it holds back no base the coordinator keeps for others).
        self.known: int | None = 0 if self.candidates else None
        self.written: dict[int, int] = {}  #: checkpoint id -> deltas under its file (0: a full file)
        self.since: dict[str, int] = {}  #: operator -> the snapshot after which its changes are tracked
        self.resume_at: dict[str, int] = {}  #: operator -> the snapshot from which it may track again
        self.epochs: dict[str, list[tuple[int, Any]]] = {}  #: per epoch: key -> value, or keys

    def prepare(self, checkpoint_id: int, states: dict[str, Any]) -> tuple[int | None, list[str], int]:
        """Turn ``states`` (operator -> snapshot()) into what snapshot ``checkpoint_id``
        writes: pending deltas replace the states of operators written incrementally.
        Returns the base (None: a full file), the operators written as deltas, and the number
        of entries to encode (for the encoder's choice of fork or inline)."""
        for name, op in self.candidates.items():
            keyed = _keyed_map(op, states.get(name))
            if name in self.since:
                self.epochs[name].append((checkpoint_id, op.take_changes()))
            elif keyed is not None and len(keyed) >= MIN_STATE and checkpoint_id >= self.resume_at.get(name, 0):
                op.track_changes()  # changes after this snapshot: the next can be a delta on it
                self.since[name], self.epochs[name] = checkpoint_id, []
        base = self.known if self.known in self.written else None
        deltas: list[str] = []
        entries = 0
        if base is not None and self.written[base] < self.max_chain:
            for name, since in list(self.since.items()):
                state = states.get(name)
                op = self.candidates[name]
                keyed = _keyed_map(op, state)
                if since > base or keyed is None or not isinstance(state, dict):
                    continue
                pending = PendingDelta(state, [keys for cid, keys in self.epochs[name] if cid > base],
                                       getattr(op, "DELTA_FIELD", None))
                if len(pending) > (MAX_CHANGED_VALUES if pending.values else MAX_CHANGED_KEYS) * len(keyed):
                    self._pause(name, checkpoint_id)  # written whole
                    continue
                states[name] = pending
                deltas.append(name)
                entries += len(pending) * (1 if pending.values else KEY_COST)
        self.written[checkpoint_id] = self.written[base] + 1 if deltas and base is not None else 0
        entries += sum(entry_count(s) for n, s in states.items() if n not in deltas)
        return (base if deltas else None), deltas, entries

    def _pause(self, name: str, checkpoint_id: int) -> None:
        self.candidates[name].untrack_changes()
        del self.since[name], self.epochs[name]
        self.resume_at[name] = checkpoint_id + PAUSE

    def completed(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is complete: build on its file from now on."""
        if checkpoint_id not in self.written or (self.known is not None and checkpoint_id <= self.known):
            return
        self.known = checkpoint_id
        for cid in [c for c in self.written if c < checkpoint_id]:
            del self.written[cid]
        for name, epochs in self.epochs.items():
            self.epochs[name] = [(c, k) for c, k in epochs if c > checkpoint_id]

