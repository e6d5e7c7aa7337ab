"""Dataflow and operator names (names.py): refused when given, with the rule."""

from __future__ import annotations

import pytest

from abs_engine import Dataflow
from abs_engine.errors import GraphError, GraphErrorReason
from abs_engine.testing import TestingSource


@pytest.mark.parametrize("name", ["a/b", "..", "../x", ".hidden", "a\x00b", "a#0", "x->y", "", "x" * 101, "ü",
                                  "with space", "a\nb"])
def test_a_bad_operator_name_is_refused_at_build(name: str) -> None:
    flow = Dataflow("job")
    s = flow.source(TestingSource([1]))
    with pytest.raises(GraphError) as e:
        s.map(str, name=name)
    assert e.value.reason is GraphErrorReason.BAD_NAME and "operator name" in str(e.value)
    with pytest.raises(GraphError) as e:
        Dataflow(name)
    assert e.value.reason is GraphErrorReason.BAD_NAME and "dataflow name" in str(e.value)


def test_a_non_string_name_is_refused() -> None:
    with pytest.raises(GraphError) as e:
        Dataflow(42)  # type: ignore[arg-type]
    assert e.value.reason is GraphErrorReason.BAD_NAME


@pytest.mark.parametrize("name", ["read", "count_final_2", "q5.bids", "x-1", "_private", "A" * 100])
def test_good_names_pass(name: str) -> None:
    flow = Dataflow(name)
    flow.source(TestingSource([1]), name=name)
    assert name in flow.graph.nodes
