"""The checkpoint coordinator, driven by hand with a fake clock (it is sans-IO)."""

from __future__ import annotations

import hashlib
import os

import pytest

from abs_engine import codec, messages
from abs_engine.checkpoint.coordinator import CheckpointCoordinator
from abs_engine.checkpoint.pending import AckOutcome
from abs_engine.checkpoint.safe_io import METADATA
from abs_engine.checkpoint.storage import CheckpointStorage
from abs_engine.messages import NotifyComplete, Trigger

SOURCES = ["read#0", "read#1"]
OTHERS = ["count#0", "count#1", "write#0"]
TASKS = SOURCES + OTHERS


class FakeClock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def storage(tmp_path) -> CheckpointStorage:
    return CheckpointStorage(str(tmp_path / "ck"), retain=100)


def make(storage, clock, interval=1.0, timeout=10.0, max_in_flight=1, next_id=1, start=True, **kw):
    c = CheckpointCoordinator(
        job="job", fingerprint="fp", tasks=list(TASKS), source_tasks=list(SOURCES), storage=storage,
        interval=interval, timeout=timeout, max_in_flight=max_in_flight, next_id=next_id, clock=clock, **kw,
    )
    if start:
        c.start()
    return c


def ack(storage: CheckpointStorage, cid: int, task: str, alignment_ms: float = 0.0,
        logged: int = 0, finished: bool = False) -> messages.Ack:
    """Write the task's state file like the SnapshotWriter does, and build its Ack."""
    blob = codec.pack({"task": task, "checkpoint_id": cid, "operators": {task.split("#")[0]: codec.pack(cid)}})
    d = storage.dir_of(cid)
    os.makedirs(d, exist_ok=True)
    fname = f"{task}.state"
    with open(os.path.join(d, fname), "wb") as f:
        f.write(blob)
    return messages.Ack(cid, task, fname, len(blob), hashlib.sha256(blob).hexdigest(), alignment_ms,
                        logged, finished)


def ack_all(coord, storage, cid, tasks=TASKS):
    """Ack from every task; returns the outcomes and the metadata returned by the last call."""
    outcomes, metas = [], []
    for t in tasks:
        o, m = coord.on_ack(ack(storage, cid, t))
        outcomes.append(o)
        metas.append(m)
    return outcomes, metas


def triggers(out) -> list[tuple[str, int]]:
    assert all(isinstance(m, Trigger) for _, m in out), out
    return [(t, m.checkpoint_id) for t, m in out]


def has_metadata(storage, cid) -> bool:
    return os.path.exists(os.path.join(storage.dir_of(cid), METADATA))


# ---- construction -----------------------------------------------------------------------


def test_max_in_flight_must_be_positive(storage, clock):
    with pytest.raises(ValueError):
        make(storage, clock, max_in_flight=0)


def test_no_trigger_before_start(storage, clock):
    c = make(storage, clock, start=False)
    clock.advance(1000)
    assert c.poll() == []
    assert c.deadline() is None
    assert c.pending == {}


# ---- periodic triggering ------------------------------------------------------------------


def test_triggers_only_sources_at_the_interval(storage, clock):
    c = make(storage, clock, interval=2.0)
    assert c.deadline() == pytest.approx(102.0)
    clock.advance(1.999)
    assert c.poll() == []
    assert c.pending == {}
    clock.advance(0.001)
    assert triggers(c.poll()) == [("read#0", 1), ("read#1", 1)]
    assert list(c.pending) == [1]
    assert c.pending[1].tasks == frozenset(TASKS)  # every task must ack, only sources are triggered
    assert c.pending[1].final is False
    assert c.pending[1].started == pytest.approx(102.0)
    assert c.poll() == []  # in flight


def test_next_trigger_is_one_interval_after_the_previous(storage, clock):
    c = make(storage, clock, interval=2.0)
    clock.advance(2.5)
    assert triggers(c.poll()) == [("read#0", 1), ("read#1", 1)]  # at t=102.5
    clock.advance(0.5)
    _, metas = ack_all(c, storage, 1)
    assert metas[-1] is not None
    assert c.deadline() == pytest.approx(104.5)
    clock.advance(1.4)  # t=104.4
    assert c.poll() == []
    clock.advance(0.1)  # t=104.5
    assert triggers(c.poll()) == [("read#0", 2), ("read#1", 2)]


def test_next_id_is_respected(storage, clock):
    c = make(storage, clock, next_id=17)
    clock.advance(1)
    assert triggers(c.poll()) == [("read#0", 17), ("read#1", 17)]
    _, metas = ack_all(c, storage, 17)
    assert metas[-1].checkpoint_id == 17
    assert c.next_id == 18


def test_max_in_flight_one_blocks_until_completion(storage, clock):
    c = make(storage, clock, interval=1.0, timeout=100.0)
    clock.advance(1)
    assert triggers(c.poll()) == [("read#0", 1), ("read#1", 1)]
    for _ in range(5):
        clock.advance(1)
        assert c.poll() == []
    assert list(c.pending) == [1]
    ack_all(c, storage, 1)
    assert c.pending == {}
    # The trigger was overdue: it happens at the very next poll.
    assert triggers(c.poll()) == [("read#0", 2), ("read#1", 2)]


def test_max_in_flight_two(storage, clock):
    c = make(storage, clock, interval=1.0, timeout=100.0, max_in_flight=2)
    clock.advance(1)
    assert triggers(c.poll()) == [("read#0", 1), ("read#1", 1)]
    assert c.poll() == []  # not yet due
    clock.advance(1)
    assert triggers(c.poll()) == [("read#0", 2), ("read#1", 2)]
    clock.advance(1)
    assert c.poll() == []  # two in flight
    clock.advance(1)
    assert c.poll() == []
    assert sorted(c.pending) == [1, 2]


# ---- completion -----------------------------------------------------------------------------


def test_completes_when_all_acks_are_in(storage, clock):
    c = make(storage, clock, interval=1.0)
    clock.advance(1)
    c.poll()
    clock.advance(0.25)
    results = []
    for i, t in enumerate(TASKS):
        results.append(c.on_ack(ack(storage, 1, t, alignment_ms=float(i))))
        if i < len(TASKS) - 1:
            assert not has_metadata(storage, 1)  # the metadata is the commit point: written last
    assert [o for o, _ in results] == [AckOutcome.SUCCESS] * len(TASKS)
    assert [m for _, m in results[:-1]] == [None] * (len(TASKS) - 1)
    meta = results[-1][1]
    assert meta is not None
    assert meta.checkpoint_id == 1 and meta.job == "job" and meta.fingerprint == "fp"
    assert meta.final is False
    assert set(meta.tasks) == set(TASKS)
    assert meta.alignment_ms == {t: float(i) for i, t in enumerate(TASKS)}
    assert meta.duration_ms == pytest.approx(250.0)
    # durable and verifiable with the real storage
    assert storage.verify(1) == meta
    assert storage.read_state(1, "count#1") == {"count": 1}
    assert c.pending == {}
    assert c.stats.completed == [meta]
    assert c.stats.outcomes == {AckOutcome.SUCCESS: len(TASKS)}


def test_notifications_go_to_every_task(storage, clock):
    c = make(storage, clock)
    clock.advance(1)
    c.poll()
    _, metas = ack_all(c, storage, 1)
    out = c.notifications(metas[-1])
    assert out == [(t, NotifyComplete(1, False)) for t in sorted(TASKS)]


def test_duplicate_ack_via_coordinator(storage, clock):
    c = make(storage, clock)
    clock.advance(1)
    c.poll()
    assert c.on_ack(ack(storage, 1, "read#0")) == (AckOutcome.SUCCESS, None)
    assert c.on_ack(ack(storage, 1, "read#0")) == (AckOutcome.DUPLICATE, None)
    assert c.on_ack(ack(storage, 1, "nosuch#0")) == (AckOutcome.UNKNOWN, None)
    assert c.stats.outcomes == {AckOutcome.SUCCESS: 1, AckOutcome.DUPLICATE: 1, AckOutcome.UNKNOWN: 1}
    assert list(c.pending) == [1]


def test_completion_prunes_old_checkpoints(tmp_path, clock):
    storage = CheckpointStorage(str(tmp_path / "ck"), retain=2)
    c = make(storage, clock)
    for cid in (1, 2, 3, 4):
        clock.advance(1)
        assert triggers(c.poll())[0] == ("read#0", cid)
        ack_all(c, storage, cid)
    assert storage.ids_on_disk() == [3, 4]


# ---- timeouts ---------------------------------------------------------------------------------


def test_timeout_aborts_and_late_acks_are_discarded(storage, clock):
    c = make(storage, clock, interval=1.0, timeout=5.0)
    clock.advance(1)  # t=101
    assert triggers(c.poll()) == [("read#0", 1), ("read#1", 1)]
    assert c.on_ack(ack(storage, 1, "read#0")) == (AckOutcome.SUCCESS, None)
    clock.advance(5)  # exactly the timeout: not yet
    c.poll()
    assert 1 in c.pending and c.stats.aborted == []
    clock.advance(0.01)
    out = c.poll()
    assert 1 not in c.pending
    assert c.stats.aborted == [1]
    # the slot is free again and a trigger is overdue: checkpoint 2 starts in the same poll
    assert triggers(out) == [("read#0", 2), ("read#1", 2)]
    # late acks of the aborted checkpoint
    for t in TASKS:
        assert c.on_ack(ack(storage, 1, t)) == (AckOutcome.DISCARDED, None)
    assert not has_metadata(storage, 1)
    # an id never triggered
    assert c.on_ack(ack(storage, 99, "read#0")) == (AckOutcome.UNKNOWN, None)
    assert c.stats.outcomes[AckOutcome.DISCARDED] == len(TASKS)
    assert c.stats.outcomes[AckOutcome.UNKNOWN] == 1
    # checkpoint 2 still completes normally
    _, metas = ack_all(c, storage, 2)
    assert metas[-1].checkpoint_id == 2
    assert storage.verify(2).checkpoint_id == 2


def test_deadline_is_earliest_of_timeout_and_next_trigger(storage, clock):
    c = make(storage, clock, interval=3.0, timeout=2.0, max_in_flight=2)
    assert c.deadline() == pytest.approx(103.0)
    clock.advance(3)
    c.poll()  # checkpoint 1 at t=103, next trigger at 106
    assert c.deadline() == pytest.approx(105.0)
    c2 = make(storage, clock, interval=3.0, timeout=5.0, max_in_flight=2)
    clock.advance(3)
    c2.poll()  # checkpoint 1 at t=106, timeout at 111, next trigger at 109
    assert c2.deadline() == pytest.approx(109.0)


def test_deadline_is_not_in_the_past_while_in_flight_limit_is_reached(storage, clock):
    c = make(storage, clock, interval=1.0, timeout=5.0)
    clock.advance(1)  # t=101
    assert triggers(c.poll()) == [("read#0", 1), ("read#1", 1)]
    clock.advance(2)  # t=103: the next trigger is overdue but cannot happen (1 in flight)
    assert c.poll() == []
    # The only thing poll() can do next is abort checkpoint 1 at t=106.
    assert c.deadline() == pytest.approx(106.0)


# ---- subsumption --------------------------------------------------------------------------


def test_newer_completion_subsumes_older_pending(storage, clock):
    c = make(storage, clock, interval=1.0, timeout=100.0, max_in_flight=2)
    clock.advance(1)
    c.poll()
    clock.advance(1)
    c.poll()
    assert sorted(c.pending) == [1, 2]
    # checkpoint 1 has some acks, then 2 completes first
    assert c.on_ack(ack(storage, 1, "read#0"))[0] is AckOutcome.SUCCESS
    _, metas = ack_all(c, storage, 2)
    assert metas[-1].checkpoint_id == 2
    assert c.pending == {}
    assert c.stats.aborted == []  # subsumed is not aborted
    # the older checkpoint's remaining acks are discarded; it never gets metadata
    assert c.on_ack(ack(storage, 1, "read#1")) == (AckOutcome.DISCARDED, None)
    outcomes, metas1 = ack_all(c, storage, 1, tasks=OTHERS)
    assert outcomes == [AckOutcome.DISCARDED] * len(OTHERS)
    assert metas1 == [None] * len(OTHERS)
    assert not has_metadata(storage, 1)
    assert [m.checkpoint_id for m in c.stats.completed] == [2]


def test_older_completion_does_not_subsume_newer(storage, clock):
    c = make(storage, clock, interval=1.0, timeout=100.0, max_in_flight=2)
    clock.advance(1)
    c.poll()
    clock.advance(1)
    c.poll()
    _, metas = ack_all(c, storage, 1)
    assert metas[-1].checkpoint_id == 1
    assert list(c.pending) == [2]
    _, metas = ack_all(c, storage, 2)
    assert metas[-1].checkpoint_id == 2
    assert [m.checkpoint_id for m in c.stats.completed] == [1, 2]


# ---- finished tasks -------------------------------------------------------------------------


def test_finished_task_is_triggered_directly_during_pending_checkpoint(storage, clock):
    c = make(storage, clock, interval=1.0, timeout=100.0)
    clock.advance(1)
    assert triggers(c.poll()) == [("read#0", 1), ("read#1", 1)]
    assert triggers(c.on_finished("count#0")) == [("count#0", 1)]
    assert c.on_finished("count#0") == []  # already triggered for 1
    # a source was triggered already: finishing does not trigger it again
    assert c.on_finished("read#0") == []
    # a task that already acknowledged is not triggered
    assert c.on_ack(ack(storage, 1, "count#1"))[0] is AckOutcome.SUCCESS
    assert c.on_finished("count#1") == []


def test_finished_without_pending_checkpoint_triggers_nothing(storage, clock):
    c = make(storage, clock)
    assert c.on_finished("write#0") == []


def test_finished_tasks_are_included_in_later_triggers(storage, clock):
    c = make(storage, clock, interval=1.0, timeout=100.0)
    c.on_finished("count#1")
    c.on_finished("read#1")
    clock.advance(1)
    assert triggers(c.poll()) == [("count#1", 1), ("read#0", 1), ("read#1", 1)]
    assert c.pending[1].triggered_directly == {"count#1", "read#0", "read#1"}
    assert c.pending[1].final is False


def test_on_finished_triggers_every_pending_checkpoint(storage, clock):
    c = make(storage, clock, interval=1.0, timeout=100.0, max_in_flight=2)
    clock.advance(1)
    c.poll()
    clock.advance(1)
    c.poll()
    assert c.on_ack(ack(storage, 1, "write#0"))[0] is AckOutcome.SUCCESS
    assert triggers(c.on_finished("count#0")) == [("count#0", 1), ("count#0", 2)]
    assert triggers(c.on_finished("write#0")) == [("write#0", 2)]


# ---- the final checkpoint ---------------------------------------------------------------------


def finish_all(c) -> list:
    out = []
    for t in TASKS:
        out += c.on_finished(t)
    return out


def test_exactly_one_final_checkpoint_then_nothing(storage, clock):
    c = make(storage, clock, interval=1.0, timeout=5.0)
    assert finish_all(c) == []
    assert c.all_finished
    out = c.poll()  # not waiting for the interval
    assert triggers(out) == [(t, 1) for t in sorted(TASKS)]
    assert c.pending[1].final is True
    assert c.poll() == []  # no second final while the first is pending
    clock.advance(1)
    assert c.poll() == []
    _, metas = ack_all(c, storage, 1)
    meta = metas[-1]
    assert meta is not None and meta.final is True
    assert storage.verify(1).final is True
    assert c.final_completed == meta
    assert c.notifications(meta) == [(t, NotifyComplete(1, True)) for t in sorted(TASKS)]
    for _ in range(5):
        clock.advance(100)
        assert c.poll() == []
    assert c.pending == {}
    assert c.deadline() is None
    assert [m.final for m in c.stats.completed] == [True]


def test_final_checkpoint_waits_for_pending_one_with_max_in_flight_one(storage, clock):
    c = make(storage, clock, interval=1.0, timeout=100.0)
    clock.advance(1)
    assert triggers(c.poll()) == [("read#0", 1), ("read#1", 1)]
    out = finish_all(c)
    assert sorted(triggers(out)) == sorted((t, 1) for t in OTHERS)
    assert c.poll() == []  # checkpoint 1 still in flight
    _, metas = ack_all(c, storage, 1)
    assert metas[-1].final is False
    assert triggers(c.poll()) == [(t, 2) for t in sorted(TASKS)]
    _, metas = ack_all(c, storage, 2)
    assert metas[-1].final is True
    clock.advance(10)
    assert c.poll() == []
    assert [(m.checkpoint_id, m.final) for m in c.stats.completed] == [(1, False), (2, True)]


def test_final_checkpoint_subsumes_pending_periodic_one(storage, clock):
    c = make(storage, clock, interval=1.0, timeout=100.0, max_in_flight=2)
    clock.advance(1)
    c.poll()
    finish_all(c)
    assert triggers(c.poll()) == [(t, 2) for t in sorted(TASKS)]
    assert c.pending[2].final and not c.pending[1].final
    _, metas = ack_all(c, storage, 2)
    assert metas[-1].final is True
    assert c.pending == {}
    assert c.on_ack(ack(storage, 1, "read#0")) == (AckOutcome.DISCARDED, None)
    assert c.poll() == []


def test_timed_out_final_checkpoint_is_retried_once(storage, clock):
    c = make(storage, clock, interval=1.0, timeout=5.0)
    finish_all(c)
    assert triggers(c.poll()) == [(t, 1) for t in sorted(TASKS)]
    clock.advance(6)
    out = c.poll()
    assert c.stats.aborted == [1]
    assert triggers(out) == [(t, 2) for t in sorted(TASKS)]
    assert c.pending[2].final
    _, metas = ack_all(c, storage, 2)
    assert metas[-1].final
    assert c.poll() == []


def test_final_checkpoint_without_periodic_interval(storage, clock):
    c = make(storage, clock, interval=None)
    clock.advance(1000)
    assert c.poll() == []
    assert c.deadline() is None
    finish_all(c)
    assert triggers(c.poll()) == [(t, 1) for t in sorted(TASKS)]
    _, metas = ack_all(c, storage, 1)
    assert metas[-1].final is True
    assert c.poll() == []


def test_stop_the_world_pauses_counts_snapshots_then_resumes(storage, clock):
    c = make(storage, clock, interval=1.0, timeout=10.0, stop_the_world=True,
             channels=frozenset({f"{s}->sink#0" for s in SOURCES}))
    clock.advance(1.0)
    out = c.poll()
    pauses = [t for t, m in out if isinstance(m, messages.Pause)]
    counts = [(t, m) for t, m in out if isinstance(m, messages.CountRequest)]
    assert sorted(pauses) == sorted(SOURCES) and {t for t, _ in counts} == set(TASKS)
    assert not any(isinstance(m, messages.Trigger) for _, m in out)
    wave = counts[0][1].wave

    def answer_wave(w: int, in_flight: int) -> list:
        msgs = []
        for t in sorted(TASKS):
            sent = {f"{t}->sink#0": 5} if t in SOURCES else {}
            received = {f"{s}->sink#0": 5 - in_flight for s in SOURCES} if t not in SOURCES else {}
            msgs += c.on_counts(messages.Counts(t, w, sent, received))
        return msgs

    assert answer_wave(wave, in_flight=2) == []  # records in flight: ask again later
    clock.advance(0.01)
    again = [m for _, m in c.poll() if isinstance(m, messages.CountRequest)]
    assert len(again) == len(TASKS)
    assert answer_wave(again[0].wave, in_flight=0) == []  # balanced once
    clock.advance(0.01)
    third = [m for _, m in c.poll() if isinstance(m, messages.CountRequest)]
    snaps = answer_wave(third[0].wave, in_flight=0)
    assert {t for t, m in snaps if isinstance(m, messages.Snapshot)} == set(TASKS)
    cid = snaps[0][1].checkpoint_id
    meta = None
    for t in sorted(TASKS):
        _, meta = c.on_ack(ack(storage, cid, t))
    assert meta is not None
    resumes = [t for t, m in c.notifications(meta) if isinstance(m, messages.Resume)]
    assert sorted(resumes) == sorted(SOURCES)


def test_stop_the_world_timeout_resumes_the_sources(storage, clock):
    c = make(storage, clock, interval=1.0, timeout=2.0, stop_the_world=True)
    clock.advance(1.0)
    c.poll()
    clock.advance(2.5)
    out = c.poll()
    assert sorted(t for t, m in out if isinstance(m, messages.Resume)) == sorted(SOURCES)


def test_unaligned_mode_triggers_every_task_and_savepoints_stay_aligned(storage, clock):
    c = make(storage, clock, unaligned=True)
    clock.advance(1.0)
    assert sorted(c.poll()) == sorted((t, Trigger(1, True)) for t in TASKS)
    for t in TASKS:
        c.on_ack(ack(storage, 1, t))
    assert c.mode_of(1) == "unaligned"
    c.request_savepoint(stop=False)
    assert sorted(c.poll()) == sorted((t, Trigger(2, False)) for t in SOURCES)
    for t in TASKS:
        c.on_ack(ack(storage, 2, t))
    assert c.mode_of(2) == "savepoint"


def test_the_aligned_timeout_turns_a_pending_checkpoint_unaligned_at_the_tasks_that_owe_it(storage, clock):
    c = make(storage, clock, aligned_timeout=0.5)
    clock.advance(1.0)
    assert sorted(c.poll()) == sorted((t, Trigger(1, False)) for t in SOURCES)
    assert c.deadline() == pytest.approx(clock.t + 0.5)
    c.on_ack(ack(storage, 1, "read#0"))
    clock.advance(0.4)
    assert c.poll() == []  # not yet
    clock.advance(0.1)
    turned = c.poll()
    assert sorted(turned) == sorted((t, Trigger(1, True)) for t in TASKS if t != "read#0")
    clock.advance(0.5)
    assert c.poll() == []  # once
    for t in TASKS[1:]:
        c.on_ack(ack(storage, 1, t))
    assert c.mode_of(1) == "aligned" and not c.pending


@pytest.mark.parametrize("stop", [True, False])
def test_a_savepoint_aborted_by_a_region_restart_is_taken_again(storage, clock, stop):
    """A region restart aborts every pending checkpoint, the savepoint among them: the next
    checkpoint is the savepoint (stopping with a savepoint would otherwise wait forever for
    one that can never complete)."""
    c = make(storage, clock, interval=10.0)
    c.request_savepoint(stop=stop)
    assert triggers(c.poll()) == [(t, 1) for t in SOURCES] and c.savepoint_id == 1
    assert c.restart_tasks(frozenset({"count#0"})) == [1]
    assert triggers(c.poll()) == [(t, 2) for t in SOURCES] and c.savepoint_id == 2
    ack_all(c, storage, 2)
    assert c.mode_of(2) == "savepoint"
