"""Latency markers (Flink's ``LatencyMarker``): how long the dataflow takes from a source to
a sink, measured by the dataflow itself.

A source task sends a marker after its first read and then every ``latency_interval`` seconds
(``JobConfig``), stamped with the wall time, behind the records it emitted before it. Every task passes it on; a task with
no out-edge (a sink's) reports its age to the driver (``messages.Latency``), which keeps the
job's percentiles (monitor/latency.py).

Invariants:
- A marker never overtakes a record: it keeps its place in its channel's order, and a task
  processes what it gathered before it handles a marker (as before a barrier), so a
  marker's age at a sink includes every queue, alignment and operator the records sent
  before it went through.
- A task sends each marker on one channel of each out-edge (round robin), never on all of
  them: the markers in flight do not multiply with the parallelism or the shuffles.
- A marker is not state: never logged as channel state, snapshotted or replayed. One
  arriving on a back-edge is dropped (it would go round the loop for ever).
- Ages are read off the workers' wall clocks: on one machine exact, across machines as good
  as their clock synchronisation (as Flink's).
"""

from __future__ import annotations

from .. import codec, messages
from .clock import Clock
from .control import ControlLink
from .emitter import Emitter

__all__ = ["LatencyMarkers"]


class LatencyMarkers:
    """A task's side of the latency markers: sends them (a source task, ``tick``), passes
    them on, or reports their age (a task with no out-edge, ``on_marker``)."""

    def __init__(self, task: str, emitter: Emitter, control: ControlLink, clock: Clock, interval: float):
        self.task, self.emitter, self.control, self.clock = task, emitter, control, clock
        self.interval = interval
        self.terminal = not emitter.outputs
        # (the first at a source's first read: a short job is measured too)
        self.next_due = clock.time() if interval > 0 else float("inf")

    def tick(self) -> None:
        """After a source read: a marker, if one is due."""
        now = self.clock.time()
        if now >= self.next_due:
            self.next_due = now + self.interval
            self.on_marker(now)

    def on_marker(self, created: float) -> None:
        """A marker sent at wall time ``created`` reached this task, with everything before it
        processed."""
        if self.terminal:
            age_ms = max(0.0, (self.clock.time() - created) * 1000.0)
            self.control.send(messages.Latency(self.task, age_ms))
        elif not self.emitter.finished:
            frame = codec.latency_frame(created)
            for out in self.emitter.outputs:
                out.send_marker(frame)
