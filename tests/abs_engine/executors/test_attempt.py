"""The tasks of an attempt as the driver sees them (executors/attempt.py): a worker that
sends nothing for the silence bound fails its attempt, naming the bound and its machine."""

from __future__ import annotations

import socket
import time

import pytest

from abs_engine import messages
from abs_engine.messages import FailureCause
from abs_engine.executors.attempt import ProcessAttempt, Silence, Worker
from abs_engine.executors.failures import WorkerFailure


class Quiet:
    """A worker process that is alive and says nothing (a stopped or cut-off one)."""

    pid = None  # it runs on another machine: the driver knows its pid from its Hello

    def poll(self) -> int | None:
        return None

    def describe_exit(self, code: int) -> str:
        return f"exited with status {code}"

    def kill(self) -> None:
        pass

    def dump_stacks(self) -> None:
        pass


def attempt_with(*workers: Worker) -> ProcessAttempt:
    with socket.socket() as listener:
        attempt = ProcessAttempt([w.task for w in workers], None, listener, 1, b"s" * 32, None, {},  # type: ignore[arg-type]
                                 10.0, lambda: None, lambda _: None)
    attempt.workers = {w.task: w for w in workers}
    return attempt


@pytest.mark.parametrize("heartbeat,task,want", [
    (30.0, 300.0, Silence(30.0, "heartbeat_timeout")),
    (0.0, 300.0, Silence(300.0, "task_timeout")),
    (30.0, 10.0, Silence(10.0, "task_timeout")),
    (0.0, 0.0, Silence(0.0, "")),
])
def test_the_silence_bound_is_the_shorter_timeout_that_is_set(heartbeat, task, want):
    assert Silence.of(heartbeat, task) == want


def test_a_worker_silent_past_the_heartbeat_timeout_fails_naming_it_and_its_machine():
    now = time.monotonic()
    heard = Worker("count#1", Quiet(), last_heard=now - 1.0)  # type: ignore[arg-type]
    silent = Worker("count#0", Quiet(), last_heard=now - 7.0, hello_pid=4242,  # type: ignore[arg-type]
                    peer_host="10.231.7.12")
    attempt = attempt_with(heard, silent)
    attempt.check(now, Silence(8.0, "heartbeat_timeout"))  # within the bound: nothing
    attempt.check(now, Silence(0.0, ""))  # no bound: nothing
    with pytest.raises(WorkerFailure) as info:
        attempt.check(now, Silence(6.0, "heartbeat_timeout"))
    text = str(info.value)
    assert info.value.task == "count#0" and "worker 4242 on 10.231.7.12" in text, text
    assert "sent nothing for 7.0s (heartbeat_timeout=6s)" in text and "cut off" in text, text
    attempt.committed.add("count#0")  # it committed the final checkpoint: its silence is its end
    attempt.check(now, Silence(6.0, "heartbeat_timeout"))


def test_a_worker_whose_frames_wait_unread_is_not_silent():
    """The driver was busy (a long savepoint copy): the worker's heartbeats sit in its
    socket. That is not silence; a socket with nothing in it is."""
    a, b = socket.socketpair()
    with a, b:
        now = time.monotonic()
        w = Worker("count#0", Quiet(), sock=a, last_heard=now - 60.0, peer_host="10.0.0.2")  # type: ignore[arg-type]
        attempt = attempt_with(w)
        with pytest.raises(WorkerFailure):
            attempt.check(now, Silence(6.0, "heartbeat_timeout"))
        b.sendall(b"a heartbeat's frame")
        attempt.check(now, Silence(6.0, "heartbeat_timeout"))
        assert w.last_heard == now


class Exited(Quiet):
    """A worker process that has exited with ``code``, seen only from the ``after``-th look on
    (a SIGKILLed one whose exit the launcher has not reaped yet)."""

    def __init__(self, code: int, after: int = 0, pid: int = 4000):
        self.code, self.after, self.pid = code, after, pid  # type: ignore[misc]

    def poll(self) -> int | None:
        if self.after > 0:
            self.after -= 1
            return None
        return self.code

    def describe_exit(self, code: int) -> str:
        return f"killed by signal {-code}" if code < 0 else f"exited with status {code}"


def lost_a_peer(task: str, proc: Exited) -> Worker:
    """A worker whose last words say it failed only because a consumer went away."""
    w = Worker(task, proc)  # type: ignore[arg-type]
    w.reader.feed(messages.encode(messages.Failed(task, FailureCause.DOWNSTREAM_LOST, None,
                                                  "connection to count#0 reset", False)))
    return w


def test_a_worker_that_died_of_a_lost_consumer_is_not_blamed_for_the_consumer_killed_first():
    """The dashboard test's SIGKILL of count#0 was once reported as the failure of read#0,
    whose send to it broke and whose exit the driver saw first: the driver waits (bounded)
    for the death that caused it and reports that one."""
    sender = lost_a_peer("read#0", Exited(1, pid=4001))
    killed = Worker("count#0", Exited(-9, after=3, pid=4002))  # type: ignore[arg-type]
    attempt = attempt_with(sender, killed, Worker("count#1", Quiet()))  # type: ignore[arg-type]
    with pytest.raises(WorkerFailure) as info:
        attempt.check(time.monotonic(), Silence(0.0, ""))
    assert info.value.task == "count#0" and "worker process 4002 killed by signal 9" in str(info.value)


def test_a_death_without_last_words_wins_over_one_that_lost_a_peer():
    sender = lost_a_peer("read#0", Exited(1, pid=4001))
    killed = Worker("count#0", Exited(-9, pid=4002))  # type: ignore[arg-type]
    with pytest.raises(WorkerFailure) as info:
        attempt_with(sender, killed).check(time.monotonic(), Silence(0.0, ""))
    assert info.value.task == "count#0"
