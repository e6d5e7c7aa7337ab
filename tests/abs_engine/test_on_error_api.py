"""on_error is accepted, validated and passed on wherever a user function is declared:
a source's timestamps, key_by, windows, apply_keyed and the interval join."""

from __future__ import annotations

from typing import Any

import pytest

from abs_engine import Dataflow, GraphError
from abs_engine.errors import GraphErrorReason
from abs_engine.testing import TestingSource
from operators import KeyedProcess, TumblingWindows
from operators.base import KeyFunction


def _ts(r: Any) -> int:
    return int(r[1])


def _key(r: Any) -> str:
    return str(r[0])


class Nothing(KeyedProcess):
    def process_key(self, key: Any, record: Any, state: Any) -> Any:
        return None


def bad(fn: Any, match: str) -> None:
    with pytest.raises(GraphError, match=match) as info:
        fn()
    assert info.value.reason is GraphErrorReason.BAD_ARGUMENT


def test_a_bad_on_error_is_refused_everywhere() -> None:
    flow = Dataflow("bad")
    src = flow.source(TestingSource([("a", 1)]), "s", timestamps=_ts)
    keyed = src.key_by(_key)
    bad(lambda: flow.source(TestingSource([]), timestamps=_ts, on_error="ignore"), "on_error must be")
    bad(lambda: flow.source(TestingSource([]), on_error="skip"), "applies to the timestamps= function")
    bad(lambda: src.key_by(_key, on_error="retry"), "on_error must be")
    bad(lambda: keyed.window(TumblingWindows(10), _ts).aggregate(lambda: 0, lambda a, r: a, on_error="x"),
        "on_error must be")
    bad(lambda: keyed.apply_keyed(Nothing(), on_error="x"), "on_error must be")
    bad(lambda: src.interval_join(src, _key, _key, _ts, _ts, 0, 1, lambda a, b: a, on_error="x"), "on_error must be")


def test_on_error_reaches_the_functions_it_guards() -> None:
    flow = Dataflow("ok", parallelism=2)
    src = flow.source(TestingSource([("a", 1)]), "s", timestamps=_ts, on_error="skip")
    assert flow.graph.nodes["s"].template.on_error == "skip"
    src.key_by(_key, on_error="skip").count(name="c")
    node = flow.graph.nodes["c"]
    assert node.template.key_on_error == "skip"  # the operator computes keys too
    assert isinstance(node.key_fn, KeyFunction) and node.key_fn.on_error == "skip"  # and the shuffle
    assert node.key_fn(("b", 2)) == "b"  # (the restore path calls it as a function)
    src.key_by(_key).count(name="plain")
    assert flow.graph.nodes["plain"].key_fn is _key  # the default is unchanged
    src.key_by(_key).window(TumblingWindows(10), _ts).reduce(lambda a, r: a, name="w", on_error="skip")
    assert flow.graph.nodes["w"].template.on_error == "skip"
    src.key_by(_key).apply_keyed(Nothing(), name="k", on_error="skip")
    assert flow.graph.nodes["k"].template.on_error == "skip"
    src.interval_join(src, _key, _key, _ts, _ts, 0, 1, lambda a, b: a, name="j", on_error="skip")
    join = flow.graph.nodes["j"]
    assert join.template.on_error == join.template.key_on_error == "skip"
    assert join.key_fn.name == "_key, _key"  # what a key failure on the shuffle names
