"""Stateless operators: the batch fast path and the per-record isolation of failures."""

from __future__ import annotations

import pytest

from operators.base import RecordError
from operators.basic import Filter, FlatMap, Map


def half_then_fail(x: int):
    yield (x, "a")
    if x == 2:
        raise ValueError("halfway")
    yield (x, "b")


def test_flat_map_skip_emits_nothing_of_a_record_that_failed_halfway() -> None:
    op = FlatMap(half_then_fail, on_error="skip")
    assert op.process([1, 2, 3]) == [(1, "a"), (1, "b"), (3, "a"), (3, "b")]
    assert [r for r, _ in op.skipped] == [2]


def test_fail_names_the_record_and_keeps_the_users_exception_as_cause() -> None:
    op = Map(lambda x: 10 // x)
    with pytest.raises(RecordError) as info:
        op.process([5, 2, 0, 1])
    assert info.value.record == 0 and isinstance(info.value.__cause__, ZeroDivisionError)


def test_filter_skip_keeps_the_others_in_order() -> None:
    op = Filter(lambda x: 10 // x > 2, on_error="skip")
    assert op.process([1, 0, 2, 5]) == [1, 2]
    assert [r for r, _ in op.skipped] == [0]


def test_bad_on_error_is_refused() -> None:
    with pytest.raises(ValueError, match="on_error"):
        Map(str, on_error="ignore")
