"""The watermark valve: scripted sequences, and a randomised check against its definition
(the highest value ever reached by the minimum over the inputs that are active)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from abs_engine.runtime.watermarks import MAX_WATERMARK, MIN_WATERMARK, Change, WatermarkValve


def test_minimum_over_inputs_and_monotone():
    v = WatermarkValve(["a", "b"])
    assert v.on_watermark("a", 10).change is Change.UNCHANGED  # b is still unknown (-inf)
    s = v.on_watermark("b", 5)
    assert (s.change, s.watermark) == (Change.ADVANCED, 5)
    assert v.on_watermark("b", 3).change is Change.UNCHANGED  # an input's watermark never goes back
    s = v.on_watermark("b", 20)
    assert (s.change, s.watermark) == (Change.ADVANCED, 10)


def test_idle_input_is_left_out_and_rejoins_without_moving_back():
    v = WatermarkValve(["a", "b"])
    v.on_watermark("a", 100)
    s = v.on_idle("b")
    assert (s.change, s.watermark) == (Change.ADVANCED, 100)  # b no longer holds the task back
    s = v.on_idle("a")
    assert s.change is Change.IDLE and v.is_idle
    s = v.on_watermark("b", 40)  # b is active again, behind the task: the task does not go back
    assert (s.change, s.watermark) == (Change.ACTIVE, 100)
    assert not v.is_idle
    s = v.on_watermark("b", 150)  # a is still idle: b alone decides
    assert (s.change, s.watermark) == (Change.ADVANCED, 150)


def test_the_last_input_going_idle_flushes_the_highest_idle_watermark():
    """An input that goes idle while another still holds the minimum down must count when
    that one goes idle too (Flink's flush): else its windows never fire. Found by a test
    whose sources went idle in this order one run in six."""
    v = WatermarkValve(["a", "b"])
    assert v.on_watermark("a", 2996).change is Change.UNCHANGED  # b unknown: -inf
    assert v.on_idle("a").change is Change.UNCHANGED  # b (active, -inf) holds the task back
    s = v.on_idle("b")
    assert (s.change, s.watermark) == (Change.IDLE, 2996) and v.watermark == 2996
    s = v.on_watermark("b", 10)  # b is back, behind: the task never moves back
    assert (s.change, s.watermark) == (Change.ACTIVE, 2996)


def test_end_of_stream_counts_as_infinity():
    v = WatermarkValve(["a", "b"])
    v.on_watermark("a", 7)
    s = v.on_end("b")
    assert (s.change, s.watermark) == (Change.ADVANCED, 7)
    s = v.on_end("a")
    assert (s.change, s.watermark) == (Change.ADVANCED, MAX_WATERMARK)
    assert v.on_watermark("a", 9).change is Change.UNCHANGED  # nothing after the end


def test_unknown_channel_changes_nothing():
    v = WatermarkValve(["a"])
    assert v.on_watermark("zz", 5).change is Change.UNCHANGED
    assert v.watermark == MIN_WATERMARK


def test_a_task_without_inputs_is_never_idle():
    v = WatermarkValve([])
    assert v.on_idle("a").change is Change.UNCHANGED and not v.is_idle


events = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.one_of(st.none(), st.integers(-5, 50),
                                                                         st.just("end"))), max_size=60)


@settings(max_examples=300, deadline=None)
@given(events)
def test_valve_matches_its_definition(evs):
    v = WatermarkValve(["a", "b", "c"])
    marks = {c: MIN_WATERMARK for c in "abc"}
    idle: set[str] = set()
    ended: set[str] = set()
    best = MIN_WATERMARK
    for ch, e in evs:
        before = v.watermark
        if e == "end":
            step = v.on_end(ch)
            if ch not in ended:
                ended.add(ch)
                idle.discard(ch)
        elif e is None:
            step = v.on_idle(ch)
            if ch not in ended:
                idle.add(ch)
        else:
            step = v.on_watermark(ch, e)
            if ch not in ended:
                idle.discard(ch)
                marks[ch] = max(marks[ch], e)
        live = [marks[c] for c in "abc" if c not in idle and c not in ended]
        if not live and len(ended) == 3:
            best = MAX_WATERMARK
        elif live:
            best = max(best, min(live))
        elif step.change is Change.IDLE:  # the last live input went idle: the highest idle one counts
            best = max(best, max(marks[c] for c in idle))
        assert v.watermark == best
        assert v.watermark >= before
        if step.change is Change.ADVANCED:
            assert step.watermark == v.watermark > before
        assert v.is_idle == (not live and len(ended) < 3)
