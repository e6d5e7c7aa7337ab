"""The event-time API refuses bad input with a GraphError naming the problem and the fix,
and the compiled plan shows what it built (event-time sources, windows, a late side output)."""

from __future__ import annotations

from typing import Any

import pytest

from abs_engine import Dataflow, GraphError
from abs_engine.errors import GraphErrorReason
from abs_engine.testing import CapturingSink, TestingSource
from operators import BoundedOutOfOrderness, SessionWindows, TumblingWindows, ascending


def _ts(r: Any) -> int:
    return int(r[1])


def _key(r: Any) -> str:
    return str(r[0])


def bad(fn: Any, match: str) -> None:
    with pytest.raises(GraphError, match=match) as info:
        fn()
    assert info.value.reason is GraphErrorReason.BAD_ARGUMENT


def test_bad_event_time_arguments_are_graph_errors_that_name_the_fix():
    flow = Dataflow("bad")
    src = TestingSource([("a", 1)])
    bad(lambda: flow.source(src, watermarks=ascending()), "watermarks= needs timestamps=")
    bad(lambda: flow.source(src, timestamps=_ts, watermarks=5), "takes a BoundedOutOfOrderness")
    bad(lambda: flow.source(src, timestamps=3), "timestamps= must be a function")
    keyed = flow.source(src, "s", timestamps=_ts).key_by(_key)
    bad(lambda: keyed.window("10s", _ts), "TumblingWindows, SlidingWindows or SessionWindows")
    bad(lambda: keyed.window(TumblingWindows(10), 3), "timestamp must be a function")
    bad(lambda: keyed.window(TumblingWindows(10), _ts, allowed_lateness=0.5), "allowed_lateness must be an int")
    bad(lambda: keyed.window(TumblingWindows(10), _ts, allowed_lateness=-1), "allowed_lateness must be an int >= 0")
    bad(lambda: keyed.window(SessionWindows(5), _ts).aggregate(lambda: 0, lambda a, r: a + 1), "needs merge=")
    other = flow.source(TestingSource([("a", 2)]), "t", timestamps=_ts)
    bad(lambda: flow.source(src, "u").interval_join(other, _key, _key, _ts, 7, -1, 1, lambda a, b: a),
        "other_timestamp must be a function")
    with pytest.raises(ValueError, match="max_delay"):
        BoundedOutOfOrderness(-1)


def test_the_plan_shows_event_time_sources_windows_and_the_late_side_output():
    flow = Dataflow("plan", parallelism=2)
    res = (flow.source(TestingSource([("a", 1)]), "read", timestamps=_ts, watermarks=ascending())
           .key_by(_key).window(TumblingWindows(10), _ts).aggregate(lambda: 0, lambda a, r: a + 1, name="win"))
    res.sink(CapturingSink("/tmp/unused-out"), "out", parallelism=1)
    res.late.sink(CapturingSink("/tmp/unused-late"), "late", parallelism=1)
    plan = flow.explain()
    assert "TestingSource[event time]" in plan and "side output" in plan and "win" in plan


def test_the_plan_shows_every_window_parameter():
    """Window sizes, slides, gaps and allowed lateness: what decides a window's output is in
    the plan's text (it used to say only `session`)."""
    from operators import SlidingWindows

    flow = Dataflow("params", parallelism=1)
    s = flow.source(TestingSource([("a", 1)]), "read", timestamps=_ts, watermarks=ascending()).key_by(_key)
    s.window(SessionWindows(gap=30), _ts).aggregate(lambda: 0, lambda a, r: a + 1, merge=lambda a, b: a + b,
                                                    name="sessions").sink(CapturingSink("/tmp/unused-1"), "o1")
    s.window(TumblingWindows(10, offset=2), _ts, allowed_lateness=5).reduce(lambda a, b: a, name="tumbling").sink(
        CapturingSink("/tmp/unused-2"), "o2")
    s.window(SlidingWindows(20, 5), _ts).reduce(lambda a, b: a, name="sliding").sink(CapturingSink("/tmp/unused-3"),
                                                                                      "o3")
    plan = flow.explain()
    assert "session(gap=30)" in plan
    assert "tumbling(size=10, offset=2), allowed_lateness=5" in plan
    assert "sliding(size=20, slide=5)" in plan
