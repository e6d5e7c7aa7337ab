"""The checkpoint coordinator (lives in the driver). Sans-IO: it returns the messages to
send and the checkpoints it completed; the executor does the sending.

Protocol:
- every ``interval`` seconds (with at most ``max_in_flight`` pending) it triggers checkpoint
  n at the *source* tasks, which snapshot their offsets and inject barrier n;
- a task that has finished (end of stream on all inputs) receives no barriers any more, so
  the coordinator triggers it directly; its state can no longer change, so that is exact;
- when every task has acknowledged n, the metadata is written (the commit point), older
  pending checkpoints are subsumed, and every task is notified;
- a checkpoint older than ``timeout`` is aborted; late acknowledgements are then DISCARDED;
- once every task has finished, one more checkpoint, the *final* one, is taken; when it
  completes the job commits and ends;
- unaligned mode (Chandy-Lamport): checkpoint n is triggered at *every* task at once; each
  snapshots on the trigger or its first barrier n, whichever comes first, and logs what
  arrives on each input before barrier n (runtime/channel_state.py). Savepoints stay
  aligned (as Flink's): self-contained, no channel state to re-route when rescaled;
- stop-the-world mode (the baseline ABS is measured against): instead of barriers, the
  sources are paused, waves of counts prove nothing is in flight (quiescence.py), every
  task snapshots, and the sources resume once the checkpoint is durable.

Loops (termination by snapshot, after Chandy and Lamport): a loop cannot end by end of
stream, since its back-edges never end on their own. Quiescence is a stable property, so a
*completed* checkpoint in which every task that feeds loop L had already finished and every
back-edge log of L's tasks is empty proves no record is in flight in L and none can enter
it: L has drained, and the executor tells L's tasks to end their back-edges. Loops are
judged one by one, so a loop fed by another ends after it. Once a loop's feeders have
finished, checkpoints are taken every ``drain_interval`` to detect this (in every mode,
since it is how loops end).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import messages
from .incremental import ChainRef
from .pending import AckOutcome, PendingCheckpoint, TaskSnapshot
from .stop_the_world import StopTheWorld
from .metadata import FileRef, Metadata
from .storage import CheckpointStorage


KEEP_STATS = 1000  #: the stats lists keep at least this many recent entries (bounded memory)


@dataclass
class CoordinatorStats:
    completed: list[Metadata] = field(default_factory=list)
    aborted: list[int] = field(default_factory=list)
    outcomes: dict[AckOutcome, int] = field(default_factory=dict)

    @staticmethod
    def trim(items: list[Any]) -> None:
        if len(items) >= 2 * KEEP_STATS:
            del items[:-KEEP_STATS]


class CheckpointCoordinator:
    def __init__(
        self,
        job: str,
        fingerprint: str,
        tasks: list[str],
        source_tasks: list[str],
        storage: CheckpointStorage,
        interval: float | None,
        timeout: float,
        max_in_flight: int = 1,
        next_id: int = 1,
        clock: Callable[[], float] = time.monotonic,
        loops: dict[int, tuple[frozenset[str], frozenset[str]]] | None = None,
        drain_interval: float = 0.1,
        stop_the_world: bool = False,
        unaligned: bool = False,
        aligned_timeout: float | None = None,
        channels: frozenset[str] = frozenset(),
        wave_interval: float = 0.002,
        job_id: str = "",
        layout: dict[str, Any] | None = None,
    ):
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        self.job = job
        self.job_id = job_id
        self.layout = layout or {}  #: the plan's layout, recorded in every checkpoint's metadata
        self.fingerprint = fingerprint
        self.tasks = frozenset(tasks)
        self.source_tasks = list(source_tasks)
        self.storage = storage
        self.interval = interval
        self.timeout = timeout
        self.max_in_flight = max_in_flight
        self.next_id = next_id
        self.first_id = next_id
        self.clock = clock
        self.loops = loops or {}  #: loop id -> (its tasks, tasks feeding it)
        self.drain_interval = drain_interval
        self.drained: dict[int, int] = {}  #: loop id -> the checkpoint that proved it drained
        self.just_drained: list[int] = []  #: loops proven drained by the last completion
        self.next_drain_at: float | None = None
        self.pending: dict[int, PendingCheckpoint] = {}
        self.finished: set[str] = set()
        self.direct: set[str] = set()  #: triggered directly: finished, or regular inputs ended
        self.stop_the_world = stop_the_world
        self.unaligned = unaligned
        #: An aligned checkpoint still pending this long after its trigger turns unaligned:
        #: every task that has not acknowledged it is triggered unaligned (its barrier may
        #: sit behind queued data where no task can see it, so a task's own timer is not enough).
        self.aligned_timeout = aligned_timeout
        self.escalated: set[int] = set()
        self.modes: dict[int, str] = {}  #: checkpoint id -> how it was triggered (pending ones)
        #: checkpoint id -> wall time of its trigger (pending ones), for start delays:
        #: a task's first barrier minus this (Flink's checkpoint start delay).
        self.triggered_at: dict[int, float] = {}
        self.stw = StopTheWorld(self.tasks, self.source_tasks, channels, wave_interval, clock)
        #: Checkpoints that expired, with the tasks that had not acknowledged them; the
        #: executor drains this list (it reports them and counts consecutive failures).
        self.expired: list[tuple[int, tuple[str, ...]]] = []
        self.final_completed: Metadata | None = None
        self.stats = CoordinatorStats()
        self.next_trigger_at: float | None = None
        #: A savepoint was asked for: the next checkpoint triggered is it (savepoint_id).
        self.savepoint_requested = False
        self.savepoint_id: int | None = None
        #: Stopping with a savepoint: no checkpoint is triggered after it.
        self.stopping = False
        #: Incremental checkpoints: this attempt's completed checkpoints that tasks may still
        #: build on, and per task the newest completion it had been told of at its last
        #: snapshot (it never builds on an older one again; absent: it writes no deltas).
        self.buildable: dict[int, Metadata] = {}
        self.known: dict[str, int] = {}

    def request_savepoint(self, stop: bool) -> None:
        """Take a checkpoint now (whatever the interval) and mark it as the savepoint; with
        ``stop``, none after it. A request while one is open joins it."""
        if self.savepoint_id is None:
            self.savepoint_requested = True
            self.next_trigger_at = self.clock()
        self.stopping = self.stopping or stop

    def start(self) -> None:
        if self.interval is not None:
            self.next_trigger_at = self.clock() + self.interval

    @property
    def all_finished(self) -> bool:
        return self.finished >= self.tasks

    @property
    def draining(self) -> bool:
        """Some loop is not yet proven drained and nothing can enter it any more."""
        return any(lid not in self.drained and self.finished >= feeders
                   for lid, (_, feeders) in self.loops.items())

    def deadline(self) -> float | None:
        """When poll() next has something to do (None: only on messages)."""
        times = [p.started + self.timeout for p in self.pending.values()]
        if self.aligned_timeout is not None:
            times += [p.started + self.aligned_timeout for cid, p in self.pending.items() if self._escalates(cid, p)]
        if self.stw.next_wave_at is not None:
            times.append(self.stw.next_wave_at)
        # A due trigger is only actionable below the in-flight limit (else: busy loop).
        if len(self.pending) < self.max_in_flight and not self.all_finished:
            if self.next_trigger_at is not None:
                times.append(self.next_trigger_at)
            if self.draining:
                times.append(self.next_drain_at if self.next_drain_at is not None else self.clock())
        return min(times) if times else None

    def poll(self) -> list[tuple[str, messages.Message]]:
        """Abort timed-out checkpoints; trigger a checkpoint if one is due."""
        now = self.clock()
        out: list[tuple[str, messages.Message]] = []
        for cid, p in list(self.pending.items()):
            if now - p.started > self.timeout:
                self._abort(cid)
                self.expired.append((cid, tuple(sorted(p.missing))))
                out += self.stw.end(cid)  # never leave the sources paused
        if self.aligned_timeout is not None:
            for cid, p in sorted(self.pending.items()):
                if self._escalates(cid, p) and now - p.started >= self.aligned_timeout:
                    self.escalated.add(cid)
                    targets = sorted(self.tasks - set(p.acks))
                    p.triggered_directly |= set(targets)
                    out += [(t, messages.Trigger(cid, True)) for t in targets]
        out += self.stw.due(now)
        if (self.final_completed is not None or len(self.pending) >= self.max_in_flight
                or (self.stopping and self.savepoint_id is not None)):
            return out
        if self.all_finished:
            if not any(p.final for p in self.pending.values()):
                out += self._trigger(now, final=True)
        elif (self.next_trigger_at is not None and now >= self.next_trigger_at) or (
            self.draining and (self.next_drain_at is None or now >= self.next_drain_at)
        ):
            out += self._trigger(now, final=False)
            if self.next_trigger_at is not None:
                self.next_trigger_at = now + (self.interval or 0)
            self.next_drain_at = now + self.drain_interval
        return out

    def _trigger(self, now: float, final: bool) -> list[tuple[str, messages.Message]]:
        cid = self.next_id
        self.next_id += 1
        if self.savepoint_requested:
            self.savepoint_requested, self.savepoint_id = False, cid
            if self.interval is None:
                self.next_trigger_at = None  # no periodic checkpoints: this one was asked for
        p = PendingCheckpoint(cid, now, self.tasks, final=final)
        self.pending[cid] = p
        self.triggered_at[cid] = time.time()
        if self.stop_the_world and not final:
            self.modes[cid] = "stop-the-world"
            p.stop_the_world = True
            return self.stw.begin(cid)
        unaligned = self.unaligned and cid != self.savepoint_id
        self.modes[cid] = "savepoint" if cid == self.savepoint_id else "unaligned" if unaligned else "aligned"
        targets = set(self.tasks) if unaligned else set(self.source_tasks) | self.direct
        p.triggered_directly |= targets
        return [(t, messages.Trigger(cid, unaligned)) for t in sorted(targets)]

    def _escalates(self, cid: int, p: PendingCheckpoint) -> bool:
        """Whether pending checkpoint ``cid`` is one the aligned timeout may still turn
        unaligned (aligned, not a savepoint, not turned yet)."""
        return (cid not in self.escalated and not p.stop_the_world and not p.final
                and self.modes.get(cid) == "aligned")

    def mode_of(self, checkpoint_id: int) -> str:
        """How a checkpoint this coordinator triggered was taken (for its statistics); asked
        once, when it completed (older entries go: aborted or subsumed)."""
        mode = self.modes.get(checkpoint_id, "aligned")
        for cid in [c for c in self.modes if c <= checkpoint_id]:
            del self.modes[cid]
        for cid in [c for c in self.triggered_at if c <= checkpoint_id]:
            del self.triggered_at[cid]
        self.escalated = {c for c in self.escalated if c > checkpoint_id}
        return mode

    def on_finished(self, task: str) -> list[tuple[str, messages.Message]]:
        """A task saw end of stream on every input: trigger it directly from now on."""
        self.finished.add(task)
        return self.on_inputs_ended(task)

    def on_inputs_ended(self, task: str) -> list[tuple[str, messages.Message]]:
        """No barrier can reach this task any more (its regular inputs ended): trigger it
        directly, now for the pending checkpoints it has not snapshotted, and from now on."""
        self.direct.add(task)
        out: list[tuple[str, messages.Message]] = []
        for cid, p in sorted(self.pending.items()):
            if p.stop_the_world:
                continue  # every task gets a Snapshot once the counts prove quiescence
            if task not in p.acks and task not in p.triggered_directly:
                p.triggered_directly.add(task)
                out.append((task, messages.Trigger(cid)))
        return out

    def restart_tasks(self, tasks: frozenset[str]) -> list[int]:
        """``tasks`` (a failover region, executors/regions.py) restart from the newest
        completed checkpoint while the others run on: every pending checkpoint is aborted
        (they will never acknowledge it), and nothing they said of themselves (finished,
        inputs ended) holds any more. Returns the aborted ids."""
        aborted = sorted(self.pending)
        for cid in aborted:
            self._abort(cid)
        self.finished -= tasks
        self.direct -= tasks
        for t in tasks:
            self.known.pop(t, None)
        return aborted

    def _abort(self, cid: int) -> None:
        """Pending checkpoint ``cid`` will never complete: dropped, counted as aborted. If it
        was the savepoint, the next checkpoint is (now): a savepoint asked for is taken,
        whatever aborted the first try (a timeout, a region restart)."""
        self.pending.pop(cid).discard()
        self.stats.aborted.append(cid)
        self.stats.trim(self.stats.aborted)
        if cid == self.savepoint_id:
            self.savepoint_id, self.savepoint_requested, self.next_trigger_at = None, True, self.clock()

    def on_counts(self, msg: messages.Counts) -> list[tuple[str, messages.Message]]:
        """One task's answer to a counting wave (stop-the-world)."""
        return self.stw.on_counts(msg)

    def on_ack(self, ack: messages.Ack) -> tuple[AckOutcome, Metadata | None]:
        """Record an acknowledgement; returns the outcome and the checkpoint it completed."""
        p = self.pending.get(ack.checkpoint_id)
        if p is None:
            # Every id this coordinator triggered that is no longer pending was completed,
            # aborted or subsumed.
            closed = isinstance(ack.checkpoint_id, int) and self.first_id <= ack.checkpoint_id < self.next_id
            outcome = AckOutcome.DISCARDED if closed else AckOutcome.UNKNOWN
        else:
            outcome = p.acknowledge(
                ack.task, TaskSnapshot(ack.file, ack.size, ack.sha256, ack.alignment_ms, ack.logged, ack.finished,
                                       ack.base, ack.known, ack.channel_state)
            )
        if ack.task in self.tasks and ack.known is not None:
            self.known[ack.task] = max(self.known.get(ack.task, 0), ack.known)
        self.stats.outcomes[outcome] = self.stats.outcomes.get(outcome, 0) + 1
        if p is None or not p.complete:
            return outcome, None
        return outcome, self._complete(p)

    def _complete(self, p: PendingCheckpoint) -> Metadata:
        now = self.clock()
        meta = Metadata(
            checkpoint_id=p.checkpoint_id,
            job=self.job,
            fingerprint=self.fingerprint,
            created=time.time(),
            final=p.final,
            tasks={t: FileRef(s.file, s.size, s.sha256) for t, s in p.acks.items()},
            alignment_ms={t: s.alignment_ms for t, s in p.acks.items()},
            duration_ms=(now - p.started) * 1000,
            job_id=self.job_id,
            layout=self.layout,
            chains=self._chains(p),
            channel_state={t: s.channel_state for t, s in p.acks.items() if s.channel_state},
        )
        self.storage.write_metadata(meta)
        del self.pending[p.checkpoint_id]
        for cid in [c for c in self.pending if c < p.checkpoint_id]:  # subsumed
            self.pending.pop(cid).discard()
        self._track_bases(meta)
        self.storage.prune(self.protected())
        self.stats.completed.append(meta)
        self.stats.trim(self.stats.completed)
        if p.final:
            self.final_completed = meta
        self.just_drained = []
        for lid, (inside, feeders) in self.loops.items():
            if (lid not in self.drained
                    and all(p.acks[t].finished for t in feeders)
                    and sum(p.acks[t].logged for t in inside) == 0):
                self.drained[lid] = p.checkpoint_id
                self.just_drained.append(lid)
        return meta

    def _chains(self, p: PendingCheckpoint) -> dict[str, list[ChainRef]]:
        """Each delta file's chain: its base's chain, then the base's file of that task."""
        chains: dict[str, list[ChainRef]] = {}
        for t, s in p.acks.items():
            if s.base is None:
                continue
            base = self.buildable.get(s.base)
            if base is None or t not in base.tasks:
                raise RuntimeError(f"task {t} wrote checkpoint {p.checkpoint_id} as a delta on checkpoint {s.base}, "
                                   "which this coordinator did not complete or no longer tracks: an engine bug")
            e = base.tasks[t]
            chains[t] = base.chains.get(t, []) + [ChainRef(s.base, e.file, e.size, e.sha256)]
        return chains

    def _track_bases(self, meta: Metadata) -> None:
        """Remember ``meta`` as a base tasks may build on; forget those no task can use."""
        self.buildable[meta.checkpoint_id] = meta
        floor = min([meta.checkpoint_id, *self.known.values()])
        for cid in [c for c in self.buildable if c < floor]:
            del self.buildable[cid]

    def protected(self) -> dict[int, set[str]]:
        """The files (checkpoint id -> names) that retention must keep because a task may
        still write a delta on them: its file, and chain, in each completed checkpoint from
        the newest it had been told of on."""
        out: dict[int, set[str]] = {}
        for cid, m in self.buildable.items():
            for t, e in m.tasks.items():
                if t in self.known and cid >= self.known[t]:
                    out.setdefault(cid, set()).add(e.file)
                    for r in m.chains.get(t, []):
                        out.setdefault(r.checkpoint_id, set()).add(r.file)
        return out

    def end_loop_messages(self, loops: list[int]) -> list[tuple[str, messages.Message]]:
        """EndLoop for every task of the given (drained) loops."""
        return [(t, messages.EndLoop(self.drained[lid])) for lid in loops for t in sorted(self.loops[lid][0])]

    def notifications(self, meta: Metadata) -> list[tuple[str, messages.Message]]:
        # Stopping with this savepoint: every task commits it, says so, and waits to be shut down.
        stop = not meta.final and self.stopping and meta.checkpoint_id == self.savepoint_id
        out: list[tuple[str, messages.Message]] = [
            (t, messages.NotifyComplete(meta.checkpoint_id, meta.final, stop)) for t in sorted(self.tasks)]
        return out + self.stw.end(meta.checkpoint_id)  # durable: the world may go on
