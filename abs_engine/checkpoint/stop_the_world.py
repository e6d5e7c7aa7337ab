"""Stop-the-world checkpoints, the baseline ABS is measured against, as the coordinator
runs them: the sources are paused, every task is asked for its channel counts in waves
until two waves agree that nothing is in flight (quiescence.py), then every task
snapshots, and the sources resume once the checkpoint is durable. Sans-IO, as the
coordinator: each method returns the messages to send.

Invariants: one stop-the-world checkpoint at a time; its sources are resumed however it
ends (completed, expired or aborted: ``end``), so a paused source never outlives it.
"""

from __future__ import annotations

from typing import Callable

from .. import messages
from .quiescence import QuiescenceDetector, Verdict

Outbox = list[tuple[str, messages.Message]]


class StopTheWorld:
    def __init__(self, tasks: frozenset[str], source_tasks: list[str], channels: frozenset[str],
                 wave_interval: float, clock: Callable[[], float]):
        self.quiescence = QuiescenceDetector(tasks, channels)
        self.tasks, self.sources = sorted(tasks), sorted(source_tasks)
        self.wave_interval, self.clock = wave_interval, clock
        self.checkpoint: int | None = None  #: the stop-the-world checkpoint in progress
        self.next_wave_at: float | None = None  #: when the next counting wave is due

    def begin(self, checkpoint_id: int) -> Outbox:
        """Pause the sources, then count until nothing is in flight."""
        self.checkpoint = checkpoint_id
        wave = self.quiescence.start()
        return ([(t, messages.Pause(checkpoint_id)) for t in self.sources]
                + [(t, messages.CountRequest(wave)) for t in self.tasks])

    def due(self, now: float) -> Outbox:
        """The next counting wave, if it is due at ``now``."""
        if self.next_wave_at is None or now < self.next_wave_at:
            return []
        self.next_wave_at = None
        wave = self.quiescence.next_wave()
        return [(t, messages.CountRequest(wave)) for t in self.tasks]

    def on_counts(self, msg: messages.Counts) -> Outbox:
        """One task's answer to a wave: every task snapshots once nothing is in flight."""
        if self.checkpoint is None:
            return []
        verdict = self.quiescence.on_counts(msg.task, msg.wave, msg.sent, msg.received)
        if verdict is Verdict.QUIESCENT:
            return [(t, messages.Snapshot(self.checkpoint)) for t in self.tasks]
        if verdict is Verdict.IN_FLIGHT:
            self.next_wave_at = self.clock() + self.wave_interval
        return []

    def end(self, checkpoint_id: int) -> Outbox:
        """Checkpoint ``checkpoint_id`` ended (durable, expired or aborted): if it is the one
        in progress, the sources resume."""
        if checkpoint_id != self.checkpoint:
            return []
        self.checkpoint = self.next_wave_at = None
        return [(t, messages.Resume(checkpoint_id)) for t in self.sources]
