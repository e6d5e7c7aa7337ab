"""Deliberate bugs: each swaps one production function for a broken one while a seed runs,
to prove the simulation's oracle catches what it is there to catch. The simulation runs
the production task (runtime/task.py) and the production checkpoint storage
(checkpoint/storage.py), so a bug here is a bug of the code that runs in a worker or the
driver, not of a copy of it.

Each mutation names the invariant it breaks; tests/abs_engine/simulation checks every one
is caught within the seeds CI runs.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator
from unittest import mock

from .. import codec
from ..checkpoint import storage as checkpoint_storage
from ..runtime import restore
from ..runtime.alignment import BarrierAligner
from ..runtime.channel_state import ChannelStateLog
from ..runtime.task import Task

#: The sink's own bug (user code, not the runtime's): it appends at once, at least once.
NON_TRANSACTIONAL_SINK = "non-transactional-sink"


def _never_blocked(self: BarrierAligner, channel: str) -> bool:
    return False


def _no_replay(*args: Any, **kwargs: Any) -> list[tuple[int, list[Any]]]:
    return []


def _retain_one_fewer(completed: list[int], retain: int) -> set[int]:
    return set(completed[-max(retain - 1, 1):])  # an off-by-one that still keeps the newest


_start_log: Callable[..., Any] = ChannelStateLog.start


def _log_back_edges_only(self: ChannelStateLog, checkpoint_id: int, payload: Any, unaligned: bool,
                         arrived: Any = ()) -> Any:
    return _start_log(self, checkpoint_id, payload, False, arrived)


_on_frame: Callable[..., Any] = Task._on_frame


def _barrier_before_gathered(self: Task, ch: Any, kind: int, payload: bytes, ahead: bool = False) -> None:
    """A barrier (or end of stream) handled before the records gathered ahead of it."""
    if kind == codec.FrameKind.RECORDS:
        _on_frame(self, ch, kind, payload, ahead)
        return
    held, self.batcher.gathered = self.batcher.gathered, []
    _on_frame(self, ch, kind, payload, ahead)
    self.batcher.gathered = held + self.batcher.gathered


#: name -> (what it breaks, the production function it replaces and its replacement)
MUTATIONS: dict[str, tuple[str, Any, str, Callable[..., Any]]] = {
    "no-align": ("records behind a barrier counted in the snapshot", BarrierAligner, "is_blocked",
                 _never_blocked),
    "no-replay": ("records in flight round a loop lost at a restore", restore, "replay", _no_replay),
    "no-channel-state": ("unaligned snapshots log back-edges only", ChannelStateLog, "start",
                         _log_back_edges_only),
    "barrier-before-gathered": ("records gathered before a barrier processed after the snapshot", Task,
                                "_on_frame", _barrier_before_gathered),
    "retain-one-fewer": ("retention deletes an older checkpoint it must keep (recovery still finds the newest)",
                         checkpoint_storage, "retained", _retain_one_fewer),
}

BUGS = ("none", NON_TRANSACTIONAL_SINK, *MUTATIONS)


@contextlib.contextmanager
def mutated(bug: str) -> Iterator[None]:
    """Production code with ``bug`` in it, for the duration of the block."""
    if bug not in MUTATIONS:
        yield
        return
    _, owner, attr, broken = MUTATIONS[bug]
    with mock.patch.object(owner, attr, broken):
        yield
