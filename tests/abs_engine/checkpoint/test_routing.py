"""The coordinator's share of the tasks' messages (checkpoint/routing.py), the routing both
the job master's driver and the simulation run: each message goes to its coordinator call,
and what the coordinator answers comes back in order (a completion's notifications, then
the end of the loops it proved drained)."""

from __future__ import annotations

from abs_engine import messages
from abs_engine.checkpoint.pending import AckOutcome
from abs_engine.checkpoint.routing import route
# (The coordinator tests' fixtures, clock and storage, imported to be used here too.)
from tests.abs_engine.checkpoint.test_coordinator import SOURCES, TASKS, ack, clock, make, storage, triggers  # noqa: F401

LOOP = frozenset({"count#0", "count#1"})


def test_an_ack_completes_and_the_notifications_come_back(storage, clock):
    c = make(storage, clock)
    clock.advance(1.0)
    assert triggers(c.poll()) == [(t, 1) for t in sorted(SOURCES)]
    for t in TASKS[:-1]:
        routed = route(c, ack(storage, 1, t))
        assert routed is not None and routed.outcome is AckOutcome.SUCCESS
        assert routed.completed is None and routed.out == [] and routed.drained == []
    routed = route(c, ack(storage, 1, TASKS[-1]))
    assert routed is not None and routed.outcome is AckOutcome.SUCCESS
    assert routed.completed is not None and routed.completed.checkpoint_id == 1
    assert routed.out == [(t, messages.NotifyComplete(1, False, False)) for t in sorted(TASKS)]
    assert routed.drained == []
    late = route(c, ack(storage, 1, TASKS[0]))  # after the completion: discarded, nothing to send
    assert late is not None and late.outcome is AckOutcome.DISCARDED and late.completed is None and late.out == []


def test_a_completion_that_proves_a_loop_drained_ends_it_after_the_notifications(storage, clock):
    c = make(storage, clock, loops={0: (LOOP, frozenset(SOURCES))})
    clock.advance(1.0)
    c.poll()
    routed = None
    for t in TASKS:
        routed = route(c, ack(storage, 1, t, finished=t in SOURCES))
    assert routed is not None and routed.completed is not None and routed.drained == [0]
    n = len(TASKS)
    assert all(isinstance(m, messages.NotifyComplete) for _, m in routed.out[:n])
    assert routed.out[n:] == [(t, messages.EndLoop(1)) for t in sorted(LOOP)]


def test_finished_and_ended_inputs_trigger_the_task_directly(storage, clock):
    c = make(storage, clock)
    clock.advance(1.0)
    c.poll()  # checkpoint 1 pending, triggered at the sources
    routed = route(c, messages.InputsEnded("count#0"))
    assert routed is not None and routed.outcome is None and triggers(routed.out) == [("count#0", 1)]
    routed = route(c, messages.Finished("count#1", 10, 5))
    assert routed is not None and triggers(routed.out) == [("count#1", 1)]
    assert "count#1" in c.finished and "count#0" not in c.finished


def test_counts_go_to_the_stop_the_world_waves(storage, clock):
    c = make(storage, clock, stop_the_world=True)
    clock.advance(1.0)
    wave = next(m.wave for _, m in c.poll() if isinstance(m, messages.CountRequest))
    out = []
    for t in sorted(TASKS):
        routed = route(c, messages.Counts(t, wave, {}, {}))
        assert routed is not None
        out += routed.out
    assert out == []  # balanced once: another wave must agree
    clock.advance(0.01)
    wave = next(m.wave for _, m in c.poll() if isinstance(m, messages.CountRequest))
    for t in sorted(TASKS):
        routed = route(c, messages.Counts(t, wave, {}, {}))
        assert routed is not None
        out += routed.out
    assert {t for t, m in out if isinstance(m, messages.Snapshot)} == set(TASKS)


def test_what_is_not_the_coordinators_business_is_not_routed(storage, clock):
    c = make(storage, clock)
    for msg in (messages.Running("read#0"), messages.Progress("read#0", 1, 1), messages.Committed("read#0")):
        assert route(c, msg) is None
