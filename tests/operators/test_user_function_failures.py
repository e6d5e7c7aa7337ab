"""Every user function is guarded by the one rule of operators/base.py (``Guarded``): a
function that raises on a record names the record and the function (RecordError); with
on_error="skip" the record is dropped and reported, and the state is as if it had never
come. Family by family: map/flat_map/filter, key functions, reduce/aggregate/stateful_map,
KeyedProcess, KeyedTimedProcess (records and timers), windows (records, and windows as they
fire), the interval join, a source's timestamps, key functions on a hash edge, and the
runtime's one conversion of what user code raised into a task failure."""

from __future__ import annotations

from typing import Any

import pytest

from abs_engine import codec
from abs_engine.plan import OutputSpec
from abs_engine.runtime.output import OperatorFailure, Output, operator_failure
from abs_engine.testing import TestingSource
from operators import Aggregate, AggregateFinal, Count, CountFinal, KeyedProcess, Reduce, StatefulMap
from operators.aggregate import PreAggregate
from operators.base import KeyFunction, OperatorContext, RecordError
from operators.basic import Filter, FlatMap, Map
from operators.eventtime import MAX_WATERMARK, BoundedOutOfOrderness, EventTimeSource
from operators.joins import IntervalJoin
from operators.timers import KeyedTimedProcess
from operators.windows import (AGGREGATE, PROCESS, REDUCE, SessionWindows, SlidingWindows, TumblingWindows,
                               WindowOperator)


def opened(op: Any) -> Any:
    op.open(OperatorContext("op", 0, 1, 0, False))
    return op


def raises_on(bad: Any, fn: Any = lambda r: r) -> Any:
    """``fn``, except that it raises ValueError on ``bad``."""

    def guarded(*args: Any) -> Any:
        if bad in args:
            raise ValueError(f"bad {bad!r}")
        return fn(*args)

    return guarded


def first(r: Any) -> Any:
    return r[0]


def strict_key(r: Any) -> Any:
    if r[0] == "boom":
        raise KeyError("no key")
    return r[0]


# -- the rule itself ----------------------------------------------------------------------

def test_a_record_error_names_the_function_the_exception_and_keeps_the_record() -> None:
    with pytest.raises(RecordError) as info:
        opened(Map(raises_on(3))).process([1, 2, 3, 4])
    e = info.value
    assert e.record == 3 and e.function.startswith("map function")
    assert str(e) == "the map function 'guarded' raised ValueError: bad 3"
    assert isinstance(e.__cause__, ValueError)


def test_skip_drops_and_reports_through_take_skipped() -> None:
    op = opened(Filter(raises_on(2, lambda r: r > 0), on_error="skip"))
    assert op.reports_skipped
    assert op.process([1, 2, 3]) == [1, 3]
    taken = op.take_skipped()
    assert [r for r, _ in taken] == [2] and isinstance(taken[0][1], ValueError)
    assert op.take_skipped() == []  # reported once
    assert not opened(Map(str)).reports_skipped


def test_flat_map_failure_names_its_function() -> None:
    with pytest.raises(RecordError, match="flat_map function 'guarded'"):
        opened(FlatMap(raises_on(1, lambda r: [r, r]))).process([0, 1])


# -- key functions of keyed operators -------------------------------------------------------

@pytest.mark.parametrize("make", [lambda: Count(strict_key), lambda: CountFinal(strict_key),
                                  lambda: Reduce(lambda a, r: (a[0], a[1] + r[1]), strict_key)])
def test_a_failing_key_names_the_key_function_and_the_record(make: Any) -> None:
    with pytest.raises(RecordError) as info:
        opened(make()).process([("a", 1), ("boom", 2)])
    assert info.value.record == ("boom", 2) and "key function 'strict_key'" in str(info.value)


def test_key_on_error_skip_drops_the_record_and_keeps_keys_aligned_with_records() -> None:
    op = opened(Reduce(lambda a, r: (a[0], a[1] + r[1]), strict_key))
    op.key_on_error = "skip"
    op.track_changes()
    # The record after the skipped one must be reduced into its own key, not the next one's.
    assert op.process([("a", 1), ("boom", 2), ("b", 3), ("a", 4)]) == [
        ("a", ("a", 1)), ("b", ("b", 3)), ("a", ("a", 5))]
    assert op.state == {"a": ("a", 5), "b": ("b", 3)}
    assert [r for r, _ in op.take_skipped()] == [("boom", 2)]
    counts = opened(CountFinal(strict_key))
    counts.key_on_error = "skip"
    counts.process([("a", 1), ("boom", 2), ("a", 3)])
    assert dict(counts.finish()) == {"a": 2} and counts.reports_skipped


def test_pre_aggregate_key_failures_follow_key_by_not_the_aggregate() -> None:
    op = opened(PreAggregate(lambda: 0, lambda a, r: a + r[1], key_fn=strict_key))
    op.key_on_error = "skip"
    assert dict(op.process([("a", 1), ("boom", 5), ("a", 2)])) == {"a": 3}
    assert [r for r, _ in op.skipped] == [("boom", 5)]
    with pytest.raises(RecordError, match="add function"):  # the aggregate's own on_error: fail
        op.process([("a", None)])


# -- reduce, aggregate, stateful_map --------------------------------------------------------

def test_aggregate_names_create_add_or_result_and_commits_nothing_of_a_failed_record() -> None:
    def create() -> Any:
        raise RuntimeError("no accumulator")

    with pytest.raises(RecordError, match="create function 'create'"):
        opened(Aggregate(create, lambda a, r: a + r[1], key_fn=first)).process([("a", 1)])
    with pytest.raises(RecordError, match="add function 'guarded'"):
        opened(Aggregate(lambda: 0, raises_on(("a", 2), lambda a, r: a + r[1]), key_fn=first)).process(
            [("a", 1), ("a", 2)])
    result = raises_on(3, lambda acc: acc * 10)
    op = opened(Aggregate(lambda: 0, lambda a, r: a + r[1], result, key_fn=first, on_error="skip"))
    # acc 1 -> 10; +2 = 3 makes result raise: the record is dropped, acc stays 1; +5 = 6.
    assert op.process([("a", 1), ("a", 2), ("a", 5)]) == [("a", 10), ("a", 60)]
    assert op.state == {"a": 6} and [r for r, _ in op.skipped] == [("a", 2)]
    final = opened(AggregateFinal(lambda: 0, lambda a, r: a + r[1], result, key_fn=first))
    final.process([("a", 1), ("a", 2), ("b", 4)])
    with pytest.raises(RecordError) as info:  # at the end: the key's accumulator is the record
        final.finish()
    assert info.value.record == ("a", 3) and "result function" in str(info.value)


def test_stateful_map_skip_leaves_the_state() -> None:
    def step(state: Any, r: Any) -> Any:
        if r[1] < 0:
            raise ValueError("negative")
        total = (state or 0) + r[1]
        return total, total

    op = opened(StatefulMap(step, key_fn=first, on_error="skip"))
    assert op.process([("a", 1), ("a", -1), ("a", 2)]) == [("a", 1), ("a", 3)]
    assert op.state == {"a": 3}
    with pytest.raises(RecordError, match="stateful_map function 'step'"):
        opened(StatefulMap(step, key_fn=first)).process([("a", -1)])


# -- KeyedProcess ---------------------------------------------------------------------------

class Total(KeyedProcess):
    """Assigns the new total, emits, then raises on a negative record: a call that changed
    the key's value and emitted before it raised."""

    def process_key(self, key: Any, record: Any, state: Any) -> Any:
        total = (state.value or 0) + record[1]
        state.value = total
        yield (key, total)
        if record[1] < 0:
            raise ValueError("negative")


def test_keyed_process_skip_puts_the_value_back_and_drops_what_the_call_emitted() -> None:
    op = opened(Total())
    op.key_fn, op.on_error = first, "skip"
    assert op.process([("a", 1), ("a", -5), ("b", -1), ("a", 2)]) == [("a", 1), ("a", 3)]
    assert op.state == {"a": 3}  # "b" had no value: it has none again
    assert [r for r, _ in op.skipped] == [("a", -5), ("b", -1)]
    strict = opened(Total())
    strict.key_fn = first
    with pytest.raises(RecordError) as info:
        strict.process([("a", 1), ("a", -5)])
    assert info.value.record == ("a", -5) and str(info.value).startswith("the process_key of Total raised")


# -- KeyedTimedProcess ----------------------------------------------------------------------

class Alarm(KeyedTimedProcess):
    def process_key(self, key: Any, record: Any, state: Any, ctx: Any) -> Any:
        state.value = (state.value or 0) + 1
        ctx.register_event_time(ctx.timestamp + 10)
        return None

    def on_timer(self, key: Any, timestamp: float, domain: int, state: Any, ctx: Any) -> Any:
        if key == "bad":
            state.value = None  # changed, then raises: put back when skipped
            raise ValueError("no alarm for bad")
        return [(key, timestamp, state.value)]


def alarm(on_error: str = "fail") -> Alarm:
    op = Alarm()
    op.key_fn, op.timestamp_fn, op.on_error = first, (lambda r: r[1]), on_error
    return opened(op)


def test_timed_process_names_the_timestamp_function_and_the_timer() -> None:
    with pytest.raises(RecordError) as info:
        alarm().process([("a", 1), ("b", None)])  # None + 10: process_key...
    assert info.value.record == ("b", None)
    op = alarm()
    op.timestamp_fn = raises_on(("c", 3), lambda r: r[1])
    with pytest.raises(RecordError) as info:
        op.process([("c", 3)])
    assert "timestamp function 'guarded'" in str(info.value)
    op = alarm()
    op.process([("a", 1), ("bad", 2)])
    with pytest.raises(RecordError) as info:
        op.on_watermark(100)
    assert info.value.record == ("bad", 12) and "on_timer of Alarm" in str(info.value)


def test_timed_process_skip_reports_the_timer_and_keeps_the_rest() -> None:
    op = alarm("skip")
    op.process([("a", 1), ("bad", 2), ("z", 3)])
    assert op.on_watermark(100) == [("a", 11, 1), ("z", 13, 1)]
    assert [r for r, _ in op.take_skipped()] == [("bad", 12)]
    assert op.values == {"a": 1, "bad": 1, "z": 1}


# -- windows --------------------------------------------------------------------------------

def count_window(windows: Any, add: Any = lambda a, r: a + 1, on_error: str = "fail", lateness: int = 0,
                 merge: Any = None, result: Any = None) -> WindowOperator:
    op = WindowOperator(windows, lambda r: r[1], AGGREGATE, add, key_fn=first, create=lambda: 0, merge=merge,
                        result=result, allowed_lateness=lateness, on_error=on_error)
    op.late_stream = True
    return opened(op)


def run(op: WindowOperator, batches: list[list[Any]], marks: list[float]) -> list[Any]:
    out: list[Any] = []
    for batch, wm in zip(batches, marks):
        out += op.process(batch)
        out += op.on_watermark(wm)
    return out


def no_bad(r: Any) -> bool:
    return len(r) < 3


def refuses_bad_after_first(acc: Any, r: Any) -> Any:
    """An add that accepts a bad record into a fresh window but raises on it in a window
    that has records: in a sliding window it fails on the second window it updates."""
    if not no_bad(r) and acc > 0:
        raise ValueError("bad record")
    return acc + 1


@pytest.mark.parametrize("windows,merge,must_skip", [
    (TumblingWindows(10), None, [("a", 15, "bad"), ("b", 4, "bad")]),
    # ("a", 25) adds to the fresh [20, 40), then fails on [10, 30): neither may change.
    (SlidingWindows(20, 10), None, [("a", 15, "bad"), ("b", 4, "bad"), ("a", 25, "bad")]),
    (SlidingWindows(20, 10), lambda a, b: a + b, [("a", 15, "bad"), ("b", 4, "bad")]),  # panes
    (SessionWindows(5), lambda a, b: a + b, [("a", 15, "bad"), ("b", 4, "bad")]),
])
def test_a_skipped_record_leaves_every_window_as_if_it_never_came(windows: Any, merge: Any,
                                                                  must_skip: list[Any]) -> None:
    batches = [[("a", 5), ("a", 12), ("b", 3)], [("a", 15, "bad"), ("a", 16), ("b", 4, "bad"), ("a", 25, "bad")],
               [("a", 27)]]
    marks = [0, 9, MAX_WATERMARK]
    skipping = count_window(windows, refuses_bad_after_first, "skip", merge=merge)
    got = run(skipping, batches, marks)
    skipped = [r for r, _ in skipping.skipped]
    assert sorted(skipped) == sorted(must_skip)
    # The oracle: the same windows over the records that were not skipped.
    oracle = run(count_window(windows, merge=merge), [[r for r in b if r not in skipped] for b in batches], marks)
    assert got == oracle and oracle
    with pytest.raises(RecordError) as info:
        run(count_window(windows, refuses_bad_after_first, merge=merge), batches, marks)
    assert info.value.record == ("a", 15, "bad") and "add function 'refuses_bad_after_first'" in str(info.value)


def test_window_key_and_timestamp_failures_name_their_functions() -> None:
    op = count_window(TumblingWindows(10))
    with pytest.raises(RecordError) as info:
        op.process([("a", 1), ("a", "noon")])  # a timestamp that is no number
    assert info.value.record == ("a", "noon") and "timestamp function" in str(info.value)
    op = count_window(TumblingWindows(10))
    op.key_fn = strict_key
    with pytest.raises(RecordError, match="key function 'strict_key'"):
        op.process([("boom", 1)])
    op.key_on_error = "skip"
    op.process([("boom", 1), ("a", 2)])
    assert op.on_watermark(MAX_WATERMARK) == [("a", 0, 10, 1)]
    assert [r for r, _ in op.skipped] == [("boom", 1)]


def test_a_window_that_fails_as_it_fires_is_named_as_key_start_end() -> None:
    result = raises_on(2, lambda n: n * 100)  # the count 2 cannot be shown
    batch = [("a", 1), ("a", 2), ("b", 3), ("c", 14)]
    with pytest.raises(RecordError) as info:
        run(count_window(TumblingWindows(10), result=result), [batch], [MAX_WATERMARK])
    assert info.value.record == ("a", 0, 10) and "result function 'guarded'" in str(info.value)
    op = count_window(TumblingWindows(10), result=result, on_error="skip")
    assert run(op, [batch], [MAX_WATERMARK]) == [("b", 0, 10, 100), ("c", 10, 20, 100)]
    assert [r for r, _ in op.skipped] == [("a", 0, 10)] and op.state == {}  # fired windows are purged


def test_a_process_window_function_failure_names_the_window() -> None:
    def show(key: Any, start: Any, end: Any, records: list[Any]) -> Any:
        if key == "b":
            raise ValueError("not b")
        return [(key, start, len(records))]

    op = opened(WindowOperator(TumblingWindows(10), lambda r: r[1], PROCESS, show, key_fn=first, on_error="skip"))
    assert run(op, [[("a", 1), ("b", 2)]], [MAX_WATERMARK]) == [("a", 0, 1)]
    assert [r for r, _ in op.skipped] == [("b", 0, 10)]


@pytest.mark.parametrize("windows,merge,fired", [
    (TumblingWindows(10), None, [("a", 0, 10, 2)]),
    (SlidingWindows(20, 10), lambda a, b: a + b, [("a", -10, 10, 2), ("a", 0, 20, 2)]),  # panes
])
def test_a_late_record_whose_refire_fails_is_skipped_and_the_window_is_unchanged(windows: Any, merge: Any,
                                                                                 fired: list[Any]) -> None:
    # The windows holding ("a", 1), ("a", 2) fire and are kept 20 more; the late record
    # ("a", 4) would make a count of 3, which the result refuses as the window fires again:
    # skipped, every window (or pane) still counts 2.
    result = raises_on(3, lambda n: n)
    op = count_window(windows, result=result, lateness=20, merge=merge, on_error="skip")
    assert op.process([("a", 1), ("a", 2)]) == [] and op.on_watermark(19) == fired
    assert op.process([("a", 4)]) == []
    assert [r for r, _ in op.skipped] == [("a", 4)] and op.state["a"][0][2] == 2
    assert op.process([("a", 5, "again")]) == []  # the same refusal: nothing changed in between
    reduce_op = opened(WindowOperator(TumblingWindows(10), lambda r: r[1], REDUCE, lambda a, r: a, key_fn=first))
    assert reduce_op.process([("a", 1)]) == []  # REDUCE without failures: unchanged behaviour


def test_a_late_record_in_a_new_pane_whose_refire_fails_leaves_no_pane() -> None:
    # ("a", 14) makes the new pane [10, 20); the kept window [0, 20) fires again with a
    # count of 2, which the result refuses: the pane goes, and nothing else changes.
    op = count_window(SlidingWindows(20, 10), result=raises_on(2, lambda n: n), lateness=20,
                      merge=lambda a, b: a + b, on_error="skip")
    assert op.process([("a", 1)]) == [] and op.on_watermark(19) == [("a", -10, 10, 1), ("a", 0, 20, 1)]
    assert op.process([("a", 14)]) == []
    assert [r for r, _ in op.skipped] == [("a", 14)] and list(op.state["a"]) == [0]
    assert op.on_watermark(MAX_WATERMARK) == []  # [10, 30) has no pane: its timer finds nothing


def test_a_late_record_a_sliding_process_window_refuses_is_taken_out_of_its_windows_again() -> None:
    def show(key: Any, start: Any, end: Any, records: list[Any]) -> Any:
        if len(records) > 2:
            raise ValueError("too many")
        return [(key, start, len(records))]

    op = opened(WindowOperator(SlidingWindows(20, 10), lambda r: r[1], PROCESS, show, key_fn=first,
                               allowed_lateness=20, on_error="skip"))
    assert op.process([("a", 1), ("a", 2)]) == [] and op.on_watermark(19) == [("a", -10, 2), ("a", 0, 2)]
    assert op.process([("a", 4)]) == []  # appended to [0, 20), which then refuses it as it fires again
    assert [r for r, _ in op.skipped] == [("a", 4)]
    assert {s: len(w[2]) for s, w in op.state["a"].items()} == {-10: 2, 0: 2}


# -- the interval join ----------------------------------------------------------------------

def join(on_error: str = "fail") -> IntervalJoin:
    def pair(left: Any, right: Any) -> Any:
        if right[1] == "bad":
            raise ValueError("cannot join bad")
        return (left[1], right[1])

    return opened(IntervalJoin(-5, 5, pair, (first, strict_key), (lambda r: r[2], lambda r: r[2]), on_error))


def test_join_failures_name_the_side_function_and_skip_buffers_nothing() -> None:
    with pytest.raises(RecordError) as info:
        join().process([(0, ("k", "l1", 10)), (1, ("k", "bad", 11))])
    assert info.value.record == (1, ("k", "bad", 11)) and "join function 'pair'" in str(info.value)
    with pytest.raises(RecordError, match="right input's key function 'strict_key'"):
        join().process([(1, ("boom", "r", 1))])
    op = join("skip")
    out = op.process([(0, ("k", "l1", 10)), (1, ("k", "bad", 11)), (1, ("k", "r1", 12)), (0, ("k", "l2", 13)),
                      (1, ("boom", "r", 1))])
    assert out == [("l1", "r1"), ("l2", "r1")]  # "bad" was never buffered: l2 meets only r1
    assert [r for r, _ in op.skipped] == [(1, ("k", "bad", 11)), (1, ("boom", "r", 1))]


# -- a source's timestamps ------------------------------------------------------------------

def event_source(records: list[Any], on_error: str = "fail") -> EventTimeSource[Any]:
    src = EventTimeSource(TestingSource(records, batch_size=100), lambda r: float(r.split(",")[1]),
                          BoundedOutOfOrderness(0), on_error)
    return opened(src)  # type: ignore[no-any-return]


def test_a_bad_row_names_the_timestamps_function_and_the_row() -> None:
    with pytest.raises(RecordError) as info:
        event_source(["a,1", "b,2", "garbage", "c,3"]).read_batch()
    assert info.value.record == "garbage" and "timestamps function '<lambda>'" in str(info.value)
    with pytest.raises(RecordError) as info:  # no number: named too
        opened(EventTimeSource(TestingSource([("a", 1), ("b", "noon")]), lambda r: r[1],
                               BoundedOutOfOrderness(0))).read_batch()
    assert info.value.record == ("b", "noon") and "must be a number" in str(info.value)


def test_skip_leaves_the_row_out_of_the_batch_and_of_the_watermark() -> None:
    src = event_source(["a,1", "b,9", "garbage,", "c,3"], "skip")
    assert src.read_batch() == ["a,1", "b,9", "c,3"] and src.watermark() == 8
    assert [r for r, _ in src.take_skipped()] == ["garbage,"] and src.reports_skipped
    only_bad = event_source(["x", "y"], "skip")
    assert only_bad.read_batch() == [] and only_bad.watermark() == float("-inf")


# -- key functions on a hash edge -----------------------------------------------------------

class Channel:
    def __init__(self) -> None:
        self.records = 0
        self.frames: list[bytes] = []

    def send(self, frame: bytes) -> None:
        self.frames.append(frame)

    def received(self) -> list[Any]:
        return [r for f in self.frames for r in codec.unpack(f[codec.HEADER_SIZE:])]


def edge(key_fn: Any, n: int = 2) -> tuple[Output, list[Channel]]:
    chans = [Channel() for _ in range(n)]
    spec = OutputSpec(0, "hash", "count", tuple(f"c{i}" for i in range(n)))
    return Output(spec, chans, key_fn, "read"), chans  # type: ignore[arg-type]


def test_an_edge_key_failure_blames_key_by_and_names_the_record() -> None:
    out, _ = edge(strict_key)
    with pytest.raises(OperatorFailure) as info:
        out.emit([("a", 1), ("boom", 2)])
    f = info.value
    assert f.operator == "key_by(strict_key) of 'count'" and f.record == ("boom", 2) and not f.fatal
    assert "key function 'strict_key' raised KeyError" in str(f.__cause__)
    out, _ = edge(lambda r: [r])
    with pytest.raises(OperatorFailure) as info:
        out.emit([1])
    assert info.value.fatal and "unhashable" in str(info.value.__cause__)  # retrying cannot help


def test_an_edge_key_skip_sends_every_other_record_where_it_belongs() -> None:
    batch = [("a", 1), ("boom", 2), ("b", 3), ("a", 4), ("boom", 5)]
    out, chans = edge(KeyFunction(strict_key, "skip"))
    assert out.reports_skipped and out.label == "key_by(strict_key) of 'count'"
    out.emit(batch)
    plain, oracle = edge(first)
    plain.emit([r for r in batch if r[0] != "boom"])
    assert [c.received() for c in chans] == [c.received() for c in oracle]
    assert [r for r, _ in out.take_skipped()] == [("boom", 2), ("boom", 5)]


# -- the runtime's one conversion -----------------------------------------------------------

class Fatal(Exception):
    fatal = True


def test_operator_failure_carries_the_record_and_keeps_io_errors_retryable() -> None:
    def failed(cause: BaseException) -> RecordError:
        try:
            raise RecordError(7, "map function 'f'") from cause
        except RecordError as e:
            return e

    f = operator_failure("double", failed(ValueError("x")))
    assert f.operator == "double" and f.record == 7 and f.has_record and not f.fatal
    assert isinstance(f.__cause__, RecordError)  # its line names the function and the exception
    io = operator_failure("double", failed(ConnectionError("down")))
    assert isinstance(io.__cause__, ConnectionError)  # the worker never calls it a poison record
    assert operator_failure("double", failed(Fatal())).fatal
    plain = operator_failure("double", ValueError("no record"))
    assert not plain.has_record and isinstance(plain.__cause__, ValueError)
