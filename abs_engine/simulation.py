"""Deterministic simulation of the checkpoint protocol (in the spirit of FoundationDB's).

The real sans-IO pieces -- CheckpointCoordinator, BarrierAligner, ChannelStateLog, the
snapshot format (msgpack, decoded with storage.decode_snapshot) and the storage's
latest_valid / prune / remove_orphans_after logic -- are driven by a scheduler seeded with
``random.Random(seed)``: no processes, sockets, threads, sleeps or wall clock, so the same
seed always gives the same trace. Run ``python3 -m abs_engine.simulation --seeds 100000``.

Model. Tasks mirror runtime/task.py (_on_frame, _snapshot, on_control, _maybe_finish,
EndLoop) and the driver mirrors executors/master.py (_on_message, the failover in
_attempts). Data channels are FIFO queues per (producer, consumer); control connections
are FIFO per task and direction. Each step the scheduler picks one enabled event: deliver
the head of a channel whose consumer may read it (not blocked by alignment, not held by the
back-edge log), let a source emit a batch (or end), deliver the head of a control
connection (which reorders messages of different tasks at random), advance the fake clock
and poll the coordinator, or crash (also, in some seeds, right after a checkpoint
completes, like chaos.on_checkpoint). Half the seeds weight channels and connections
unevenly (buggify: barriers overtake, checkpoints pile up, acks come late); each seed
also draws its input, batch sizes, checkpoint interval, timeout, max in flight, retained
checkpoints and up to 3 crashes. A crash is a global failover: everything in flight and
every task's memory is lost; the newest checkpoint latest_valid() returns is restored
(state, source offsets, back-edge logs replayed before new input), orphans are removed and
a new coordinator starts with the next id after those on disk. A sink's output (the
"file") survives crashes; the sink commits by two-phase commit like operators/files.py.

Invariants checked (a violation raises SimFailure; the CLI prints a reproduction line):
- at the end, the sink's committed output equals a batch computation of the same input, as
  a multiset (exactly once): for ``dag*`` every (key, running count) once; for ``cycle``
  every token once, leaving the loop with its initial amount;
- in every completed checkpoint: it has an acknowledgement of this attempt from every task
  and verifies in storage; ids complete in increasing order; the cut is consistent --
  dag: the counters' counts are exactly the records below the sources' offsets and the
  sink holds one record per count; cycle (conservation): money in the step tasks'
  balances + money of the records in back-edge logs == money of the records below the
  source's offset, and tokens logged + tokens staged or published by the sink == tokens
  emitted;
- the coordinator answers no acknowledgement UNKNOWN or DUPLICATE; a finished task gets no
  records; no record arrives on a back-edge after EndLoop (LoopNotQuiet);
- recovery restores the newest checkpoint ever completed;
- the run terminates (a step budget) and never gets stuck with nothing to do. When
  nothing is enabled the clock jumps to coordinator.deadline(), at most 0.1 s, as the
  real driver's select timeout does (deadline() is None once every task has finished
  although poll() would trigger the final checkpoint).

Simplifications versus the real runtime: a task is one operator (no chains); an operator
routes each output record to a port (the cycle's step task sends a record round the loop
or out to the sink), where the real engine broadcasts its chain's output to every edge; a
snapshot file is written and acknowledged at once (the real writer thread only delays the
ack, which the control queue's delay models); record batches are processed one frame at a
time (task.py gathers frames, which it keeps on the same side of every barrier), and
logged as they are processed (task.py reads an input ahead while a log waits on it, which
logs the same frames sooner: tests/abs_engine/runtime/test_channel_state.py covers it); unbounded
channels (task.py always reads back-edges, so bounded ones cannot deadlock); no
stop-the-world mode, no generation fencing (stale messages die with the crash), no
corrupt files. Storage (``--storage``): ``memory`` (default) is a CheckpointStorage
subclass holding files in dicts, with latest_valid inherited and verify, prune and
remove_orphans_after mirroring the real code -- chosen for speed (a real write_metadata
costs three fsyncs and prune a listdir per checkpoint; 1,000 seeds must run in seconds on
a loaded machine); ``disk`` uses the real CheckpointStorage in a temporary directory
(on /dev/shm when it exists).

Modes (``--mode``): ``aligned`` (ABS), ``unaligned`` (every task triggered at once,
snapshots at the trigger or the first barrier, logs every input until its barrier:
Chandy-Lamport), ``timeout`` (aligned, but a task whose alignment lasts longer than a
drawn aligned timeout snapshots unaligned; its barrier makes its consumers do the same).
In the unaligned modes the cut checks count channel state too: records in the logs of
every input, not only back-edges.

Deliberate bugs (``--bug``), to prove the oracle can fail: ``non-transactional-sink``
(appends at once, restores without truncating), ``no-replay`` (restored tasks forget
their back-edge logs), ``no-align`` (tasks read inputs blocked by alignment),
``no-channel-state`` (unaligned snapshots log back-edges only).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

from . import codec, messages
from .checkpoint.coordinator import CheckpointCoordinator
from .checkpoint.pending import AckOutcome
from .checkpoint.storage import CheckpointStorage, Metadata, decode_snapshot
from .errors import CheckpointError, CheckpointErrorReason
from .runtime.alignment import BarrierAligner, CollectingBarriers, Outcome
from .runtime.channel_state import ChannelStateLog, Session

TOPOLOGIES = ("dag", "cycle", "dag3")
BUGS = ("none", "non-transactional-sink", "no-replay", "no-align", "no-channel-state")
MODES = ("aligned", "unaligned", "timeout")
RECORDS, BARRIER, END = codec.FrameKind.RECORDS, codec.FrameKind.BARRIER, codec.FrameKind.END
MAX_STEPS = 20_000
Frame = tuple[int, Any]


class SimFailure(Exception):
    """An invariant of the protocol was violated."""


# ---- topologies as data -------------------------------------------------------------


Routes = dict[str, dict[int, tuple[tuple[str, ...], bool]]]


@dataclass(frozen=True)
class Topology:
    name: str
    kinds: dict[str, str]  #: task -> "source" | "counter" | "step" | "sink"
    routes: Routes  #: task -> port -> (consumers, back-edge)
    loops: dict[int, tuple[frozenset[str], frozenset[str]]]  #: as plan.loops(): (inside, feeders)

    @property
    def channels(self) -> list[tuple[str, str, bool]]:
        return [(t, c, back) for t, ports in self.routes.items() for cs, back in ports.values() for c in cs]


def build_topology(name: str) -> Topology:
    """dag/dag3: p sources -> hash exchange -> p keyed counters -> one sink. cycle: a source
    -> hash exchange -> two step tasks whose port 0 loops back (back-edges, hashed) and whose
    port 1 leaves the loop to a sink."""
    routes: Routes = {"sink": {}}
    if name in ("dag", "dag3"):
        p = 3 if name == "dag3" else 2
        srcs, cnts = [f"src{i}" for i in range(p)], tuple(f"count{i}" for i in range(p))
        kinds = {**{s: "source" for s in srcs}, **{c: "counter" for c in cnts}, "sink": "sink"}
        routes.update({s: {0: (cnts, False)} for s in srcs})
        routes.update({c: {0: (("sink",), False)} for c in cnts})
        return Topology(name, kinds, routes, {})
    if name == "cycle":
        steps = ("step0", "step1")
        kinds = {"src0": "source", "step0": "step", "step1": "step", "sink": "sink"}
        routes["src0"] = {0: (steps, False)}
        routes.update({s: {0: (steps, True), 1: (("sink",), False)} for s in steps})
        return Topology(name, kinds, routes, {0: (frozenset(steps), frozenset({"src0"}))})
    raise ValueError(f"unknown topology {name!r}")


# ---- operators: simple deterministic state, msgpack-encodable -------------------------

Out = list[tuple[int, int, Any]]  #: (port, key, record)


class Op:
    """An operator whose whole state is the msgpack-encodable dict ``self.state``."""

    def __init__(self, **state: Any) -> None:
        self.state: dict[str, Any] = state

    def process(self, rec: Any) -> Out:
        return []

    def snapshot(self, checkpoint_id: int) -> Any:
        return self.state  # encoded at once by the task

    def restore(self, state: Any) -> None:
        self.state = {k: dict(v) if isinstance(v, dict) else v for k, v in state.items()}

    def notify(self, checkpoint_id: int) -> None:
        pass


class SourceOp(Op):
    """Replayable input; the offset is the state. dag records are keys; cycle records are
    tokens (id, amount left, initial amount)."""

    def __init__(self, items: list[Any]):
        super().__init__(pos=0)
        self.items = items

    def read(self, n: int) -> list[Any]:
        pos = self.state["pos"]
        self.state["pos"] = min(pos + n, len(self.items))
        return self.items[pos : pos + n]


class CounterOp(Op):
    """Per-key running counts; emits (key, count so far) for every record."""

    def __init__(self) -> None:
        super().__init__(counts={})

    def process(self, rec: Any) -> Out:
        counts = self.state["counts"]
        counts[rec] = counts.get(rec, 0) + 1
        return [(0, 0, (rec, counts[rec]))]


class StepOp(Op):
    """A token (id, n, n0) pays one unit into the balance and goes round the loop with n-1;
    at n == 0 it leaves the loop (port 1) as (id, n0)."""

    def __init__(self) -> None:
        super().__init__(balance=0)

    def process(self, rec: Any) -> Out:
        rid, n, n0 = rec
        if n == 0:
            return [(1, 0, (rid, n0))]
        self.state["balance"] += 1
        return [(0, rid + n, (rid, n - 1, n0))]


class SinkOp(Op):
    """Two-phase commit like FileSink: staged per epoch in the snapshot, published on
    notify-complete; restore truncates the output to the committed length and publishes
    the pending epochs again."""

    def __init__(self, output: list[Any], transactional: bool = True):
        self.output, self.transactional = output, transactional
        self.buffer: list[Any] = []
        self.pending: list[tuple[int, tuple[Any, ...]]] = []
        self.published = 0

    def process(self, rec: Any) -> Out:
        if self.transactional:
            self.buffer.append(rec)
        else:  # the deliberate bug: at-least-once
            self.output.append(rec)
            self.published += 1
        return []

    def snapshot(self, checkpoint_id: int) -> Any:
        if self.buffer:
            self.pending.append((checkpoint_id, tuple(self.buffer)))
            self.buffer = []
        return {"published": self.published, "pending": list(self.pending)}

    def restore(self, state: Any) -> None:
        self.published = state["published"]
        # State decodes arrays as lists (codec.unpack_state); records are tuples.
        self.pending = [(int(e), tuple(tuple(r) if isinstance(r, list) else r for r in recs))
                        for e, recs in state["pending"]]
        if self.transactional:
            del self.output[self.published :]
            self._publish(None)

    def notify(self, checkpoint_id: int) -> None:
        self._publish(checkpoint_id)

    def _publish(self, upto: int | None) -> None:
        ready = [e for e in self.pending if upto is None or e[0] <= upto]
        self.pending = [e for e in self.pending if e not in ready]
        for _, recs in ready:
            self.output.extend(recs)
            self.published += len(recs)


# ---- storage --------------------------------------------------------------------------


class MemoryStorage(CheckpointStorage):
    """CheckpointStorage's contract, in memory (see the module docstring)."""

    def __init__(self, retain: int):
        super().__init__("/nonexistent/abs-sim", retain)
        self.files: dict[int, dict[str, bytes]] = {}
        self.metas: dict[int, Metadata] = {}

    def ids_on_disk(self) -> list[int]:
        return sorted(self.files)

    def completed_ids(self) -> list[int]:
        return [i for i in sorted(self.files) if i in self.metas]

    def write_metadata(self, meta: Metadata) -> str:
        self.files.setdefault(meta.checkpoint_id, {})
        self.metas[meta.checkpoint_id] = Metadata.from_dict(codec.unpack(codec.pack(meta.to_dict())))
        return self.dir_of(meta.checkpoint_id)

    def _remove(self, i: int) -> None:
        self.files.pop(i, None)
        self.metas.pop(i, None)

    def prune(self, protect: dict[int, set[str]] | None = None) -> list[int]:
        # The simulated tasks write full snapshots only: nothing is shared to protect.
        completed = self.completed_ids()
        keep, newest = set(completed[-self.retain :]), (completed[-1] if completed else 0)
        removed = [i for i in self.ids_on_disk() if i not in keep and i <= newest]
        for i in removed:
            self._remove(i)
        return removed

    def remove_orphans_after(self, checkpoint_id: int) -> list[int]:
        removed = [i for i in self.ids_on_disk() if i > checkpoint_id and i not in self.metas]
        for i in removed:
            self._remove(i)
        return removed

    def load_metadata(self, checkpoint_id: int) -> Metadata:
        if checkpoint_id not in self.metas:
            raise CheckpointError(CheckpointErrorReason.MISSING_METADATA, f"no metadata {checkpoint_id}", checkpoint_id)
        return self.metas[checkpoint_id]

    def verify(self, checkpoint_id: int) -> Metadata:
        meta = self.load_metadata(checkpoint_id)
        for task, e in meta.tasks.items():
            data = self.files[checkpoint_id].get(e.file)
            if data is None or len(data) != e.size or hashlib.sha256(data).hexdigest() != e.sha256:
                raise CheckpointError(CheckpointErrorReason.CHECKSUM_MISMATCH,
                                      f"checkpoint {checkpoint_id}: bad state file of {task}", checkpoint_id)
        return meta

    def write_file(self, checkpoint_id: int, name: str, blob: bytes) -> None:
        self.files.setdefault(checkpoint_id, {})[name] = blob

    def read_file(self, checkpoint_id: int, name: str) -> bytes:
        return self.files[checkpoint_id][name]


class DiskStorage(CheckpointStorage):
    """The real CheckpointStorage, plus the state-file writes the workers do."""

    def write_file(self, checkpoint_id: int, name: str, blob: bytes) -> None:
        d = self.dir_of(checkpoint_id)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, name), "wb") as f:
            f.write(blob)

    def read_file(self, checkpoint_id: int, name: str) -> bytes:
        with open(os.path.join(self.dir_of(checkpoint_id), name), "rb") as f:
            return f.read()


Storage = MemoryStorage | DiskStorage


# ---- a task, mirroring runtime/task.py ----------------------------------------------------


class SimTask:
    def __init__(self, sim: Sim, tid: str, op: Op):
        self.sim, self.id, self.op = sim, tid, op
        ins = [(f"{p}->{c}", back) for p, c, back in sim.topo.channels if c == tid]
        self.aligner = BarrierAligner(ch for ch, back in ins if not back)
        self.back = sorted(ch for ch, back in ins if back)
        self.backlog = ChannelStateLog(self.back, [ch for ch, back in ins if not back])
        self.blocked_since: float | None = None
        self.is_source = isinstance(op, SourceOp)
        self.ended: set[str] = set()
        self.finished = self.inputs_ended = self.loop_ended = self.stopped = False
        self.last_snapshot = 0

    def can_read(self, ch: str, back: bool) -> bool:
        if self.stopped or ch in self.ended:
            return False
        if back:
            return not self.backlog.is_held(ch)
        return self.sim.bug == "no-align" or not self.aligner.is_blocked(ch)

    def emit(self, outs: Out) -> None:
        routes = self.sim.topo.routes[self.id]
        per: dict[str, list[Any]] = {}
        for port, key, rec in outs:
            consumers = routes[port][0]
            per.setdefault(consumers[key % len(consumers)], []).append(rec)
        for c, batch in per.items():
            self.sim.push(self.id, c, (RECORDS, tuple(batch)))

    def process(self, batch: Any) -> None:
        if self.finished:
            raise SimFailure(f"task {self.id} got records after it finished")
        outs: Out = []
        for rec in batch:
            outs += self.op.process(rec)
        self.emit(outs)

    def broadcast(self, frame: Frame) -> None:
        for p, c, _ in self.sim.topo.channels:
            if p == self.id:
                self.sim.push(p, c, frame)

    def on_frame(self, ch: str, back: bool, frame: Frame) -> None:
        kind, payload = frame
        if kind == RECORDS:
            if back and self.loop_ended:
                raise SimFailure(f"LoopNotQuiet: records on back-edge {ch} after EndLoop")
            self.backlog.on_records(ch, codec.pack(list(payload)))
            self.process(payload)
        elif kind == BARRIER:
            cid, unaligned = codec.parse_barrier(payload)
            if back and self.loop_ended:
                return
            if unaligned and cid > self.last_snapshot:
                self.trigger_unaligned(cid, {ch})
                return
            if back or cid <= self.last_snapshot:
                for s in self.backlog.on_barrier(ch, cid).completed:
                    self.write(s)
                return
            d = self.aligner.on_barrier(ch, cid)
            if d.outcome is Outcome.ABORTED_AND_BLOCKED:
                self.blocked_since = None
            if d.outcome in (Outcome.BLOCKED, Outcome.ABORTED_AND_BLOCKED) and self.blocked_since is None:
                self.blocked_since = self.sim.now
            if d.outcome is Outcome.TRIGGERED:
                self.snapshot(cid)
        else:
            self.ended.add(ch)
            for s in self.backlog.on_end_of_stream(ch).completed:
                self.write(s)
            if not back:
                d = self.aligner.on_end_of_stream(ch)
                if d.outcome is Outcome.TRIGGERED and d.checkpoint_id is not None:
                    self.snapshot(d.checkpoint_id)
            self.maybe_finish()

    def snapshot(self, checkpoint_id: int, unaligned: bool = False, arrived: set[str] | None = None) -> None:
        self.last_snapshot = checkpoint_id
        self.blocked_since = None
        states = {self.id: codec.pack(self.op.snapshot(checkpoint_id))}
        if not self.finished:
            self.broadcast((BARRIER, codec.barrier_payload(checkpoint_id, unaligned)))
        log_all = unaligned and self.sim.bug != "no-channel-state"
        step = self.backlog.start(checkpoint_id, (states, self.finished), log_all, arrived or ())
        for s in step.completed:
            self.write(s)

    def trigger_unaligned(self, checkpoint_id: int, arrived: set[str]) -> None:
        """As Task._trigger_unaligned: abandon an alignment, its collected inputs arrived."""
        st = self.aligner.state
        if isinstance(st, CollectingBarriers) and st.checkpoint_id == checkpoint_id:
            arrived = arrived | set(st.arrived)
        self.aligner.abandon(checkpoint_id)
        self.sim.stats["unaligned"] += 1
        self.snapshot(checkpoint_id, unaligned=True, arrived=arrived)

    def check_timeout(self) -> None:
        st = self.aligner.state
        timeout = self.sim.aligned_timeout
        if (timeout is not None and self.blocked_since is not None and isinstance(st, CollectingBarriers)
                and self.sim.now - self.blocked_since >= timeout and not self.stopped):
            self.trigger_unaligned(st.checkpoint_id, set())

    def write(self, s: Session) -> None:
        states, finished = s.payload
        logs = {ch: codec.join_arrays(s.logs[ch]) if s.logs[ch] else codec.pack([]) for ch in sorted(s.logs)}
        blob = codec.pack({"task": self.id, "checkpoint_id": s.checkpoint_id, "operators": states,
                           "logs": logs, "finished": finished})
        name = f"{self.id}.state"
        self.sim.storage.write_file(s.checkpoint_id, name, blob)
        self.sim.acks_sent.add((s.checkpoint_id, self.id))
        self.sim.to_driver[self.id].append(messages.Ack(
            s.checkpoint_id, self.id, name, len(blob), hashlib.sha256(blob).hexdigest(), 0.0, s.logged, finished,
            unaligned=s.unaligned, inflight_bytes=s.logged_bytes))

    def on_control(self, msg: messages.Message) -> None:
        if isinstance(msg, messages.Trigger):
            if msg.checkpoint_id <= self.last_snapshot:
                return
            if self.is_source or self.finished or self.inputs_ended:
                self.snapshot(msg.checkpoint_id, unaligned=msg.unaligned)
            elif msg.unaligned:
                self.trigger_unaligned(msg.checkpoint_id, set())
        elif isinstance(msg, messages.NotifyComplete):
            self.op.notify(msg.checkpoint_id)
            if msg.final:
                self.sim.to_driver[self.id].append(messages.Committed(self.id))
                self.stopped = True
        elif isinstance(msg, messages.EndLoop):
            if not self.loop_ended:
                self.loop_ended = True
                for c in self.back:
                    if c not in self.ended:
                        for s in self.backlog.on_end_of_stream(c).completed:
                            self.write(s)
                self.maybe_finish()

    def maybe_finish(self) -> None:
        if self.finished or not self.aligner.all_ended:
            return
        if self.back and not self.loop_ended and any(c not in self.ended for c in self.back):
            if not self.inputs_ended:
                self.inputs_ended = True
                self.sim.to_driver[self.id].append(messages.InputsEnded(self.id))
            return
        self.end_outputs()

    def end_outputs(self) -> None:
        self.broadcast((END, None))
        self.finished = True
        self.sim.to_driver[self.id].append(messages.Finished(self.id, 0, 0))


# ---- the simulation ----------------------------------------------------------------------


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
        # Half the seeds favour some channels and connections and starve others ("buggify"):
        # barriers overtake, checkpoints pile up, acks come late.
        skew = (0.05, 1.0, 1.0, 8.0) if rng.random() < 0.5 else (1.0,)
        keys = [("d", p, c) for p, c, _ in self.topo.channels] + [
            (k, t, "") for t in self.topo.kinds for k in "sca"]
        self.weights = {k: rng.choice(skew) for k in keys}
        self.crash_next = False
        self.storage: Storage = MemoryStorage(retain) if storage == "memory" else DiskStorage(root or "", retain)
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
        self.now = 0.0
        self.steps = self.crashes = self.idle = 0
        self.stats: Counter[str] = Counter()  #: what the run exercised (tests check it is not trivial)
        self.start_attempt()

    # ---- plumbing ----
    def note(self, event: str) -> None:
        self.digest.update(event.encode())
        if self.trace is not None:
            self.trace.append(f"{self.steps} t={self.now:.3f} {event}")

    def push(self, producer: str, consumer: str, frame: Frame) -> None:
        self.chans[(producer, consumer)].append(frame)

    def send(self, out: list[tuple[str, messages.Message]]) -> None:
        for t, m in out:
            self.to_task[t].append(m)

    def make_op(self, tid: str) -> Op:
        kind = self.topo.kinds[tid]
        if kind == "source":
            return SourceOp(self.inputs[tid])
        if kind == "counter":
            return CounterOp()
        if kind == "step":
            return StepOp()
        return SinkOp(self.output, transactional=self.bug != "non-transactional-sink")

    # ---- attempts and failover (executors/master.py: _attempts, worker.py: restore) ----
    def start_attempt(self) -> None:
        self.chans: dict[tuple[str, str], deque[Frame]] = {(p, c): deque() for p, c, _ in self.topo.channels}
        self.back_of = {(p, c): back for p, c, back in self.topo.channels}
        self.to_task: dict[str, deque[messages.Message]] = {t: deque() for t in self.topo.kinds}
        self.to_driver: dict[str, deque[messages.Message]] = {t: deque() for t in self.topo.kinds}
        self.acks_sent: set[tuple[int, str]] = set()
        self.committed: set[str] = set()
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
        self.tasks = {t: SimTask(self, t, self.make_op(t)) for t in self.topo.kinds}
        self.final_restore = meta is not None and meta.final
        replays: dict[str, list[Any]] = {}
        finished: set[str] = set()
        if meta is not None:
            for t, task in self.tasks.items():
                blob = self.storage.read_file(meta.checkpoint_id, meta.tasks[t].file)
                snap = decode_snapshot(blob, t)
                task.op.restore(snap.states[t])
                replays[t] = [r for recs in snap.logs.values() for r in recs]
                if snap.finished:
                    finished.add(t)
                if self.final_restore:
                    task.op.notify(meta.checkpoint_id)
                    self.committed.add(t)
        self.coord = CheckpointCoordinator(
            "sim", "fp", list(self.tasks), self.sources, self.storage, self.interval, self.timeout,
            self.max_in_flight, next_id, clock=lambda: self.now, loops=self.topo.loops, drain_interval=self.interval / 2,
            unaligned=self.mode == "unaligned", aligned_timeout=self.aligned_timeout)
        if self.final_restore:
            return
        for t, task in self.tasks.items():  # Task.run: end of stream if restored finished, then replay
            if t in finished:
                task.end_outputs()
            if replays.get(t) and self.bug != "no-replay":
                task.process(replays[t])
        self.coord.start()

    def crash(self) -> None:
        self.crashes_left -= 1
        self.crashes += 1
        self.stats["aborted"] += len(self.coord.stats.aborted)
        victim = self.rng.choice([*self.tasks, "driver"])
        self.note(f"crash {victim}")
        self.start_attempt()

    # ---- the driver (executors/master.py _on_message) ----
    def on_driver_message(self, t: str, msg: messages.Message) -> None:
        if isinstance(msg, messages.Ack):
            self.stats["logged"] += msg.logged
            outcome, meta = self.coord.on_ack(msg)
            self.stats[outcome.value] += 1
            if outcome in (AckOutcome.UNKNOWN, AckOutcome.DUPLICATE):
                raise SimFailure(f"ack of {t} for checkpoint {msg.checkpoint_id} was {outcome.value}")
            if meta is not None:
                self.check_checkpoint(meta)
                self.send(self.coord.notifications(meta))
                if self.coord.just_drained:
                    self.send(self.coord.end_loop_messages(self.coord.just_drained))
        elif isinstance(msg, messages.Finished):
            self.send(self.coord.on_finished(t))
        elif isinstance(msg, messages.InputsEnded):
            self.send(self.coord.on_inputs_ended(t))
        elif isinstance(msg, messages.Committed):
            self.committed.add(t)

    # ---- the oracle ----
    def check_checkpoint(self, meta: Metadata) -> None:
        cid = meta.checkpoint_id
        missing = sorted(set(self.tasks) - set(meta.tasks))
        unsent = sorted(t for t in meta.tasks if (cid, t) not in self.acks_sent)
        if missing or unsent:
            raise SimFailure(f"checkpoint {cid} completed without acks of {missing + unsent}")
        if self.completed and cid <= max(self.completed):
            raise SimFailure(f"checkpoint {cid} completed after checkpoint {max(self.completed)}")
        self.storage.verify(cid)
        self.completed.append(cid)
        self.note(f"completed {cid} final={meta.final}")
        self.crash_next = self.rng.random() < self.crash_after_complete
        # Channel state: what each task logged (back-edges; every input when unaligned).
        states: dict[str, Any] = {}
        logged: dict[str, list[Any]] = {}
        for t, e in meta.tasks.items():
            snap = decode_snapshot(self.storage.read_file(cid, e.file), t)
            states[t] = snap.states[t]
            logged[t] = [r for recs in snap.logs.values() for r in recs]
        self.stats["channel_state"] += sum(len(v) for t, v in logged.items() if t == "sink" or
                                           self.topo.kinds[t] == "counter")
        sink = states["sink"]
        staged = sink["published"] + sum(len(recs) for _, recs in sink["pending"])
        emitted = {s: self.inputs[s][: states[s]["pos"]] for s in self.sources}
        if self.topo.name == "cycle":
            money = sum(n0 for recs in emitted.values() for _, _, n0 in recs)
            held = sum(states[t]["balance"] for t, k in self.topo.kinds.items() if k == "step")
            in_loop = [r for t, k in self.topo.kinds.items() if k == "step" for r in logged[t]]
            in_flight = sum(n for _, n, _ in in_loop)
            if held + in_flight != money:
                raise SimFailure(f"checkpoint {cid} breaks conservation: balances {held} + logged {in_flight} "
                                 f"!= emitted {money}")
            tokens = sum(len(recs) for recs in emitted.values())
            if len(in_loop) + len(logged["sink"]) + staged != tokens:
                raise SimFailure(f"checkpoint {cid}: {len(in_loop)} tokens logged in the loop + "
                                 f"{len(logged['sink'])} logged into the sink + {staged} in the sink != {tokens} emitted")
        else:
            expected = Counter(k for recs in emitted.values() for k in recs)
            counts: Counter[int] = Counter()
            for t, k in self.topo.kinds.items():
                if k == "counter":
                    counts.update(states[t]["counts"])
                    counts.update(logged[t])  # keys in flight into the counter
            if counts != expected:
                raise SimFailure(f"checkpoint {cid} is not a consistent cut: counters + their channel state "
                                 f"{dict(counts)} != records below the offsets {dict(expected)}")
            counted = sum(counts.values()) - sum(len(logged[t]) for t, k in self.topo.kinds.items() if k == "counter")
            if staged + len(logged["sink"]) != counted:
                raise SimFailure(f"checkpoint {cid}: sink holds {staged} records and {len(logged['sink'])} in "
                                 f"flight to it, counters counted {counted}")

    def expected_output(self) -> Counter[Any]:
        if self.topo.name == "cycle":
            return Counter((rid, n0) for recs in self.inputs.values() for rid, _, n0 in recs)
        totals = Counter(k for recs in self.inputs.values() for k in recs)
        return Counter((k, i) for k, n in totals.items() for i in range(1, n + 1))

    def check_final(self) -> None:
        if not self.completed or not self.storage.load_metadata(max(self.completed)).final:
            raise SimFailure("the job ended without a completed final checkpoint")
        got, want = Counter(self.output), self.expected_output()
        if got != want:
            raise SimFailure(f"sink output is not exactly once: missing {dict(want - got)}, "
                             f"duplicated or extra {dict(got - want)}")

    # ---- the scheduler ----
    def enabled(self) -> list[tuple[str, str, str]]:
        ev = [("d", p, c) for (p, c), q in self.chans.items()
              if q and self.tasks[c].can_read(f"{p}->{c}", self.back_of[(p, c)])]
        ev += [("s", t, "") for t in self.sources if not self.tasks[t].finished and not self.tasks[t].stopped]
        ev += [("c", t, "") for t, q in self.to_task.items() if q]
        ev += [("a", t, "") for t, q in self.to_driver.items() if q]
        return ev

    def tick(self, jump: bool) -> None:
        if jump:  # as the real driver: select() until the coordinator's deadline, at most 0.1 s
            self.idle += 1
            if self.idle > 1000:
                raise SimFailure("stuck: nothing in flight or to deliver, and polling does nothing")
            deadline = self.coord.deadline()
            self.now = max(self.now, min(self.now + 0.1, deadline if deadline is not None else self.now + 0.1))
        else:
            self.idle = 0
            self.now += 0.0 if self.rng.random() < 0.2 else self.rng.uniform(0.0, 0.5)
        out = self.coord.poll()
        self.note(f"tick {[(t, m) for t, m in out]}")
        self.send(out)
        for task in self.tasks.values():  # Task._check_aligned_timeout, on its own clock
            task.check_timeout()

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
            task = self.tasks[a if kind != "d" else b]
            if kind == "d":
                frame = self.chans[(a, b)].popleft()
                self.note(f"deliver {a}->{b} {frame}")
                task.on_frame(f"{a}->{b}", self.back_of[(a, b)], frame)
            elif kind == "s":
                assert isinstance(task.op, SourceOp)
                src = task.op
                if src.state["pos"] >= len(src.items):
                    self.note(f"end {a}")
                    task.end_outputs()
                else:
                    batch = src.read(self.rng.randint(1, self.batch))
                    self.note(f"emit {a} {batch}")
                    task.emit([(0, r if isinstance(r, int) else r[0], r) for r in batch])
            elif kind == "c":
                msg = self.to_task[a].popleft()
                self.note(f"control {a} {msg}")
                if not task.stopped:
                    task.on_control(msg)
            else:
                msg = self.to_driver[a].popleft()
                self.note(f"driver {a} {msg}")
                self.on_driver_message(a, msg)

    def run(self) -> str:
        """Run to the end; returns the trace's digest. Raises SimFailure."""
        while len(self.committed) < len(self.tasks):
            self.steps += 1
            if self.steps > MAX_STEPS:
                raise SimFailure(f"no termination within {MAX_STEPS} steps")
            self.step()
        self.check_final()
        self.stats.update(crashes=self.crashes, completed=len(self.completed), steps=self.steps,
                          aborted=len(self.coord.stats.aborted))
        return self.digest.hexdigest()


# ---- running seeds -----------------------------------------------------------------------


def topology_for(seed: int, topology: str) -> str:
    return TOPOLOGIES[seed % len(TOPOLOGIES)] if topology == "all" else topology


def reproduction(seed: int, topology: str, bug: str = "none", storage: str = "memory", mode: str = "aligned") -> str:
    extra = (f" --bug {bug}" if bug != "none" else "") + (f" --storage {storage}" if storage != "memory" else "")
    extra += f" --mode {mode}" if mode != "aligned" else ""
    return f"python3 -m abs_engine.simulation --seed {seed} --topology {topology}{extra}"


def run_seed(seed: int, topology: str, bug: str = "none", storage: str = "memory",
             trace: list[str] | None = None, mode: str = "aligned") -> str | None:
    """None if every invariant held, else what went wrong (an exception from the protocol
    code counts as a failure too)."""
    root = None
    if storage == "disk":
        root = tempfile.mkdtemp(prefix="abs-sim-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    sim: Sim | None = None
    try:
        sim = Sim(seed, topology, bug, storage, root, trace=trace is not None, mode=mode)
        sim.run()
        return None
    except SimFailure as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - a crash of the code under test is a finding
        return f"{type(e).__name__}: {e}"
    finally:
        if trace is not None and sim is not None and sim.trace is not None:
            trace.extend(sim.trace)
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m abs_engine.simulation", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=1000, help="how many seeds to run")
    ap.add_argument("--start", type=int, default=0, help="the first seed")
    ap.add_argument("--seed", type=int, help="run this one seed (overrides --seeds/--start)")
    ap.add_argument("--topology", choices=("all", *TOPOLOGIES), default="all",
                    help="all: seed s runs TOPOLOGIES[s %% 3]")
    ap.add_argument("--bug", choices=BUGS, default="none", help="inject a deliberate bug")
    ap.add_argument("--storage", choices=("memory", "disk"), default="memory")
    ap.add_argument("--mode", choices=MODES, default="aligned", help="how checkpoints are taken")
    ap.add_argument("--trace", action="store_true", help="print the event log (with --seed)")
    ap.add_argument("--progress-every", type=int, default=5000)
    args = ap.parse_args(argv)
    seeds = range(args.seed, args.seed + 1) if args.seed is not None else range(args.start, args.start + args.seeds)
    failed = 0
    started = time.perf_counter()
    for i, seed in enumerate(seeds, 1):
        topo = topology_for(seed, args.topology)
        trace: list[str] | None = [] if args.trace else None
        err = run_seed(seed, topo, args.bug, args.storage, trace, args.mode)
        if trace:
            print("\n".join(trace))
        if err is not None:
            failed += 1
            print(f"FAILED seed={seed} topology={topo}: {err}; reproduce: "
                  f"{reproduction(seed, topo, args.bug, args.storage, args.mode)}", flush=True)
        if i % args.progress_every == 0 or i == len(seeds):
            rate = i / max(time.perf_counter() - started, 1e-9)
            print(f"{i}/{len(seeds)} seeds, {failed} failed ({rate:.0f} seeds/s)", file=sys.stderr, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
