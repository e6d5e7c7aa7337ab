"""Your own keyed operator, with state the runtime owns: ``KeyedProcess``.

Subclass it and write ``process_key(key, record, state)``: it sees one record of one key
and that key's ``state`` (a ``KeyState``: ``state.value`` read and assigned, ``del
state.value`` to forget the key; or ``state.map``, a dict of its own per key), and returns
the records to emit (any iterable; None for none). The runtime does the rest as for the
built-in keyed operators: every key's state is snapshotted, restored, re-split by key
group when the operator's parallelism changes (``rescale_state``), and written
incrementally with ``incremental_checkpoints`` (only the keys a batch touched). For
example::

    class RunningMean(KeyedProcess):
        def process_key(self, key, record, state):
            n, total = state.value or (0, 0)
            state.value = (n + 1, total + record)
            return [(key, (total + record) / (n + 1))]

    stream.key_by(lambda r: r[0]).apply_keyed(RunningMean(), name="mean")

Invariants: the state is one map key -> value (msgpack-encodable; a state that is not is a
SerializationError naming the operator at the first checkpoint); a key with no value is
absent from it, never mapped to None; only the current record's key is reachable from
``state``, so a subtask only ever touches the keys it owns.

If ``process_key`` raises (operators/base.py, ``Guarded``): with ``on_error="fail"`` (the
default) the task fails naming ``process_key`` and the record; with ``apply_keyed(...,
on_error="skip")`` the record is dropped and reported, what it emitted is dropped, and the
key's value is put back as it was before the call (an assignment or ``del`` of
``state.value`` is undone). What the runtime cannot undo: changes made *in place* to a
mutable value before the raise (``state.map[k] = v``, appending to a list), and (in a
``KeyedTimedProcess``) timers registered or deleted before it. Compute first and assign
last to keep a key's state whole.
"""

from __future__ import annotations

from typing import Any, Iterable

from .base import OperatorContext
from .keyed import KeyFn, _Keyed

PROCESS_KEY = "process_key"  #: how a failure names ``process_key``: "process_key of RunningMean"

_ABSENT = object()


class KeyState:
    """The state of the key being processed (a view: valid only during ``process_key``);
    the operator makes it over ``states``, its map key -> value."""

    __slots__ = ("_states", "key")

    def __init__(self, states: dict[Any, Any]):
        self._states = states
        self.key: Any = None

    @property
    def value(self) -> Any:
        """The key's value, or None if it has none."""
        return self._states.get(self.key)

    @value.setter
    def value(self, v: Any) -> None:
        if v is None:
            self._states.pop(self.key, None)  # None means "no value": the key is forgotten
        else:
            self._states[self.key] = v

    @value.deleter
    def value(self) -> None:
        self._states.pop(self.key, None)

    @property
    def map(self) -> dict[Any, Any]:
        """A dict of the key's own (map state), created on first use; change it in place."""
        m = self._states.get(self.key, _ABSENT)
        if m is _ABSENT:
            m = self._states[self.key] = {}
        if not isinstance(m, dict):
            raise TypeError(f"the state of key {self.key!r} is a {type(m).__name__}, not a map: use state.value")
        return m


class KeyedProcess(_Keyed):
    """A keyed operator of yours: implement ``process_key`` (see the module docstring).
    ``apply_keyed`` gives it the stream's key function unless ``key_fn`` (a function of the
    record) is given; an ``__init__`` of yours need not call ``super().__init__()``."""

    key_fn: KeyFn = None
    changed: dict[Any, Any] | set[Any] | None = None

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        if "state" not in self.__dict__:
            self.state = {}

    def process_key(self, key: Any, record: Any, state: KeyState) -> Iterable[Any] | None:
        """One ``record`` of ``key``, with that key's ``state``: return the records to emit
        (None for none). Records of one key come in order per input channel."""
        raise NotImplementedError("implement process_key(key, record, state) in your KeyedProcess subclass")

    def process(self, batch: list[Any]) -> list[Any]:
        states = self.state
        view = KeyState(states)
        out: list[Any] = []
        process_key = self.process_key
        undo = self.on_error == "skip"  # (failing, the task restarts from a checkpoint: nothing to undo)
        keys, batch = self.keys_of(batch)  # records the keys touched
        for key, record in zip(keys, batch):
            view.key = key
            before = states.get(key, _ABSENT) if undo else None
            n = len(out)
            try:
                emitted = process_key(key, record, view)
                if emitted:
                    out.extend(emitted)  # (a generator runs here: its failure is the record's too)
            except Exception as e:
                del out[n:]
                if undo:
                    put_back(states, key, before)
                self.record_failed(record, process_key_label(self), e)
        return out


def put_back(states: dict[Any, Any], key: Any, before: Any) -> None:
    """The key's value as it was before a call that raised (``_ABSENT``: it had none)."""
    if before is _ABSENT:
        states.pop(key, None)
    else:
        states[key] = before


def process_key_label(op: Any, method: str = PROCESS_KEY) -> str:
    return f"{method} of {type(op).__name__}"
