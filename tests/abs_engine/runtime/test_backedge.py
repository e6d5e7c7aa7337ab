"""Back-edge logging: the BackEdgeLog state machine, and a real Task driven over socketpairs
with one regular and one back-edge input (scripted frames, snapshots captured)."""

from __future__ import annotations

import queue
import socket
import threading
from typing import Any

import pytest

from abs_engine import codec, messages
from abs_engine.checkpoint.storage import decode_snapshot
from abs_engine.plan import ChannelSpec, TaskSpec
from abs_engine.runtime.backedge import BackEdgeLog, BackEdgeOutcome
from abs_engine.runtime.channel import InputChannel
from abs_engine.runtime.control import ControlLink
from abs_engine.wire import Wire
from abs_engine.runtime.task import Task
from operators.base import Operator, OperatorContext

# ---- the state machine ----------------------------------------------------------------


def test_trigger_then_records_then_barrier_logs_exactly_the_records_between():
    log = BackEdgeLog(["b"])
    log.on_records("b", [1, 2])  # before the snapshot: not logged
    step = log.start(1, "state")
    assert step.outcome is BackEdgeOutcome.LOGGING and log.logging
    log.on_records("b", [3, 4])
    log.on_records("b", [5])
    step = log.on_barrier("b", 1)
    assert step.outcome is BackEdgeOutcome.COMPLETE
    (s,) = step.completed
    assert s.checkpoint_id == 1 and s.payload == "state" and s.logs == {"b": [3, 4, 5]} and s.logged == 3
    log.on_records("b", [6])  # after the barrier: belongs to no session
    assert not log.logging


def test_session_completes_only_when_every_back_edge_delivered_its_barrier():
    log = BackEdgeLog(["b1", "b2"])
    log.start(7, None)
    log.on_records("b1", ["x"])
    assert log.on_barrier("b1", 7).outcome is BackEdgeOutcome.LOGGING
    log.on_records("b1", ["after b1's barrier"])
    log.on_records("b2", ["y"])
    step = log.on_barrier("b2", 7)
    assert step.outcome is BackEdgeOutcome.COMPLETE
    assert step.completed[0].logs == {"b1": ["x"], "b2": ["y"]}


def test_barrier_before_trigger_holds_the_channel_and_it_logs_nothing():
    log = BackEdgeLog(["b", "c"])
    step = log.on_barrier("b", 3)
    assert step.outcome is BackEdgeOutcome.HELD and log.is_held("b") and not log.is_held("c")
    step = log.start(3, None)
    assert step.released == ("b",) and not log.is_held("b")
    log.on_records("b", ["behind the early barrier: after the snapshot, not in flight"])
    log.on_records("c", ["in flight"])
    step = log.on_barrier("c", 3)
    assert step.completed[0].logs == {"c": ["in flight"]}


def test_no_back_edges_or_all_ended_completes_at_once():
    assert BackEdgeLog([]).start(1, None).outcome is BackEdgeOutcome.COMPLETE
    log = BackEdgeLog(["b"])
    log.start(1, None)
    step = log.on_end_of_stream("b")
    assert step.outcome is BackEdgeOutcome.COMPLETE and step.completed[0].logs == {"b": []}
    assert log.start(2, None).outcome is BackEdgeOutcome.COMPLETE


def test_overlapping_sessions_log_into_each_until_their_own_barrier():
    log = BackEdgeLog(["b"])
    log.start(1, None)
    log.on_records("b", ["r1"])
    log.start(2, None)
    log.on_records("b", ["r2"])
    done1 = log.on_barrier("b", 1).completed
    log.on_records("b", ["r3"])
    done2 = log.on_barrier("b", 2).completed
    assert done1[0].logs == {"b": ["r1", "r2"]}
    assert done2[0].logs == {"b": ["r2", "r3"]}


def test_stale_and_unknown_barriers_are_outcomes():
    log = BackEdgeLog(["b"])
    log.start(1, None)
    log.on_barrier("b", 1)
    assert log.on_barrier("b", 1).outcome is BackEdgeOutcome.IGNORED
    assert log.on_barrier("zz", 1).outcome is BackEdgeOutcome.UNKNOWN_CHANNEL


# ---- a real Task over socketpairs -----------------------------------------------------


class Remember(Operator):
    """State = every record processed, in order."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def process(self, batch: list[Any]) -> list[Any]:
        self.seen.extend(batch)
        return []

    def snapshot(self, checkpoint_id: int) -> Any:
        return list(self.seen)


class CapturingWriter:
    def __init__(self) -> None:
        self.snapshots: queue.Queue[tuple[int, dict[str, Any], dict[str, list[Any]]]] = queue.Queue()

    def submit(self, cid, name, blob, alignment_ms, logged, finished, sync_ms=0.0, base=-1, known=-1) -> None:
        snap = decode_snapshot(blob() if callable(blob) else blob, name)
        states, logs = snap.states, snap.logs
        self.snapshots.put((cid, states, logs))

    def flush(self) -> None:
        pass

    def next(self) -> tuple[int, dict[str, Any], dict[str, list[Any]]]:
        return self.snapshots.get(timeout=10)


class Harness:
    def __init__(self) -> None:
        self.reg_prod, reg_cons = socket.socketpair()
        self.back_prod, back_cons = socket.socketpair()
        self.ctl_driver, ctl_worker = socket.socketpair()
        control = ControlLink.__new__(ControlLink)
        control.sock, control.reader, control._lock, control.inbox = ctl_worker, codec.FrameReader(), threading.Lock(), __import__("collections").deque()
        control.wire = Wire(ctl_worker)
        inputs = {
            "r": InputChannel("r", reg_cons, codec.FrameReader(), back_edge=False),
            "b": InputChannel("b", back_cons, codec.FrameReader(), back_edge=True),
        }
        spec = TaskSpec("t#0", "t", 0, 1, (ChannelSpec("r", "x#0", "t#0", 0, False),
                                               ChannelSpec("b", "y#0", "t#0", 1, True)), ())
        self.op = Remember()
        self.op.open(OperatorContext("remember", 0, 1, 0, False))
        self.writer = CapturingWriter()
        self.task = Task(spec, ["remember"], [self.op], None, None, [], inputs, control, self.writer, "/nonexistent")
        self.thread = threading.Thread(target=self.task.run, daemon=True)
        self.thread.start()

    def send(self, sock: socket.socket, *items: Any) -> None:
        data = b""
        for it in items:
            if isinstance(it, tuple) and it[0] == "barrier":
                data += codec.frame(codec.FrameKind.BARRIER, codec.pack(it[1]))
            else:
                data += codec.records_frame(list(it))
        sock.sendall(data)

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
    log = BackEdgeLog(["b"])
    assert log.on_barrier("b", 4).outcome is BackEdgeOutcome.HELD
    step = log.start(6, None)
    assert step.released == ("b",) and step.outcome is BackEdgeOutcome.LOGGING
    log.on_records("b", ["between barrier 4 and barrier 6"])
    done = log.on_barrier("b", 6).completed
    assert done[0].logs == {"b": ["between barrier 4 and barrier 6"]}


def test_a_newer_barrier_discards_older_sessions_that_can_never_complete():
    log = BackEdgeLog(["b"])
    log.start(1, None)
    log.start(2, None)
    log.on_records("b", ["x"])
    step = log.on_barrier("b", 2)  # barrier 1 never came on b: session 1 is dead
    assert [s.checkpoint_id for s in step.completed] == [2]
    assert not log.sessions
    log.on_records("b", ["not logged by anyone"])
    assert not log.logging
