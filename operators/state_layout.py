"""The shape of an operator's keyed state, declared so that the runtime can split it when the
operator's parallelism changes (``redistribute``: ``Operator.rescale_state``'s default,
which runtime/restore.py asks for; written once for every operator family, the operator
writes no rescale code).

An operator declares ``state_layout`` (operators/base.py): one ``Part`` for the whole of
what its ``snapshot`` returns, or a mapping from the fields of that state map to their parts:

- ``Part.KEYED``: a map key -> value; each key goes to the subtask that owns its key group;
- ``Part.KEYED_TIMERS``: timers as ``[domain, timestamp, [key, ...]]`` rows; each key's
  timers go with it (a row keeps only the new subtask's keys);
- ``Part.LOWEST``: a number (a watermark): the lowest of the old subtasks', so that no
  subtask starts ahead of a key it takes over (docs/event-time.md).

Invariant: the old subtasks' keys are disjoint (each key lived where its key group was
routed), so a union filtered by ``owns`` loses and duplicates nothing.

Sources declare none: how a source's unread input is cut and dealt out (byte ranges by
size, partitions round robin, index progressions) belongs to the source, as a split
enumerator belongs to a Flink source (``Source.rescale_state``).
"""

from __future__ import annotations

import enum
from typing import Any, Callable, Mapping, Union

Owns = Callable[[Any], bool]  #: key -> whether the new subtask owns the key's key group


class Part(enum.Enum):
    KEYED = "keyed"
    KEYED_TIMERS = "keyed timers"
    LOWEST = "lowest"


Layout = Union[Part, Mapping[str, Part]]


def _keyed(olds: list[Any], owns: Owns) -> dict[Any, Any]:
    mine: dict[Any, Any] = {}
    for state in olds:
        mine.update((k, v) for k, v in state.items() if owns(k))
    return mine


def _timers(olds: list[Any], owns: Owns) -> list[Any]:
    from abs_engine.codec import freeze  # here: abs_engine imports this module (a decoded tuple key is a list)

    return [[domain, ts, [k for k in bucket if owns(freeze(k))]] for rows in olds for domain, ts, bucket in rows]


def _lowest(olds: list[Any]) -> float:
    return min(olds) if olds else float("-inf")


def _part(part: Part, olds: list[Any], owns: Owns) -> Any:
    if part is Part.KEYED:
        return _keyed(olds, owns)
    if part is Part.KEYED_TIMERS:
        return _timers(olds, owns)
    return _lowest(olds)


def redistribute(layout: Layout, old: list[Any], owns: Owns) -> Any:
    """The state of the new subtask that owns the key groups ``owns`` accepts, from the
    states of all old subtasks (``old``; None or empty for one that held nothing)."""
    present = [s for s in old if s]
    if isinstance(layout, Part):
        return _part(layout, present, owns)
    return {field: _part(part, [s[field] for s in present], owns) for field, part in layout.items()}
