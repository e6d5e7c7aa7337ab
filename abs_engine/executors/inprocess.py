"""The in-process executor (``executor="inprocess"``): every task of the job in the calling
thread, over in-memory channels, as Bytewax's ``run_main`` -- for users' unit tests and for
debugging with breakpoints (one thread: a breakpoint in a map function stops the job there,
and the debugger sees the whole job).

It is the same job as with the other executors: the master (master.py) drives it with its
coordinator, restart strategy, checkpoint storage and statistics; each task is built from
its Deploy as a worker builds it (runtime/build.py) and runs the production task
(runtime/task.py) over runtime/memory.py's links; a task's failure becomes the Failed
message a worker would send (runtime/failure.py). So checkpoints, recovery from the newest
checkpoint and exactly-once output hold as they do with worker processes.

What differs: one core; no worker process to kill (no chaos, no fencing of stale processes:
there are none), and no ``task_timeout`` watchdog (a user function that never returns
holds the thread; that is what a debugger is for).

Invariant: a round gives every task a turn -- its control messages, then one source batch
or up to ``ROUND_FRAMES`` frames per input -- so no task starves another, and a barrier
or a trigger waits at most one round.
"""

from __future__ import annotations

import os
import time
from .. import codec, messages
from ..checkpoint.remote import write_task_state
from ..runtime import build
from ..runtime.channel import InputChannel, OutputChannel
from ..runtime.failure import failed_message
from ..runtime.memory import DriverEnd, InlineWriter, MemoryLink, memory_control
from ..runtime.output import Output
from ..runtime.task import Task
from ..runtime.task_loop import PROGRESS_EVERY
from ..runtime.watchdog import Activity
from .attempt import DeployOf, Silence

ROUND_FRAMES = 64  #: frames an input may hand its task in one round
ENV = ("ABS_ENGINE_ATTEMPT", "ABS_ENGINE_INPROCESS")


class InProcessAttempt:
    """An attempt's tasks, run in turns in this thread."""

    def __init__(self, tasks: list[str], generation: int):
        self.task_ids = tasks
        self.generation = generation
        self.committed: set[str] = set()
        self.tasks: dict[str, Task] = {}
        self.ends: dict[str, DriverEnd] = {}
        self.failed: list[tuple[str, messages.Message]] = []
        self.last_progress = 0.0

    def start(self, deploy: DeployOf) -> dict[str, int | None]:
        # What a worker process has in its environment: the attempt (abs_engine.testing's
        # fail_at reads it), and that crashes are simulated here (testing.crash).
        self.saved_env = {k: os.environ.get(k) for k in ENV}
        os.environ.update({"ABS_ENGINE_ATTEMPT": str(self.generation), "ABS_ENGINE_INPROCESS": "1"})
        links: dict[str, tuple[MemoryLink, MemoryLink]] = {}
        for t in self.task_ids:
            control, self.ends[t] = memory_control()
            d = deploy(t, {})
            try:
                ready = build.prepare(d, t, self.generation, Activity())
            except BaseException as e:  # noqa: BLE001 - as a worker would report it
                self._fail(t, e)
                return {t: None for t in self.task_ids}
            if ready.final_committed:
                control.send(messages.Committed(t))
                continue
            spec, chain = ready.spec, ready.chain
            for cid in [*(c.id for c in spec.inputs), *(cid for o in spec.outputs for cid in o.channels)]:
                links.setdefault(cid, MemoryLink.pair())  # made by whichever end is built first
            tail = chain.names[-1] if chain.names else (chain.source_name or t)
            outputs = [Output(o, [OutputChannel(cid, links[cid][0]) for cid in o.channels],
                              ready.key_fns.get(o.key_operator), tail, ready.plan.max_parallelism)
                       for o in spec.outputs]
            inputs = {c.id: InputChannel(c.id, links[c.id][1], codec.FrameReader(), c.back_edge) for c in spec.inputs}
            root = d.checkpoint_dir

            def put(checkpoint_id: int, name: str, blob: bytes, root: str = root) -> None:
                write_task_state(root, checkpoint_id, name, blob)

            writer = InlineWriter(control, t, put, time.perf_counter)
            self.tasks[t] = Task(spec, chain, outputs, inputs, control, writer, ready.options, replay=ready.replay,
                                 restored_finished=ready.restored_finished)
            control.send(messages.Running(t))
        for t, task in self.tasks.items():
            try:
                task.start()
            except BaseException as e:  # noqa: BLE001 - as a worker would report it
                self._fail(t, e)
        return {t: None for t in self.task_ids}

    def _fail(self, task: str, e: BaseException) -> None:
        failed = failed_message(task, e)
        if failed is None:
            raise e
        self.failed.append((task, failed))
        gone = self.tasks.pop(task, None)
        if gone is not None:
            gone.chain.close()

    # ---- running ----------------------------------------------------------------------------

    def receive(self, timeout: float) -> list[tuple[str, messages.Message]]:
        if self.failed:
            return self.failed
        progressed = self._round()
        out: list[tuple[str, messages.Message]] = list(self.failed)
        for t, end in self.ends.items():
            while (msg := end.receive_one()) is not None:
                if isinstance(msg, messages.Committed):
                    self.committed.add(t)
                out.append((t, msg))
        if not out and not progressed and timeout > 0:
            # Nothing to do until the clock moves: the coordinator's next deadline, or a timer.
            due = min((d for task in self.tasks.values() if not task.stop and (d := task.timer_due()) is not None),
                      default=float("inf"))
            time.sleep(max(0.0, min(timeout, due - time.time())))  # waiting for time, not for another thread
        return out

    def _round(self) -> bool:
        """Every live task's turn; whether anything happened."""
        progressed = False
        now = time.monotonic()
        report = now - self.last_progress >= PROGRESS_EVERY
        if report:
            self.last_progress = now
        for t, task in list(self.tasks.items()):
            if task.stop:
                continue
            try:
                for msg in task.control.poll():
                    task.on_control(msg)
                    progressed = True
                if task.stop:
                    continue
                if task.source is not None:
                    if not task.finished and not task.paused:
                        task.read_source()
                        progressed = True
                    if report:
                        task.control.send(messages.Progress(t, task.records_in, task.records_out))
                    continue
                progressed = self._take_inputs(task) or progressed
                task.flush()
                task.service()
                task.check_aligned_timeout()
                if not task.finished:
                    task.fire_timers()
            except BaseException as e:  # noqa: BLE001 - as a worker would report it
                self._fail(t, e)
                return True
        return progressed

    @staticmethod
    def _take_inputs(task: Task) -> bool:
        took = False
        for ch in task.inputs.values():
            if ch.ended:
                continue
            ch.fill_nowait()
            task.on_input_readable(ch)
            for _ in range(ROUND_FRAMES):
                if not task.take(ch):
                    break
                took = True
        return took

    def send(self, task: str, msg: messages.Message) -> None:
        self.ends[task].send(msg)

    def check(self, now: float, silence: Silence) -> None:
        return None  # a task's failure is reported by the round it happened in

    def root_cause(self, exclude: str, suspect: str | None) -> None:
        return None  # no peer dies alone here: the failing task reports itself

    def live_pids(self) -> dict[str, int]:
        return {}

    def finish(self) -> None:
        return None

    def close(self) -> None:
        for task in self.tasks.values():
            task.chain.close()  # (connections an operator holds: this thread runs on)
        self.tasks.clear()
        for k, v in getattr(self, "saved_env", {}).items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
