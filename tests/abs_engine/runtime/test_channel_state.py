"""Channel state: the ChannelStateLog state machine (back-edge logging, and every input's
state in unaligned checkpoints), and a real Task driven over socketpairs (scripted frames,
snapshots captured): back-edges, unaligned triggers, read-ahead, the aligned timeout."""

from __future__ import annotations

import queue
import socket
import threading
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from abs_engine import codec, messages
from abs_engine.checkpoint.snapshot_file import decode_snapshot
from abs_engine.plan import ChannelSpec, TaskSpec
from abs_engine.runtime.channel_state import ChannelStateLog, LogOutcome, Session
from abs_engine.runtime.channel import InputChannel
from abs_engine.runtime.control import ControlLink
from abs_engine.wire import Wire
from abs_engine.runtime.chain import Chain
from abs_engine.runtime.task import TaskOptions
from abs_engine.runtime.task_loop import ProcessTask
from abs_engine.runtime.writer import Job, SpillJob
from operators.base import Operator, OperatorContext

# ---- the state machine ----------------------------------------------------------------


def pk(*records: Any) -> bytes:
    """A RECORDS frame's payload: what the task hands the log."""
    return codec.pack(list(records))


def logs_of(s: Session) -> dict[str, list[Any]]:
    return {ch: [r for p in frames for r in codec.unpack(p)] for ch, frames in s.logs.items()}


def test_trigger_then_records_then_barrier_logs_exactly_the_records_between():
    log = ChannelStateLog(["b"])
    log.on_records("b", pk(1, 2))  # before the snapshot: not logged
    step = log.start(1, "state")
    assert step.outcome is LogOutcome.LOGGING and log.logging
    log.on_records("b", pk(3, 4))
    log.on_records("b", pk(5))
    step = log.on_barrier("b", 1)
    assert step.outcome is LogOutcome.COMPLETE
    (s,) = step.completed
    assert s.checkpoint_id == 1 and s.payload == "state" and logs_of(s) == {"b": [3, 4, 5]} and s.logged == 3
    log.on_records("b", pk(6))  # after the barrier: belongs to no session
    assert not log.logging


def test_session_completes_only_when_every_back_edge_delivered_its_barrier():
    log = ChannelStateLog(["b1", "b2"])
    log.start(7, None)
    log.on_records("b1", pk("x"))
    assert log.on_barrier("b1", 7).outcome is LogOutcome.LOGGING
    log.on_records("b1", pk("after b1's barrier"))
    log.on_records("b2", pk("y"))
    step = log.on_barrier("b2", 7)
    assert step.outcome is LogOutcome.COMPLETE
    assert logs_of(step.completed[0]) == {"b1": ["x"], "b2": ["y"]}


def test_barrier_before_trigger_holds_the_channel_and_it_logs_nothing():
    log = ChannelStateLog(["b", "c"])
    step = log.on_barrier("b", 3)
    assert step.outcome is LogOutcome.HELD and log.is_held("b") and not log.is_held("c")
    step = log.start(3, None)
    assert step.released == ("b",) and not log.is_held("b")
    log.on_records("b", pk("behind the early barrier: after the snapshot, not in flight"))
    log.on_records("c", pk("in flight"))
    step = log.on_barrier("c", 3)
    assert logs_of(step.completed[0]) == {"c": ["in flight"]}


def test_no_back_edges_or_all_ended_completes_at_once():
    assert ChannelStateLog([]).start(1, None).outcome is LogOutcome.COMPLETE
    log = ChannelStateLog(["b"])
    log.start(1, None)
    step = log.on_end_of_stream("b")
    assert step.outcome is LogOutcome.COMPLETE and logs_of(step.completed[0]) == {"b": []}
    assert log.start(2, None).outcome is LogOutcome.COMPLETE


def test_overlapping_sessions_log_into_each_until_their_own_barrier():
    log = ChannelStateLog(["b"])
    log.start(1, None)
    log.on_records("b", pk("r1"))
    log.start(2, None)
    log.on_records("b", pk("r2"))
    done1 = log.on_barrier("b", 1).completed
    log.on_records("b", pk("r3"))
    done2 = log.on_barrier("b", 2).completed
    assert logs_of(done1[0]) == {"b": ["r1", "r2"]}
    assert logs_of(done2[0]) == {"b": ["r2", "r3"]}


def test_stale_and_unknown_barriers_are_outcomes():
    log = ChannelStateLog(["b"])
    log.start(1, None)
    log.on_barrier("b", 1)
    assert log.on_barrier("b", 1).outcome is LogOutcome.IGNORED
    assert log.on_barrier("zz", 1).outcome is LogOutcome.UNKNOWN_CHANNEL


# ---- a real Task over socketpairs -----------------------------------------------------


class Remember(Operator):
    """State = every record processed, in order; ``delay`` seconds per batch (a slow stage)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.seen: list[Any] = []
        self.delay = delay
        self.snapshotted = threading.Event()

    def process(self, batch: list[Any]) -> list[Any]:
        if self.delay:
            time.sleep(self.delay)  # the slow stage's work, not synchronisation
        self.seen.extend(batch)
        return []

    def snapshot(self, checkpoint_id: int) -> Any:
        self.snapshotted.set()
        return list(self.seen)


class CapturingWriter:
    def __init__(self) -> None:
        self.snapshots: queue.Queue[tuple[int, dict[str, Any], dict[str, list[Any]]]] = queue.Queue()
        self.op: Remember | None = None
        self.processed_at_ack: dict[int, int] = {}  #: records the operator had processed when acked
        self.unaligned: dict[int, bool] = {}
        self.first_seen: dict[int, float] = {}
        self.spilled: dict[int, dict[str, list[Any]]] = {}  #: checkpoint -> channel -> records spilled

    def submit(self, job: Job) -> None:
        cid, name, blob, logged = job.checkpoint_id, job.name, job.blob, job.logged
        if self.op is not None:
            self.processed_at_ack[cid] = len(self.op.seen)  # on the task thread: exact
        self.unaligned[cid] = job.unaligned
        self.first_seen[cid] = job.first_seen
        snap = decode_snapshot(blob() if callable(blob) else blob, name)
        states, logs = snap.states, dict(snap.logs)
        for ch, records in self.spilled.pop(cid, {}).items():  # spilled first, as spill.attach
            logs[ch] = records + logs.get(ch, [])
        assert logged == sum(len(v) for v in logs.values())
        self.snapshots.put((cid, states, logs))

    def spill(self, job: SpillJob) -> None:  # on the task thread: kept in memory
        for ch, data in codec.unpack(job.blob()).items():
            self.spilled.setdefault(job.checkpoint_id, {}).setdefault(ch, []).extend(codec.unpack(data))
        job.refs.append((job.name, job.size, "0" * 64))

    def wait_spills(self, limit: int) -> None:
        pass

    def flush(self) -> None:
        pass

    def next(self) -> tuple[int, dict[str, Any], dict[str, list[Any]]]:
        return self.snapshots.get(timeout=10)


class Harness:
    def __init__(self, unaligned: bool = False, aligned_timeout: float | None = None, delay: float = 0.0,
                 second_input: bool = False, channel_state_memory: int | None = None) -> None:
        self.reg_prod, reg_cons = socket.socketpair()
        self.reg2_prod, reg2_cons = socket.socketpair()
        self.back_prod, back_cons = socket.socketpair()
        self.ctl_driver, ctl_worker = socket.socketpair()
        control = ControlLink(Wire(ctl_worker))
        inputs = {
            "r": InputChannel("r", reg_cons, codec.FrameReader(), back_edge=False),
            "b": InputChannel("b", back_cons, codec.FrameReader(), back_edge=True),
        }
        channels = [ChannelSpec("r", "x#0", "t#0", 0, False), ChannelSpec("b", "y#0", "t#0", 1, True)]
        if second_input:  # a second regular input
            inputs["r2"] = InputChannel("r2", reg2_cons, codec.FrameReader(), back_edge=False)
            channels.append(ChannelSpec("r2", "z#0", "t#0", 0, False))
        spec = TaskSpec("t#0", "t", 0, 1, tuple(channels), ())
        self.op = Remember(delay)
        self.op.open(OperatorContext("remember", 0, 1, 0, False))
        self.writer = CapturingWriter()
        self.writer.op = self.op
        self.task = ProcessTask(spec, Chain(["remember"], [self.op]), [], inputs, control, self.writer,
                                TaskOptions(aligned_timeout=aligned_timeout, unaligned=unaligned,
                                            channel_state_memory=channel_state_memory))
        self.thread = threading.Thread(target=self.task.run, daemon=True)
        self.thread.start()

    def send(self, sock: socket.socket, *items: Any) -> None:
        data = b""
        for it in items:
            if isinstance(it, tuple) and it[0] in ("barrier", "unaligned"):
                data += codec.frame(codec.FrameKind.BARRIER, codec.barrier_payload(it[1], it[0] == "unaligned"))
            else:
                data += codec.records_frame(list(it))
        sock.sendall(data)

    def control(self, msg: messages.Message) -> None:
        self.ctl_driver.sendall(messages.encode(msg))

    def close(self) -> None:
        self.ctl_driver.sendall(messages.encode(messages.Shutdown()))
        self.thread.join(timeout=10)


@pytest.fixture
def harness():
    h = Harness()
    yield h
    h.close()


def assert_cut(states: dict[str, Any], logs: dict[str, list[Any]], regular_before: set[Any],
               back_before: set[Any], after: set[Any]) -> None:
    """The ABS cut for one checkpoint: regular records before the barrier are in the state;
    back-edge records before the barrier are in the state or the log, exactly one; records
    after the barrier are in neither."""
    pre, log = states["remember"], logs.get("b", [])
    assert len(pre) == len(set(pre)) and len(log) == len(set(log))
    assert regular_before <= set(pre)
    for r in back_before:
        assert (r in pre) != (r in log), (r, pre, log)
    for r in after:
        assert r not in pre and r not in log, (r, pre, log)


def test_task_logs_back_edge_records_between_its_snapshot_and_the_returning_barrier(harness):
    h = harness
    h.send(h.reg_prod, [1, 2], ("barrier", 1))
    h.send(h.back_prod, [10, 11], ("barrier", 1), [12])
    h.send(h.reg_prod, [3], ("barrier", 2))
    h.send(h.back_prod, ("barrier", 2))
    cid, states, logs = h.writer.next()
    assert cid == 1
    assert_cut(states, logs, regular_before={1, 2}, back_before={10, 11}, after={3, 12})
    cid, states, logs = h.writer.next()
    assert cid == 2
    assert_cut(states, logs, regular_before={1, 2, 3}, back_before={10, 11, 12}, after=set())


def test_back_edge_barrier_first_records_behind_it_do_not_leak_into_the_snapshot(harness):
    h = harness
    h.send(h.back_prod, [5], ("barrier", 1), [6, 7])  # 6, 7 belong after snapshot 1
    h.send(h.reg_prod, [1], ("barrier", 1))
    cid, states, logs = h.writer.next()
    assert cid == 1
    assert_cut(states, logs, regular_before={1}, back_before={5}, after={6, 7})
    h.send(h.reg_prod, ("barrier", 2))
    h.send(h.back_prod, ("barrier", 2))
    cid, states, logs = h.writer.next()
    assert cid == 2
    assert_cut(states, logs, regular_before={1}, back_before={5, 6, 7}, after=set())


def test_channel_held_behind_an_older_barrier_is_still_logged_for_the_newer_checkpoint():
    """The task skipped checkpoint 4 (it timed out before reaching it) and triggers 6: the
    back-edge that delivered barrier 4 has not delivered 6, so its records are in flight."""
    log = ChannelStateLog(["b"])
    assert log.on_barrier("b", 4).outcome is LogOutcome.HELD
    step = log.start(6, None)
    assert step.released == ("b",) and step.outcome is LogOutcome.LOGGING
    log.on_records("b", pk("between barrier 4 and barrier 6"))
    done = log.on_barrier("b", 6).completed
    assert logs_of(done[0]) == {"b": ["between barrier 4 and barrier 6"]}


def test_a_newer_barrier_discards_older_sessions_that_can_never_complete():
    log = ChannelStateLog(["b"])
    log.start(1, None)
    log.start(2, None)
    log.on_records("b", pk("x"))
    step = log.on_barrier("b", 2)  # barrier 1 never came on b: session 1 is dead
    assert [s.checkpoint_id for s in step.completed] == [2]
    assert not log.sessions
    log.on_records("b", pk("not logged by anyone"))
    assert not log.logging


# ---- unaligned checkpoints -------------------------------------------------------------


def test_an_unaligned_session_logs_every_input_but_those_that_delivered_the_barrier():
    log = ChannelStateLog(["b"], ["r1", "r2"])
    step = log.start(5, "state", unaligned=True, arrived={"r1"})
    assert step.outcome is LogOutcome.LOGGING and log.sessions[5].waiting == {"r2", "b"}
    assert log.waiting_on("r2") == 5 and log.waiting_on("r1") == 0
    log.on_records("r1", pk("after r1's barrier"))
    log.on_records("r2", pk("a", "b"))
    log.on_records("b", pk("c"))
    assert log.on_barrier("r2", 5).outcome is LogOutcome.LOGGING
    log.on_records("r2", pk("after r2's barrier"))
    (s,) = log.on_barrier("b", 5).completed
    assert logs_of(s) == {"r2": ["a", "b"], "b": ["c"]} and s.unaligned and s.logged == 3
    assert s.logged_bytes == len(pk("a", "b")) + len(pk("c"))
    # An aligned session on the same log waits on the back-edge only.
    assert log.start(6, None).outcome is LogOutcome.LOGGING and log.sessions[6].waiting == {"b"}


def test_an_input_that_ends_completes_the_sessions_waiting_on_it():
    log = ChannelStateLog([], ["r1", "r2"])
    log.start(1, None, unaligned=True)
    log.on_records("r1", pk(1))
    assert log.on_barrier("r1", 1).outcome is LogOutcome.LOGGING
    (s,) = log.on_end_of_stream("r2").completed
    assert logs_of(s) == {"r1": [1], "r2": []}
    assert log.on_end_of_stream("r2").outcome is LogOutcome.IGNORED  # idempotent


def assert_unaligned_cut(states: dict[str, Any], logs: dict[str, list[Any]], before: set[Any],
                         after: set[Any]) -> None:
    """Chandy-Lamport's cut: every record before the barrier on its input is in the state or
    in that input's channel state, exactly once; none after it is in either."""
    pre = states["remember"]
    logged = [r for recs in logs.values() for r in recs]
    assert len(pre) == len(set(pre)) and len(logged) == len(set(logged))
    in_state, in_log = set(pre), set(logged)
    for r in before:
        assert (r in in_state) != (r in in_log), (r, pre, logs)
    for r in after:
        assert r not in in_state and r not in in_log, (r, pre, logs)


def test_an_unaligned_barrier_snapshots_at_once_and_logs_the_other_inputs_until_theirs():
    h = Harness(unaligned=True, second_input=True)
    try:
        h.send(h.reg2_prod, [20, 21])
        h.send(h.reg_prod, [1, 2], ("unaligned", 1), [3])
        h.send(h.back_prod, [30], ("unaligned", 1), [31])
        h.send(h.reg2_prod, [22], ("unaligned", 1), [23])
        cid, states, logs = h.writer.next()
        assert cid == 1 and h.writer.unaligned[1]
        assert_unaligned_cut(states, logs, before={1, 2, 20, 21, 22, 30}, after={3, 23, 31})
        # The input whose barrier came first logged nothing: its records are in the state.
        assert not logs.get("r") or not logs.get("r2"), logs
    finally:
        h.close()


def trigger_behind_a_queue(h: Harness, frames: list[list[int]]) -> tuple[int, dict[str, Any], dict[str, list[Any]]]:
    """``frames`` queued on the second input before its unaligned barrier 1 (and -2 after
    it), then the trigger, then barrier 1 on the other inputs: the snapshot it takes."""
    h.send(h.reg2_prod, *frames, ("unaligned", 1), [-2])
    h.control(messages.Trigger(1, unaligned=True))
    h.send(h.reg_prod, [-1], ("unaligned", 1))
    h.send(h.back_prod, ("unaligned", 1))
    snap = h.writer.next()
    assert snap[0] == 1
    return snap


def test_a_trigger_snapshots_a_busy_task_at_once_and_reads_its_inputs_ahead_of_processing():
    """A slow stage with a queue of frames on an input: the unaligned checkpoint persists the
    queued records as channel state and completes long before they are processed."""
    h = Harness(unaligned=True, delay=0.2, second_input=True)
    try:
        n = 9000  # records per frame: more than a task gathers into one batch
        frames = [list(range(i * n, (i + 1) * n)) for i in range(10)]  # two seconds of processing
        cid, states, logs = trigger_behind_a_queue(h, frames)
        assert_unaligned_cut(states, logs, before=set(range(10 * n)), after={-2})
        # Acknowledged while most of the queue was still unprocessed: it was read ahead.
        assert h.writer.processed_at_ack[1] < 6 * n, h.writer.processed_at_ack
        assert len(logs["r2"]) >= 4 * n
    finally:
        h.close()


def test_an_alignment_that_passes_the_aligned_timeout_turns_unaligned():
    h = Harness(aligned_timeout=0.05, second_input=True)
    try:
        h.send(h.reg_prod, [1], ("barrier", 1), [2])  # r aligned; r2 never delivers barrier 1 for now
        h.send(h.back_prod, ("barrier", 1))
        h.send(h.reg2_prod, [10])
        assert h.op.snapshotted.wait(10)  # after 50 ms of alignment the task snapshotted unaligned
        h.send(h.reg2_prod, [11], ("barrier", 1), [12])
        cid, states, logs = h.writer.next()
        assert cid == 1 and h.writer.unaligned[1]
        assert_unaligned_cut(states, logs, before={1, 10, 11}, after={2, 12})
        assert 11 in logs["r2"] and 11 not in states["remember"]
    finally:
        h.close()


def test_an_end_read_ahead_closes_the_waiting_sessions_but_the_input_stays_live():
    """The end of an input read ahead: no barrier will come on it, so the sessions waiting
    on it have its whole log; but its frames are not processed yet, so a session that starts
    now must still wait on it and log them (the task logs its read-ahead frames then)."""
    log = ChannelStateLog([], ["r1", "r2"])
    log.start(1, None, unaligned=True)
    log.on_records("r2", pk(7))
    assert log.end_ahead("r2").outcome is LogOutcome.IGNORED  # r1 still owes its barrier
    (s,) = log.on_barrier("r1", 1).completed
    assert logs_of(s) == {"r1": [], "r2": [7]}
    log.start(2, None, unaligned=True)
    assert log.sessions[2].waiting == {"r1", "r2"}


def test_a_session_past_the_memory_limit_is_due_to_spill_and_take_keeps_the_order():
    log = ChannelStateLog(["b"], ["r"], memory_limit=10)
    log.start(1, "state", unaligned=True)
    log.on_records("b", pk(1))
    assert not log.due  # within the limit
    log.on_records("r", pk("x" * 20))
    (s,) = log.due_to_spill()
    assert not log.due_to_spill()  # emptied by the call
    first = log.take(s)
    assert {ch: [r for p in fs for r in codec.unpack(p)] for ch, fs in first.items()} == {"b": [1], "r": ["x" * 20]}
    assert s.memory == 0 and s.spills == 1 and s.logged == 2  # counted once, spilled or not
    log.on_records("b", pk(2))
    log.on_barrier("b", 1)
    (done,) = log.on_barrier("r", 1).completed
    assert logs_of(done) == {"b": [2], "r": []}  # what came after the spill


def test_a_session_that_ended_before_it_spilled_is_not_due():
    log = ChannelStateLog(["b"], memory_limit=0)
    log.start(1, "state")
    log.on_records("b", pk(1))
    assert log.due
    log.on_barrier("b", 1)  # completed: written whole, nothing to spill
    assert log.due_to_spill() == []


# ---- a randomised oracle: unaligned sessions, with and without spilling ---------------------


@st.composite
def unaligned_scenarios(draw: st.DrawFn) -> tuple[list[tuple[str, str, int]], int, list[str], int | None]:
    """Channels (back-edges and regular inputs), each carrying records and then barrier 1
    and more records, interleaved at random; the session starts at a random event (the
    first barrier or a trigger); a random memory limit (None: never spill)."""
    n = draw(st.integers(1, 4))
    names = [f"{'b' if i % 2 else 'r'}{i}" for i in range(n)]
    per: list[list[tuple[str, str, int]]] = []
    value = 0
    for ch in names:
        before, after = draw(st.integers(0, 6)), draw(st.integers(0, 3))
        evs = []
        for _ in range(before):
            value += 1
            evs.append(("rec", ch, value))
        evs.append(("barrier", ch, 1))
        for _ in range(after):
            value += 1
            evs.append(("rec", ch, value))
        per.append(evs)
    rnd = draw(st.randoms(use_true_random=False))
    events: list[tuple[str, str, int]] = []
    while any(per):
        q = rnd.choice([q for q in per if q])
        events.append(q.pop(0))
    start = draw(st.integers(0, len(events)))
    limit = draw(st.one_of(st.none(), st.integers(0, 40)))
    return events, start, names, limit


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(unaligned_scenarios())
def test_random_unaligned_sessions_log_exactly_the_records_between_the_cut_and_each_barrier(scenario):
    """Chandy and Lamport's channel state, against an oracle: channel c's log is every
    record of c after the snapshot and before c's barrier, in order, each once; spilled
    chunks followed by what stayed in memory are that log, whatever the memory limit."""
    events, start, names, limit = scenario
    log = ChannelStateLog([c for c in names if c.startswith("b")], [c for c in names if c.startswith("r")], limit)
    arrived = {ch for kind, ch, _ in events[:start] if kind == "barrier"}
    oracle: dict[str, list[int]] = {ch: [] for ch in names if ch not in arrived}
    seen_barrier = set(arrived)
    for kind, ch, v in events[start:]:
        if kind == "barrier":
            seen_barrier.add(ch)
        elif ch not in seen_barrier:
            oracle[ch].append(v)
    for kind, ch, v in events[:start]:
        if kind == "rec":
            log.on_records(ch, pk(v))  # no session yet: nothing is logged
    step = log.start(1, "state", unaligned=True, arrived=arrived)
    completed = list(step.completed)
    spilled: dict[str, list[int]] = {ch: [] for ch in names}
    for kind, ch, v in events[start:]:
        if kind == "rec":
            log.on_records(ch, pk(v))
            for s in log.due_to_spill():
                for c, frames in log.take(s).items():
                    spilled[c] += [r for p in frames for r in codec.unpack(p)]
        else:
            completed += log.on_barrier(ch, 1).completed
    (s,) = completed  # completes exactly once, when the last barrier it waits for came
    assert not log.logging
    got = {ch: spilled[ch] + [r for p in s.logs.get(ch, []) for r in codec.unpack(p)] for ch in names}
    assert {ch: got[ch] for ch in oracle} == oracle
    assert all(not got[ch] for ch in arrived)
    assert s.logged == sum(len(v) for v in oracle.values())
    if limit is None:
        assert s.spills == 0


def test_read_ahead_stops_at_the_memory_limit_and_the_cut_is_still_exact(monkeypatch):
    """channel_state_memory bounds what a task reads ahead: past it, frames stay in the
    socket until processing frees room (reading on would move the backlog from the kernel
    into the task, checkpoint after checkpoint). The checkpoint then completes only once
    enough is processed, with the same exact cut; what it logged spilled to the writer."""
    from abs_engine.runtime.channel import InputChannel

    peak = [0]
    push = InputChannel.push_ahead

    def counting(self: InputChannel, kind: int, payload: bytes) -> None:
        push(self, kind, payload)
        peak[0] = max(peak[0], self.ahead_bytes)

    monkeypatch.setattr(InputChannel, "push_ahead", counting)
    n = 9000
    frames = [list(range(i * n, (i + 1) * n)) for i in range(10)]
    frame_bytes = max(len(codec.pack(f)) for f in frames)
    h = Harness(unaligned=True, delay=0.02, second_input=True, channel_state_memory=2 * frame_bytes)
    try:
        cid, states, logs = trigger_behind_a_queue(h, frames)
        assert peak[0] <= 3 * frame_bytes, (peak[0], frame_bytes)  # the limit, and the frame that crossed it
        assert_unaligned_cut(states, logs, before=set(range(10 * n)), after={-2})
        assert h.writer.spilled == {} and len(logs["r2"]) > 2 * n  # it spilled, and the spills came back in
        # It had to process most of the queue before it could reach the barrier.
        assert h.writer.processed_at_ack[1] >= 6 * n, h.writer.processed_at_ack
    finally:
        h.close()
