"""The barrier handler (runtime/barriers.py) by scripted sequences: each step feeds one
event and checks the actions that come back, in order -- aligned (ABS) on two inputs,
an alignment abandoned by a newer barrier, unaligned at the first barrier and at a
trigger, the switch on aligned_timeout, stop-the-world, and back-edge logging and holding
on a cycle."""

from __future__ import annotations

from abs_engine.runtime.barriers import BarrierHandler, Block, Release, Snapshot, Write


def snap(cid: int, unaligned: bool = False, arrived: frozenset[str] = frozenset(), barrier: bool = True) -> Snapshot:
    return Snapshot(cid, unaligned, arrived, barrier)


def test_aligned_two_inputs_block_the_first_then_snapshot_and_release() -> None:
    h = BarrierHandler(["a", "b"], [])
    assert h.on_barrier("a", False, 1, False, now=10.0) == [Block("a")]
    assert not h.may_take("a", False) and h.may_take("b", False)
    assert h.collecting() == 1 and h.aligning_since == 10.0
    assert h.on_barrier("b", False, 1, False, now=10.5) == [snap(1), Release()]
    assert h.may_take("a", False) and h.collecting() is None and h.last_snapshot == 1
    released, completed = h.started(1, "state", False, ())
    assert released == () and [s.checkpoint_id for s in completed] == [1]  # nothing to log: complete at once
    # A late duplicate of barrier 1 (say, from a task triggered directly) changes nothing.
    assert h.on_barrier("a", False, 1, False, now=11.0) == []


def test_a_newer_barrier_abandons_the_alignment_in_progress() -> None:
    h = BarrierHandler(["a", "b"], [])
    assert h.on_barrier("a", False, 1, False, now=0.0) == [Block("a")]
    # Checkpoint 1 was given up upstream: barrier 2 on b frees a and collects 2.
    assert h.on_barrier("b", False, 2, False, now=1.0) == [Release(), Block("b")]
    assert h.collecting() == 2 and h.aligning_since == 1.0
    assert h.on_barrier("a", False, 2, False, now=2.0) == [snap(2), Release()]


def test_an_input_that_ends_counts_as_aligned() -> None:
    h = BarrierHandler(["a", "b"], [])
    h.on_barrier("a", False, 3, False, now=0.0)
    assert h.on_end_of_stream("b", False) == [snap(3), Release()]
    assert not h.regular_ended
    assert h.on_end_of_stream("a", False) == [] and h.regular_ended


def test_unaligned_at_the_first_barrier_logs_the_other_input_until_its_barrier() -> None:
    h = BarrierHandler(["a", "b"], [])
    assert h.on_barrier("a", False, 1, True, now=0.0) == [snap(1, True, frozenset({"a"})), Release()]
    released, completed = h.started(1, "state", True, {"a"})
    assert completed == () and h.log.waiting_on("b") == 1 and h.log.waiting_on("a") == 0
    h.log.on_records("b", b"\x91\x01")  # one record, [1], in flight on b at the cut
    done = h.on_barrier("b", False, 1, True, now=1.0)
    assert len(done) == 1 and isinstance(done[0], Write)
    (session,) = done[0].sessions
    assert session.checkpoint_id == 1 and session.logged == 1 and session.unaligned


def test_an_unaligned_trigger_abandons_alignment_and_counts_what_it_collected() -> None:
    h = BarrierHandler(["a", "b"], [])
    h.on_barrier("a", False, 4, False, now=0.0)
    assert h.on_trigger(4, True, direct=False) == [snap(4, True, frozenset({"a"})), Release()]
    assert h.on_trigger(4, True, direct=False) == []  # a duplicate
    assert h.on_trigger(5, False, direct=False) == []  # an aligned trigger reaches only direct tasks
    assert h.on_trigger(5, False, direct=True) == [snap(5)]


def test_the_aligned_timeout_turns_a_long_alignment_unaligned() -> None:
    h = BarrierHandler(["a", "b"], [], aligned_timeout=0.5)
    h.on_barrier("a", False, 1, False, now=10.0)
    assert h.alignment_deadline() == 10.5
    assert h.on_timeout(10.4) == []
    assert h.on_timeout(10.5) == [snap(1, True, frozenset({"a"})), Release()]
    assert h.collecting() is None and h.last_snapshot == 1
    # Its barrier on b, later, only closes b's log.
    h.started(1, "s", True, {"a"})
    out = h.on_barrier("b", False, 1, False, now=11.0)
    assert len(out) == 1 and isinstance(out[0], Write)


def test_stop_the_world_snapshots_without_a_barrier_once() -> None:
    h = BarrierHandler(["a"], ["loop"])
    assert h.stop_the_world(7) == [snap(7, barrier=False)]
    assert h.stop_the_world(7) == []


def test_a_back_edge_is_logged_until_its_barrier_comes_round_and_held_if_it_comes_first() -> None:
    h = BarrierHandler(["in"], ["loop"])
    assert h.on_barrier("in", False, 1, False, now=0.0) == [snap(1), Release()]
    assert h.started(1, "s", False, ()) == ((), ())
    assert h.log.waiting_on("loop") == 1
    h.log.on_records("loop", b"\x91\x07")
    out = h.on_barrier("loop", True, 1, False, now=1.0)
    assert isinstance(out[0], Write) and out[0].sessions[0].logged == 1
    # Barrier 2 comes round the loop before the task triggers 2: the back-edge is held.
    assert h.on_barrier("loop", True, 2, False, now=2.0) == []
    assert not h.may_take("loop", True)
    assert h.on_barrier("in", False, 2, False, now=3.0) == [snap(2), Release()]
    released, completed = h.started(2, "s", False, ())
    assert released == ("loop",) and [s.checkpoint_id for s in completed] == [2]  # nothing in flight for 2
    assert h.may_take("loop", True)


def test_after_the_loop_ended_back_edge_barriers_mean_nothing() -> None:
    h = BarrierHandler(["in"], ["loop"])
    h.on_barrier("in", False, 1, False, now=0.0)
    h.started(1, "s", False, ())
    out = h.end_loop(["loop"])
    assert isinstance(out[0], Write) and out[0].sessions[0].checkpoint_id == 1
    assert h.end_loop(["loop"]) == []
    assert h.on_barrier("loop", True, 2, False, now=1.0) == []
