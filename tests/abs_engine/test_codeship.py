"""Code that cannot be sent to the workers is refused before any starts, naming the
operator and the object (codeship.py)."""

from __future__ import annotations

import threading

import pytest

from abs_engine import Dataflow
from abs_engine.codeship import load, ship
from abs_engine.errors import GraphError, GraphErrorReason
from abs_engine.testing import CapturingSink, TestingSource

LOCK = threading.Lock()


def test_a_function_using_a_lock_names_the_operator_and_the_lock(tmp_path) -> None:  # type: ignore[no-untyped-def]
    def guarded(x: int) -> int:  # travels by value (a module's own functions travel by name: workers import them)
        with LOCK:
            return x

    flow = Dataflow("job")
    flow.source(TestingSource([1])).map(guarded, name="parse").sink(CapturingSink(tmp_path / "o"))
    with pytest.raises(GraphError) as e:
        ship(flow.graph)
    assert e.value.reason is GraphErrorReason.UNSHIPPABLE and e.value.operator == "parse"
    assert "global 'LOCK'" in str(e.value) and "_thread.lock" in str(e.value)


def test_a_closure_over_an_open_file_names_the_variable(tmp_path) -> None:  # type: ignore[no-untyped-def]
    handle = open(tmp_path / "f", "w")
    try:
        flow = Dataflow("job")
        flow.source(TestingSource([1])).key_by(lambda r: (handle, r)[1]).count(name="count") \
            .sink(CapturingSink(tmp_path / "o"))
        with pytest.raises(GraphError) as e:
            ship(flow.graph)
        assert e.value.operator == "count" and "closure variable 'handle'" in str(e.value)
    finally:
        handle.close()


def test_shippable_code_round_trips(tmp_path) -> None:  # type: ignore[no-untyped-def]
    flow = Dataflow("job")
    flow.source(TestingSource([1])).map(lambda x: x + 1, name="inc").sink(CapturingSink(tmp_path / "o"))
    assert load(ship(flow.graph))["ops"]["inc"].fn(1) == 2
