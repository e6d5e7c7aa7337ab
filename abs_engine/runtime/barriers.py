"""Every barrier decision of one task, as one explicit state machine over its inputs.

A task hands each barrier (and each end of stream, and each trigger) here and carries out
what comes back; nothing here does I/O or touches records. The states compose two
machines that stay separate because they answer separate questions:

- alignment of the regular inputs (runtime/alignment.py): ``WaitingForFirstBarrier`` or
  ``CollectingBarriers(n)`` -- which inputs are blocked;
- channel state (runtime/channel_state.py): the sessions logging what is in flight on
  back-edges (and, unaligned, on every input) until barrier n arrives on each -- which
  snapshots are complete, which back-edges are held;

and the mode switches between them: an aligned checkpoint turns unaligned at its first
unaligned barrier, at an unaligned trigger, or when its alignment has lasted
``aligned_timeout`` (Flink's alternating barrier handler); stop-the-world snapshots log
nothing (``Snapshot``, no barrier travels).

Transitions return actions, in the order the task must carry them out:
``Snapshot(n, unaligned, arrived)`` (take checkpoint n now: operators, barrier forwarded,
then ``start`` its session), ``Block(channel)`` (stop reading it), ``Release()`` (unblock
every blocked input), ``Write(sessions)`` (these snapshots are complete). Invariant: a
checkpoint id is snapshotted at most once (``last_snapshot``); a barrier at or below it
only closes logs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Union

from .alignment import BarrierAligner, CollectingBarriers, Outcome
from .channel_state import ChannelStateLog, Session


@dataclass(frozen=True)
class Snapshot:
    """Take checkpoint ``checkpoint_id`` now (then ``BarrierHandler.started``)."""

    checkpoint_id: int
    unaligned: bool = False
    arrived: frozenset[str] = frozenset()  #: inputs that delivered its barrier already
    barrier: bool = True  #: forward a barrier and log what is in flight (False: stop-the-world)


@dataclass(frozen=True)
class Block:
    """Stop processing (and reading) ``channel`` until a Release."""

    channel: str


@dataclass(frozen=True)
class Release:
    """Every blocked input may be processed again."""


@dataclass(frozen=True)
class Write:
    """These snapshots are complete: write and acknowledge them."""

    sessions: tuple[Session, ...]


Action = Union[Snapshot, Block, Release, Write]


class BarrierHandler:
    """Alignment, channel state and the switch between aligned and unaligned, for one task."""

    def __init__(self, regular: Iterable[str], back_edges: Iterable[str], memory_limit: int | None = None,
                 aligned_timeout: float | None = None):
        regular = list(regular)
        self.aligner = BarrierAligner(regular)
        self.log = ChannelStateLog(back_edges, regular, memory_limit)
        self.aligned_timeout = aligned_timeout
        self.last_snapshot = 0  #: a trigger or barrier for an id <= this only closes logs
        self.loop_ended = False  #: back-edges are over: their barriers mean nothing
        #: When the alignment in progress began (the task's clock; None: not aligning).
        self.aligning_since: float | None = None

    # ---- questions ---------------------------------------------------------------------------

    def may_take(self, channel: str, back_edge: bool) -> bool:
        return not self.log.is_held(channel) if back_edge else not self.aligner.is_blocked(channel)

    @property
    def regular_ended(self) -> bool:
        """Every regular input has ended."""
        return self.aligner.all_ended

    def collecting(self) -> int | None:
        """The checkpoint whose barriers are being aligned (None: none)."""
        st = self.aligner.state
        return st.checkpoint_id if isinstance(st, CollectingBarriers) else None

    def alignment_deadline(self) -> float | None:
        if self.aligned_timeout is None or self.aligning_since is None:
            return None
        return self.aligning_since + self.aligned_timeout

    # ---- transitions --------------------------------------------------------------------------

    def on_barrier(self, channel: str, back_edge: bool, checkpoint_id: int, unaligned: bool,
                   now: float) -> list[Action]:
        if back_edge and self.loop_ended:
            return []
        if unaligned and checkpoint_id > self.last_snapshot:  # the first barrier of an unaligned checkpoint
            return self.unaligned(checkpoint_id, {channel})
        if back_edge or checkpoint_id <= self.last_snapshot:
            # A back-edge's barrier (held if it came first), or the barrier of a checkpoint
            # this task has taken already (unaligned, or directly): it closes a log.
            return self._written(self.log.on_barrier(channel, checkpoint_id).completed)
        d = self.aligner.on_barrier(channel, checkpoint_id)
        actions: list[Action] = []
        if d.outcome is Outcome.ABORTED_AND_BLOCKED:
            # The older checkpoint was abandoned upstream: what it blocked is free again.
            actions.append(Release())
            self.aligning_since = None
        if d.outcome in (Outcome.BLOCKED, Outcome.ABORTED_AND_BLOCKED):
            if self.aligning_since is None:
                self.aligning_since = now
            actions.append(Block(channel))
        elif d.outcome is Outcome.TRIGGERED:
            assert d.checkpoint_id is not None
            actions += [self._snapshot(d.checkpoint_id), Release()]
        return actions

    def on_end_of_stream(self, channel: str, back_edge: bool) -> list[Action]:
        actions: list[Action] = self._written(self.log.on_end_of_stream(channel).completed)
        if not back_edge:
            d = self.aligner.on_end_of_stream(channel)
            if d.outcome is Outcome.TRIGGERED:
                assert d.checkpoint_id is not None
                actions += [self._snapshot(d.checkpoint_id), Release()]
        return actions

    def on_trigger(self, checkpoint_id: int, unaligned: bool, direct: bool) -> list[Action]:
        """The coordinator's trigger. ``direct``: the task takes it as it comes (a source, or
        a task whose regular inputs have all ended); else only an unaligned one counts (a
        process may record its state at any moment, then log what arrives before each marker)."""
        if checkpoint_id <= self.last_snapshot:
            return []
        if direct:
            return [self._snapshot(checkpoint_id, unaligned)]
        if unaligned:
            return self.unaligned(checkpoint_id, set())
        return []

    def on_timeout(self, now: float) -> list[Action]:
        """The alignment in progress has lasted ``aligned_timeout``: it turns unaligned."""
        deadline = self.alignment_deadline()
        collecting = self.collecting()
        if deadline is None or collecting is None or now < deadline:
            return []
        return self.unaligned(collecting, set())

    def unaligned(self, checkpoint_id: int, arrived: set[str]) -> list[Action]:
        """Snapshot now for ``checkpoint_id``, unaligned: an alignment in progress is
        abandoned, what it blocked is released, the inputs it had collected count as arrived."""
        st = self.aligner.state
        if isinstance(st, CollectingBarriers) and st.checkpoint_id == checkpoint_id:
            arrived = arrived | set(st.arrived)
        self.aligner.abandon(checkpoint_id)
        return [self._snapshot(checkpoint_id, True, frozenset(arrived)), Release()]

    def stop_the_world(self, checkpoint_id: int) -> list[Action]:
        """Nothing is in flight (the coordinator counted): snapshot, no barrier, no log."""
        if checkpoint_id <= self.last_snapshot:
            return []
        self.last_snapshot = checkpoint_id
        return [Snapshot(checkpoint_id, barrier=False)]

    def end_loop(self, live_back_edges: Iterable[str]) -> list[Action]:
        """A completed checkpoint proved the loop drained: back-edges count as ended."""
        if self.loop_ended:
            return []
        self.loop_ended = True
        return self._written(tuple(s for ch in live_back_edges for s in self.log.on_end_of_stream(ch).completed))

    def started(self, checkpoint_id: int, payload: object, unaligned: bool, arrived: Iterable[str]) -> tuple[
            tuple[str, ...], tuple[Session, ...]]:
        """The task took snapshot ``checkpoint_id`` (its state is ``payload``): its session
        logs what is in flight. The back-edges no longer held, and the sessions complete."""
        step = self.log.start(checkpoint_id, payload, unaligned, arrived)
        return step.released, step.completed

    def _snapshot(self, checkpoint_id: int, unaligned: bool = False,
                  arrived: frozenset[str] = frozenset()) -> Snapshot:
        self.last_snapshot = checkpoint_id
        return Snapshot(checkpoint_id, unaligned, arrived)

    @staticmethod
    def _written(sessions: tuple[Session, ...]) -> list[Action]:
        return [Write(sessions)] if sessions else []
