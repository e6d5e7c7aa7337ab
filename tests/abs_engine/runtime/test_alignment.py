"""Tests of abs_engine/runtime/alignment.py: the barrier alignment state machine."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from abs_engine.runtime.alignment import BarrierAligner, Decision, Outcome


def blocked(a: BarrierAligner, channels: list[str]) -> set[str]:
    return {c for c in channels if a.is_blocked(c)}


# ---------------------------------------------------------------------------------------
# scripted sequences
# ---------------------------------------------------------------------------------------


def test_single_input_triggers_immediately() -> None:
    a = BarrierAligner(["x"])
    assert a.on_barrier("x", 1) == Decision(Outcome.TRIGGERED, 1)
    assert not a.is_blocked("x")
    assert a.on_barrier("x", 2) == Decision(Outcome.TRIGGERED, 2)
    assert not a.is_blocked("x")


def test_two_inputs_block_then_trigger() -> None:
    chans = ["a", "b"]
    al = BarrierAligner(chans)
    assert blocked(al, chans) == set()
    d = al.on_barrier("a", 1)
    assert d.outcome is Outcome.BLOCKED and d.checkpoint_id == 1 and d.aborted is None
    assert blocked(al, chans) == {"a"}
    d = al.on_barrier("b", 1)
    assert d == Decision(Outcome.TRIGGERED, 1)
    assert blocked(al, chans) == set()
    # the next checkpoint, this time b first
    assert al.on_barrier("b", 2).outcome is Outcome.BLOCKED
    assert blocked(al, chans) == {"b"}
    assert al.on_barrier("a", 2) == Decision(Outcome.TRIGGERED, 2)
    assert blocked(al, chans) == set()


def test_three_inputs_block_one_by_one() -> None:
    chans = ["a", "b", "c"]
    al = BarrierAligner(chans)
    assert al.on_barrier("c", 7).outcome is Outcome.BLOCKED
    assert blocked(al, chans) == {"c"}
    assert al.on_barrier("a", 7).outcome is Outcome.BLOCKED
    assert blocked(al, chans) == {"a", "c"}
    assert al.on_barrier("b", 7) == Decision(Outcome.TRIGGERED, 7)
    assert blocked(al, chans) == set()


def test_stale_barrier_is_ignored() -> None:
    chans = ["a", "b"]
    al = BarrierAligner(chans)
    al.on_barrier("a", 3)
    al.on_barrier("b", 3)  # triggered 3
    for old in (1, 2, 3):
        assert al.on_barrier("a", old) == Decision(Outcome.IGNORED, old)
        assert blocked(al, chans) == set()
    # an older barrier while collecting a newer one is ignored too, and does not block
    assert al.on_barrier("a", 5).outcome is Outcome.BLOCKED
    assert al.on_barrier("b", 4) == Decision(Outcome.IGNORED, 4)
    assert blocked(al, chans) == {"a"}
    assert al.on_barrier("b", 5) == Decision(Outcome.TRIGGERED, 5)


def test_newer_barrier_while_collecting_aborts_older() -> None:
    chans = ["a", "b", "c"]
    al = BarrierAligner(chans)
    assert al.on_barrier("a", 1).outcome is Outcome.BLOCKED
    d = al.on_barrier("b", 2)
    assert d == Decision(Outcome.ABORTED_AND_BLOCKED, 2, aborted=1)
    # a is released (its barrier 1 is void), b is now blocked for 2
    assert blocked(al, chans) == {"b"}
    # the abandoned checkpoint is stale from now on
    assert al.on_barrier("c", 1) == Decision(Outcome.IGNORED, 1)
    assert blocked(al, chans) == {"b"}
    assert al.on_barrier("a", 2).outcome is Outcome.BLOCKED
    assert al.on_barrier("c", 2) == Decision(Outcome.TRIGGERED, 2)
    assert blocked(al, chans) == set()


def test_end_of_stream_completes_the_newer_checkpoint_after_an_abort() -> None:
    chans = ["a", "b"]
    al = BarrierAligner(chans)
    assert al.on_barrier("a", 1).outcome is Outcome.BLOCKED
    assert al.on_barrier("b", 2) == Decision(Outcome.ABORTED_AND_BLOCKED, 2, aborted=1)
    assert blocked(al, chans) == {"b"}
    assert al.on_end_of_stream("a") == Decision(Outcome.TRIGGERED, 2)
    assert blocked(al, chans) == set()
    assert al.on_barrier("b", 2) == Decision(Outcome.IGNORED, 2)


def test_end_of_stream_on_last_unaligned_input_triggers() -> None:
    chans = ["a", "b", "c"]
    al = BarrierAligner(chans)
    al.on_barrier("a", 1)
    al.on_barrier("b", 1)
    assert blocked(al, chans) == {"a", "b"}
    assert al.on_end_of_stream("c") == Decision(Outcome.TRIGGERED, 1)
    assert blocked(al, chans) == set()
    assert not al.all_ended
    # c no longer counts: the next checkpoint aligns on a and b only
    assert al.on_barrier("a", 2).outcome is Outcome.BLOCKED
    assert al.on_barrier("b", 2) == Decision(Outcome.TRIGGERED, 2)


def test_end_of_stream_while_waiting_is_nothing() -> None:
    chans = ["a", "b", "c"]
    al = BarrierAligner(chans)
    assert al.on_end_of_stream("b") == Decision(Outcome.NOTHING)
    assert not al.all_ended
    # b counts as aligned from now on
    assert al.on_barrier("a", 1).outcome is Outcome.BLOCKED
    assert al.on_barrier("c", 1) == Decision(Outcome.TRIGGERED, 1)


def test_end_of_stream_while_collecting_but_not_last_is_nothing() -> None:
    chans = ["a", "b", "c"]
    al = BarrierAligner(chans)
    al.on_barrier("a", 1)
    assert al.on_end_of_stream("b") == Decision(Outcome.NOTHING)
    assert blocked(al, chans) == {"a"}
    assert al.on_barrier("c", 1) == Decision(Outcome.TRIGGERED, 1)


def test_unknown_channel() -> None:
    al = BarrierAligner(["a", "b"])
    assert al.on_barrier("zzz", 1).outcome is Outcome.UNKNOWN_CHANNEL
    assert al.on_end_of_stream("zzz").outcome is Outcome.UNKNOWN_CHANNEL
    assert blocked(al, ["a", "b", "zzz"]) == set()
    # an ended channel is no longer known either
    al.on_end_of_stream("a")
    assert al.on_end_of_stream("a").outcome is Outcome.UNKNOWN_CHANNEL
    assert al.on_barrier("a", 1).outcome is Outcome.UNKNOWN_CHANNEL
    # and an unknown barrier did not disturb the machine
    assert al.on_barrier("b", 1) == Decision(Outcome.TRIGGERED, 1)


def test_all_ended() -> None:
    al = BarrierAligner(["a", "b"])
    assert not al.all_ended
    al.on_end_of_stream("a")
    assert not al.all_ended
    al.on_end_of_stream("b")
    assert al.all_ended
    assert BarrierAligner([]).all_ended


# ---------------------------------------------------------------------------------------
# randomised: FIFO channels of records and barriers, delivered in a random order
# ---------------------------------------------------------------------------------------

BARRIER, RECORD, END = "barrier", "record", "end"


@dataclass
class Channel:
    name: str
    items: list[tuple[str, Any]]
    pos: int = 0
    consumed_records: int = 0
    ended: bool = False
    barriers: list[int] = field(default_factory=list)

    def records_before(self, checkpoint: int) -> int:
        """Records ahead of barrier ``checkpoint``; all records if the channel has none."""
        n = 0
        for kind, value in self.items:
            if kind == BARRIER and value == checkpoint:
                return n
            n += kind == RECORD
        return n

    @property
    def total_records(self) -> int:
        return sum(kind == RECORD for kind, _ in self.items)

    @property
    def has_end(self) -> bool:
        return bool(self.items) and self.items[-1][0] == END


def build_channel(name: str, rnd: random.Random, barriers: list[int], records: int, end: bool) -> Channel:
    items: list[tuple[str, Any]] = [(RECORD, f"{name}:{i}") for i in range(records)]
    for b in barriers:  # barriers in increasing order, at random positions
        items.insert(rnd.randint(0, len(items)), (BARRIER, b))
    # re-impose increasing barrier order (insert positions may have reordered them)
    slots = [i for i, it in enumerate(items) if it[0] == BARRIER]
    for slot, b in zip(slots, sorted(barriers)):
        items[slot] = (BARRIER, b)
    if end:
        items.append((END, None))
    return Channel(name, items, barriers=sorted(barriers))


def run_alignment(channels: list[Channel], rnd: random.Random) -> tuple[list[int], list[int], BarrierAligner]:
    """Deliver heads of unblocked channels at random; check the ABS cut at each trigger.

    Returns (triggered ids in order, aborted ids, the aligner).
    """
    al = BarrierAligner(c.name for c in channels)
    triggered: list[int] = []
    aborted: list[int] = []
    steps = 0
    while True:
        ready = [c for c in channels if c.pos < len(c.items) and not al.is_blocked(c.name)]
        if not ready:
            break
        steps += 1
        assert steps < 10_000
        ch = rnd.choice(ready)
        kind, value = ch.items[ch.pos]
        ch.pos += 1
        if kind == RECORD:
            ch.consumed_records += 1
            continue
        if kind == END:
            ch.ended = True
            d = al.on_end_of_stream(ch.name)
        else:
            d = al.on_barrier(ch.name, value)
        assert d.outcome is not Outcome.UNKNOWN_CHANNEL
        if d.outcome in (Outcome.BLOCKED, Outcome.ABORTED_AND_BLOCKED):
            assert kind == BARRIER and d.checkpoint_id == value
            assert al.is_blocked(ch.name)
        if d.aborted is not None:
            aborted.append(d.aborted)
        if d.outcome is Outcome.TRIGGERED:
            k = d.checkpoint_id
            assert k is not None
            triggered.append(k)
            # the ABS cut: on every channel, exactly the records ahead of barrier k
            for c in channels:
                if k in c.barriers:
                    assert c.consumed_records == c.records_before(k), (k, c.name)
                    # barrier k was consumed, nothing behind it
                    assert c.pos == c.items.index((BARRIER, k)) + 1, (k, c.name)
                else:
                    # a channel without barrier k can only be aligned by having ended
                    assert c.ended, (k, c.name)
                    assert c.consumed_records == c.total_records
            assert all(not al.is_blocked(c.name) for c in channels)
    # every channel was drained: nothing stays blocked forever
    for c in channels:
        assert c.pos == len(c.items), (c.name, c.pos, len(c.items))
    assert al.all_ended == all(c.has_end for c in channels)
    return triggered, aborted, al


@st.composite
def prefix_scenarios(draw: st.DrawFn) -> tuple[list[Channel], int, random.Random]:
    """N channels; each carries barriers 1..K in order, or 1..k_c then end of stream."""
    rnd = draw(st.randoms(use_true_random=False))
    n = draw(st.integers(1, 5))
    k = draw(st.integers(1, 6))
    channels = []
    for i in range(n):
        ends = draw(st.booleans())
        k_c = draw(st.integers(0, k)) if ends else k
        records = draw(st.integers(0, 12))
        channels.append(build_channel(f"ch{i}", rnd, list(range(1, k_c + 1)), records, ends))
    return channels, k, rnd


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prefix_scenarios())
def test_random_delivery_respects_the_abs_cut(scenario: tuple[list[Channel], int, random.Random]) -> None:
    channels, k, rnd = scenario
    triggered, aborted, _ = run_alignment(channels, rnd)
    # every checkpoint some channel carries triggers exactly once, in order; none aborts
    expected_last = max((max(c.barriers, default=0) for c in channels), default=0)
    assert triggered == list(range(1, expected_last + 1))
    if any(not c.has_end for c in channels):
        assert triggered == list(range(1, k + 1))
    assert aborted == []


@st.composite
def gappy_scenarios(draw: st.DrawFn) -> tuple[list[Channel], int, random.Random]:
    """Checkpoints abandoned upstream: each channel carries an increasing *subset* of 1..K."""
    rnd = draw(st.randoms(use_true_random=False))
    n = draw(st.integers(1, 4))
    k = draw(st.integers(1, 6))
    channels = []
    for i in range(n):
        ends = draw(st.booleans())
        subset = sorted(draw(st.sets(st.integers(1, k))))
        if not ends and k not in subset:
            subset.append(k)  # a channel that never ends carries the last barrier
        records = draw(st.integers(0, 8))
        channels.append(build_channel(f"ch{i}", rnd, subset, records, ends))
    return channels, k, rnd


def expected_triggers(channels: list[Channel], k: int) -> list[int]:
    """Checkpoint j completes iff some channel carries it and every channel either carries
    it or ends before any later barrier (so it counts as aligned by ending)."""
    out = []
    for j in range(1, k + 1):
        if not any(j in c.barriers for c in channels):
            continue
        if all(j in c.barriers or (c.has_end and max(c.barriers, default=0) < j) for c in channels):
            out.append(j)
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gappy_scenarios())
def test_random_delivery_with_abandoned_checkpoints(scenario: tuple[list[Channel], int, random.Random]) -> None:
    channels, k, rnd = scenario
    triggered, aborted, _ = run_alignment(channels, rnd)
    assert triggered == expected_triggers(channels, k)
    assert len(set(aborted)) == len(aborted)
    assert not set(aborted) & set(triggered)
    assert aborted == sorted(aborted)


def test_build_channel_keeps_barriers_in_order() -> None:
    rnd = random.Random(0)
    for _ in range(200):
        bs = sorted(rnd.sample(range(1, 10), rnd.randint(0, 9)))
        c = build_channel("c", rnd, bs, rnd.randint(0, 10), rnd.random() < 0.5)
        assert [v for kind, v in c.items if kind == BARRIER] == bs
        assert c.total_records == sum(kind == RECORD for kind, _ in c.items)
