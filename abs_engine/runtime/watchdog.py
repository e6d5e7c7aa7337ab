"""The worker's watchdog thread: heartbeats, driver-death detection, stuck user code.

Invariants:
- It runs beside the task thread and never touches task state; it only reads ``Activity``
  (which operator the task thread is inside, since when) and sends on the locked control
  link. So it works while the task thread is inside a user function that never returns.
- A worker never outlives its driver by more than about one heartbeat interval: a failed
  heartbeat send (the driver closed the connection) or a changed parent process (the
  driver that started us died) ends the process at once with ``os._exit``.
- A user call busy longer than ``task_timeout`` fails the task with the operator's name and
  the task thread's Python stack; its cause is STUCK, so the driver fails
  the job at once if the same operator gets stuck again after a restart.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from typing import Any, Callable

from .. import messages
from .control import ControlLink


class Activity:
    """What the task thread is doing: ``op`` is the operator whose code runs, ``since``
    the monotonic time the call started (0.0: not inside operator code)."""

    __slots__ = ("op", "since")

    def __init__(self) -> None:
        self.op = ""
        self.since = 0.0

    def enter(self, op: str) -> None:
        self.op = op
        self.since = time.monotonic()

    def leave(self) -> None:
        self.since = 0.0


def thread_stack(thread_id: int | None) -> str:
    frame = sys._current_frames().get(thread_id) if thread_id is not None else None
    if frame is None:
        return "(stack not available)"
    return "".join(traceback.format_stack(frame))


class Watchdog:
    def __init__(self, control: ControlLink, task: str, activity: Activity, interval: float,
                 task_timeout: float, task_thread: int | None = None):
        self.control = control
        self.task = task
        self.activity = activity
        self.interval = interval
        self.task_timeout = task_timeout
        self.task_thread = task_thread if task_thread is not None else threading.get_ident()
        self.parent = os.getppid()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="watchdog", daemon=True)
        #: Set once the task is built: its counters (records in, out, seconds sending) and
        #: its health (runtime/task_health.py), read without a lock (ints and floats the task
        #: thread replaces whole, under the GIL): Heartbeat's fields after the task's id.
        self.counters: Callable[[], tuple[Any, ...]] | None = None

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()

    def check_once(self, now: float) -> messages.Failed | None:
        """The Failed message to send if the task thread is stuck in operator code."""
        since, op = self.activity.since, self.activity.op
        if not self.task_timeout or not since or now - since <= self.task_timeout:
            return None
        stack = thread_stack(self.task_thread)
        text = (f"operator {op!r} has been inside one call for {now - since:.1f}s, longer than "
                f"task_timeout={self.task_timeout:g}s (a user function that blocks or loops?). "
                f"Its Python stack:\n{stack}")
        return messages.Failed(self.task, messages.FailureCause.STUCK, op, text, False)

    def _run(self) -> None:
        # Event.wait as a periodic timer: the heartbeat period, not a synchronisation.
        while not self._stop.wait(self.interval):
            if os.getppid() != self.parent:
                os._exit(1)  # the driver that started us is gone
            try:
                counters = self.counters
                self.control.send(messages.Heartbeat(self.task, *counters()) if counters is not None
                                  else messages.Heartbeat(self.task))
            except OSError:
                os._exit(1)  # the driver closed the control connection
            failed = self.check_once(time.monotonic())
            if failed is not None:
                try:
                    self.control.send(failed)
                except OSError:
                    pass
                os._exit(1)
