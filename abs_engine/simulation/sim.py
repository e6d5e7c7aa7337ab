"""One seed of the simulation: the production tasks over memory, a driver, a scheduler.

Each task is a ``runtime.task.Task`` (the class a worker runs) with its channels and
control link in memory (runtime/memory.py), a ``ManualClock`` and an ``InlineWriter``
into the simulated storage. The driver routes the tasks' messages to the real
``CheckpointCoordinator`` with the engine's own routing (checkpoint/routing.py, as
executors/attempt_driver.py does), and mirrors the failover of executors/master.py
(_attempts); a restore goes through the production storage (checkpoint/storage.py:
latest_valid, remove_orphans_after, read_snapshot's checks and decoding, over the memory
store or a directory) and replay (runtime/restore.py).
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from typing import Any

from .. import codec, messages
from ..checkpoint.coordinator import CheckpointCoordinator
from ..checkpoint.pending import AckOutcome
from ..checkpoint.routing import route
from ..runtime import restore
from ..runtime.chain import Chain
from ..runtime.channel import InputChannel, OutputChannel
from ..runtime.clock import ManualClock
from ..runtime.memory import DriverEnd, InlineWriter, MemoryLink, memory_control
from ..runtime.output import Output
from ..runtime.task import Task, TaskOptions
from . import oracle
from .oracle import SimFailure
from .mutations import NON_TRANSACTIONAL_SINK
from .storage import open_storage
from .topology import Counter as CounterOp
from .topology import SimSource, Step, TwoPhaseSink, build_topology

MODES = ("aligned", "unaligned", "timeout")
MAX_STEPS = 50_000


class Sim:
    def __init__(self, seed: int, topology: str, bug: str = "none", storage: str = "memory",
                 root: str | None = None, trace: bool = False, mode: str = "aligned"):
        self.seed, self.bug, self.mode = seed, bug, mode
        self.topo = build_topology(topology)
        rng = self.rng = random.Random(seed)
        self.batch = rng.randint(1, 4)
        self.max_in_flight = rng.choice((1, 1, 2, 3)) if mode != "unaligned" else 1
        self.tick_p = rng.choice((0.05, 0.1, 0.25))
        # In steps of the scheduler (a tick advances the clock by 0.2 s on average):
        step_time = self.tick_p * 0.2
        self.interval = rng.choice((5, 15, 50)) * step_time
        self.timeout = rng.choice((80, 200, 10_000)) * step_time
        self.crash_p = rng.choice((0.0, 0.003, 0.01, 0.03))
        self.crashes_left = rng.randint(0, 3)
        self.crash_after_complete = rng.choice((0.0, 0.0, 0.3))  #: like chaos.on_checkpoint
        retain = rng.choice((1, 2, 3))
        #: mode "timeout": how long a task aligns before it snapshots unaligned (0: at once).
        self.aligned_timeout = rng.choice((0.0, 5 * step_time, 40 * step_time)) if mode == "timeout" else None
        #: How often a task processes what it gathered before it takes another frame (the
        #: worker does at the end of a turn): rarely, many frames' records go in one batch.
        self.flush_p = rng.choice((0.2, 1.0))
        # Half the seeds favour some channels and connections and starve others ("buggify"):
        # barriers overtake, checkpoints pile up, acks come late.
        skew = (0.05, 1.0, 1.0, 8.0) if rng.random() < 0.5 else (1.0,)
        keys = [("d", c.producer, c.consumer) for c in self.topo.channels] + [
            (k, t, "") for t in self.topo.kinds for k in "sca"]
        self.weights = {k: rng.choice(skew) for k in keys}
        self.crash_next = False
        self.storage, self.write = open_storage(storage, retain, root)
        self.sources = [t for t, k in self.topo.kinds.items() if k == "source"]
        self.inputs: dict[str, list[Any]] = {}
        rid = 0
        for t in self.sources:
            if topology == "cycle":
                amounts = [rng.randint(0, 6) for _ in range(rng.randint(3, 15))]
                self.inputs[t] = [(rid + i, n, n) for i, n in enumerate(amounts)]
                rid += len(amounts)
            else:
                self.inputs[t] = [rng.randrange(4) for _ in range(rng.randint(5, 40))]
        self.output: list[Any] = []  #: the sink's external output: survives crashes
        self.trace: list[str] | None = [] if trace else None
        self.digest = hashlib.sha256()
        self.completed: list[int] = []  #: every checkpoint completed, over all attempts
        self.clock = ManualClock()
        self.steps = self.crashes = self.idle = 0
        self.stats: Counter[str] = Counter()  #: what the run exercised (tests check it is not trivial)
        self.start_attempt()

    @property
    def now(self) -> float:
        return self.clock.now

    # ---- plumbing ----
    def note(self, event: str) -> None:
        self.digest.update(event.encode())
        if self.trace is not None:
            self.trace.append(f"{self.steps} t={self.now:.3f} {event}")

    def send(self, out: list[tuple[str, messages.Message]]) -> None:
        for t, m in out:
            self.to_task[t].append(m)

    def make_chain(self, tid: str) -> Chain:
        kind = self.topo.kinds[tid]
        if kind == "source":
            return Chain([], [], SimSource(self.inputs[tid], lambda: self.rng.randint(1, self.batch)), tid)
        if kind == "counter":
            return Chain([tid], [CounterOp()])
        if kind == "step":
            return Chain([tid], [Step()])
        return Chain([tid], [TwoPhaseSink(self.output, transactional=self.bug != NON_TRANSACTIONAL_SINK)])

    def put(self, task: str) -> Any:
        def put(checkpoint_id: int, name: str, blob: bytes) -> None:
            self.write(checkpoint_id, name, blob)
            self.acks_sent.add((checkpoint_id, task))  # the ack follows at once (InlineWriter)
        return put

    # ---- attempts and failover (executors/master.py: _attempts, worker.py: restore) ----
    def start_attempt(self) -> None:
        self.acks_sent: set[tuple[int, str]] = set()
        self.committed: set[str] = set()
        self.to_task: dict[str, list[messages.Message]] = {t: [] for t in self.topo.kinds}
        meta, skipped = self.storage.latest_valid()
        if skipped:
            raise SimFailure(f"latest_valid skipped checkpoints: {[str(e) for e in skipped]}")
        newest = max(self.completed, default=None)
        if (meta.checkpoint_id if meta else None) != newest:
            raise SimFailure(f"recovery picked checkpoint {meta and meta.checkpoint_id}, newest completed is {newest}")
        self.storage.remove_orphans_after(meta.checkpoint_id if meta else 0)
        next_id = max(self.storage.ids_on_disk(), default=0) + 1
        self.note(f"attempt restore={meta and meta.checkpoint_id} next_id={next_id}")
        self.stats["restored"] += meta is not None
        self.final_restore = meta is not None and meta.final
        # Channels: one in-memory link per (producer, consumer), both ends.
        links = {c.id: MemoryLink.pair() for c in self.topo.channels}
        self.tasks: dict[str, Task] = {}
        self.driver_ends: dict[str, DriverEnd] = {}
        for t, spec in self.topo.specs.items():
            chain = self.make_chain(t)
            replay: list[tuple[int, list[Any]]] = []
            finished = False
            if meta is not None:  # worker.py: restore, replay
                snap = self.storage.read_snapshot(meta.checkpoint_id, t, meta)
                for name, op in chain.all_operators():
                    if name in snap.states:
                        op.restore(snap.states[name])
                replay, finished = restore.replay(snap, chain.names, False), snap.finished
                if self.final_restore:
                    chain.notify_complete(meta.checkpoint_id)
                    self.committed.add(t)
            outputs = [Output(o, [OutputChannel(cid, links[cid][0]) for cid in o.channels], self.topo.keys[(t, port)], t)
                       for port, o in enumerate(spec.outputs)]
            inputs = {c.id: InputChannel(c.id, links[c.id][1], codec.FrameReader(), c.back_edge) for c in spec.inputs}
            control, self.driver_ends[t] = memory_control()
            # Latency markers interleave with records and barriers as in a real job (runtime/latency.py).
            options = TaskOptions(unaligned=self.mode == "unaligned", aligned_timeout=self.aligned_timeout,
                                  latency_interval=self.interval)
            self.tasks[t] = Task(spec, chain, outputs, inputs, control,
                                 InlineWriter(control, t, self.put(t), self.clock.perf_counter), options,
                                 replay=replay, restored_finished=finished, clock=self.clock)
        self.coord = CheckpointCoordinator(
            "sim", "fp", list(self.tasks), self.sources, self.storage, self.interval, self.timeout,
            self.max_in_flight, next_id, clock=lambda: self.now, loops=self.topo.loops, drain_interval=self.interval / 2,
            unaligned=self.mode == "unaligned", aligned_timeout=self.aligned_timeout)
        if self.final_restore:
            return
        for task in self.tasks.values():
            task.start()
        self.coord.start()

    def crash(self) -> None:
        self.crashes_left -= 1
        self.crashes += 1
        self.stats["aborted"] += len(self.coord.stats.aborted)
        victim = self.rng.choice([*self.tasks, "driver"])
        self.note(f"crash {victim}")
        self.start_attempt()

    # ---- the driver (executors/attempt_driver.py on_message) ----
    def on_driver_message(self, t: str, msg: messages.Message) -> None:
        """The coordinator's share routed as the engine's driver routes it (checkpoint/routing.py);
        the simulation's own side: its statistics and the oracle's checks."""
        routed = route(self.coord, msg)
        if routed is not None:
            if isinstance(msg, messages.Ack):
                assert routed.outcome is not None
                self.stats["logged"] += msg.logged
                self.stats["unaligned"] += msg.unaligned
                self.stats[routed.outcome.value] += 1
                if routed.outcome in (AckOutcome.UNKNOWN, AckOutcome.DUPLICATE):
                    raise SimFailure(f"ack of {t} for checkpoint {msg.checkpoint_id} was {routed.outcome.value}")
            if routed.completed is not None:
                oracle.check_checkpoint(self, routed.completed)
            self.send(routed.out)
        elif isinstance(msg, messages.Committed):
            self.committed.add(t)
        elif isinstance(msg, messages.Latency):
            self.stats["markers"] += 1

    # ---- the scheduler ----
    def can_deliver(self, task: Task, ch: InputChannel) -> bool:
        link = ch.wire
        assert isinstance(link, MemoryLink)
        return not task.stop and (bool(link.inbox) or ch.has_frames()) and task.may_take(ch)

    def enabled(self) -> list[tuple[str, str, str]]:
        ev = [("d", c.producer, c.consumer) for c in self.topo.channels
              if self.can_deliver(self.tasks[c.consumer], self.tasks[c.consumer].inputs[c.id])]
        ev += [("s", t, "") for t in self.sources
               if not (task := self.tasks[t]).finished and not task.stop and not task.paused]
        ev += [("c", t, "") for t, q in self.to_task.items() if q]
        ev += [("a", t, "") for t, end in self.driver_ends.items() if end.waiting()]
        return ev

    def tick(self, jump: bool) -> None:
        if jump:  # as the real driver: select() until the coordinator's deadline, at most 0.1 s
            self.idle += 1
            if self.idle > 1000:
                raise SimFailure("stuck: nothing in flight or to deliver, and polling does nothing")
            deadline = self.coord.deadline()
            self.clock.now = max(self.now, min(self.now + 0.1, deadline if deadline is not None else self.now + 0.1))
        else:
            self.idle = 0
            self.clock.now += 0.0 if self.rng.random() < 0.2 else self.rng.uniform(0.0, 0.5)
        out = self.coord.poll()
        self.note(f"tick {[(t, m) for t, m in out]}")
        self.send(out)
        for task in self.tasks.values():  # the task loop's own look at its clock
            if not task.stop:
                task.flush()
                task.check_aligned_timeout()

    def deliver(self, producer: str, consumer: str) -> None:
        """The consumer takes the channel's next frame (task_loop.py: fill, read ahead, take),
        and sometimes processes what it gathered (the end of a turn)."""
        task = self.tasks[consumer]
        ch = task.inputs[f"{producer}->{consumer}"]
        ch.fill_nowait()
        task.on_input_readable(ch)
        if task.take(ch):
            self.note(f"deliver {producer}->{consumer} records={ch.records}")
        if self.rng.random() < self.flush_p:
            task.flush()

    def step(self) -> None:
        ev = self.enabled()
        r = self.rng.random()
        if self.crashes_left > 0 and (r < self.crash_p or self.crash_next):
            self.crash_next = False
            self.crash()
        elif not ev or r < self.crash_p + self.tick_p:
            self.tick(jump=not ev)
        else:
            kind, a, b = self.rng.choices(ev, [self.weights[e] for e in ev])[0]
            if kind == "d":
                self.deliver(a, b)
            elif kind == "s":
                task = self.tasks[a]
                task.read_source()
                self.note(f"read {a} records={task.records_out} finished={task.finished}")
            elif kind == "c":
                task = self.tasks[a]
                msg = self.to_task[a].pop(0)
                self.note(f"control {a} {msg}")
                if not task.stop:
                    self.driver_ends[a].send(msg)  # encoded, framed and decoded as over a socket
                    for m in task.control.poll():
                        task.on_control(m)
            else:
                got = self.driver_ends[a].receive_one()
                assert got is not None
                self.note(f"driver {a} {got}")
                self.on_driver_message(a, got)

    def run(self) -> str:
        """Run to the end; returns the trace's digest. Raises SimFailure."""
        while len(self.committed) < len(self.tasks):
            self.steps += 1
            if self.steps > MAX_STEPS:
                raise SimFailure(f"no termination within {MAX_STEPS} steps")
            self.step()
        oracle.check_final(self)
        self.stats.update(crashes=self.crashes, completed=len(self.completed), steps=self.steps,
                          aborted=len(self.coord.stats.aborted))
        return self.digest.hexdigest()
