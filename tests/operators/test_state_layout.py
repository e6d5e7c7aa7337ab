"""A rescaled keyed operator's state, split by the runtime from its declared layout
(``redistribute``): nothing lost, nothing duplicated, whatever the parallelisms, and
every stateful operator of the library has a rule."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import random

import pytest

import operators
from abs_engine.keygroups import key_group, key_group_range
from operators.base import Operator, Sink
from operators.state_layout import Part, redistribute

TIMED = {"keys": Part.KEYED, "timers": Part.KEYED_TIMERS, "watermark": Part.LOWEST}


def owner(max_p: int, p: int, i: int):  # type: ignore[no-untyped-def]
    groups = key_group_range(max_p, p, i)
    return lambda key: key_group(key, max_p) in groups


def split_by_owner(values: dict, max_p: int, p: int) -> list[dict]:  # type: ignore[type-arg]
    return [{k: v for k, v in values.items() if owner(max_p, p, i)(k)} for i in range(p)]


@pytest.mark.parametrize("seed", range(20))
def test_keyed_state_moves_whole_to_its_new_owners(seed: int) -> None:
    rng = random.Random(seed)
    max_p = rng.choice([8, 128, 1000])
    p_old, p_new = rng.randint(1, 6), rng.randint(1, 6)
    values = {rng.choice([rng.randint(0, 10**6), f"w{rng.randint(0, 10**6)}", (rng.randint(0, 9), "t")]): rng.random()
              for _ in range(rng.randint(0, 300))}
    old = [s or None for s in split_by_owner(values, max_p, p_old)]  # an empty subtask may hold None
    new = [redistribute(Part.KEYED, old, owner(max_p, p_new, i)) for i in range(p_new)]
    assert new == split_by_owner(values, max_p, p_new)  # every key once, with its value, where it belongs


def test_timers_go_with_their_keys_and_the_watermark_is_the_lowest() -> None:
    max_p = 128
    owns = owner(max_p, 2, 0)
    mine = next(k for k in range(100) if owns(k))
    theirs = next(k for k in range(100) if not owns(k))
    tuple_key = next(("k", i) for i in range(100) if owns(("k", i)))
    old = [{"keys": {mine: 1}, "timers": [[0, 5.0, [mine, theirs]]], "watermark": 7.0},
           None,
           {"keys": {theirs: 2, tuple_key: 3}, "timers": [[1, 9.0, [theirs, list(tuple_key)]]], "watermark": 3.0}]
    got = redistribute(TIMED, old, owns)
    # a decoded tuple key arrives as a list: it is placed as the tuple it was
    assert got == {"keys": {mine: 1, tuple_key: 3}, "timers": [[0, 5.0, [mine]], [1, 9.0, [list(tuple_key)]]],
                   "watermark": 3.0}
    assert redistribute(TIMED, [None, None], owns) == {"keys": {}, "timers": [], "watermark": float("-inf")}


def _library_operators() -> list[type]:
    for info in pkgutil.iter_modules(operators.__path__):
        importlib.import_module(f"operators.{info.name}")
    seen, todo = [], [Operator]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub.__module__.startswith("operators.") and sub not in seen:
                seen.append(sub)
                todo.append(sub)
    return seen


def test_every_library_operator_with_state_has_a_rescale_rule() -> None:
    """State an operator snapshots is split by its declared layout, or by its own
    rescale_state; one with neither is refused at a rescale, as a sink is (its files are
    its subtask's: docs/state-and-rescaling.md), and no other operator of ours is."""
    found = _library_operators()
    assert len(found) > 20
    refused = [cls for cls in found
               if cls.snapshot is not Operator.snapshot and not inspect.isabstract(cls)
               and cls.state_layout is None and cls.rescale_state is Operator.rescale_state]
    assert refused and all(issubclass(cls, Sink) for cls in refused), refused
