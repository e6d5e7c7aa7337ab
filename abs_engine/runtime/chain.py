"""A task's operator chain: its source (if any) and operators, and the one way their code is
called.

Invariants:
- Every call of operator or source code goes through ``call`` or ``process``, and what it
  raises becomes the task's failure through ``output.operator_failure`` (a RecordError
  names its record: the driver's poison-record rule). ``OperatorFailure`` and ``FencedOut``
  pass through unchanged (the failure of a nested call, and a fenced-out attempt).
- The watchdog sees which operator's code runs (``Activity``) while it runs.
- ``process`` is the hot path: one try around the whole chain per batch, not one per
  operator, so the batch loop costs a function call per operator and batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from operators.base import Operator, Source

from ..errors import FencedOut
from .output import OperatorFailure, operator_failure
from .watchdog import Activity

REPR_MAX = 200
R = TypeVar("R")  #: what a call of operator code returns


def record_repr(record: Any) -> str:
    """A record for an error message: its repr, truncated."""
    try:
        text = repr(record)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not hide the real failure
        text = f"<{type(record).__name__} with a failing __repr__>"
    return text if len(text) <= REPR_MAX else text[:REPR_MAX] + f"... ({len(text)} chars)"


@dataclass
class Chain:
    """The operators of one task, in order: ``ops[i]`` is named ``names[i]``; a source task
    reads from ``source`` (named ``source_name``) before them."""

    names: list[str]
    ops: list[Operator]
    source: Source[Any] | None = None
    source_name: str | None = None
    activity: Activity = field(default_factory=Activity)

    def all_operators(self) -> list[tuple[str, Any]]:
        """(name, instance) of the source and every operator: what has state."""
        head: list[tuple[str, Any]] = []
        if self.source is not None:
            head.append((self.source_name or "source", self.source))
        return head + list(zip(self.names, self.ops))

    def call(self, name: str, fn: Callable[..., R], *args: Any) -> R:
        """``fn(*args)``, code of operator (or source) ``name``."""
        activity = self.activity
        activity.enter(name)
        try:
            return fn(*args)
        except (OperatorFailure, FencedOut):
            raise
        except Exception as e:
            raise operator_failure(name, e)  # noqa: B904 - its cause is set: the user's error
        finally:
            activity.leave()

    def process(self, batch: list[Any], start: int = 0) -> list[Any]:
        """``batch`` through operators ``start``.. of the chain; what the last one emits."""
        i = start
        activity = self.activity
        activity.since = time.monotonic()  # the watchdog's clock: real time, on its thread
        try:
            ops, names = self.ops, self.names
            for i in range(start, len(ops)):
                activity.op = names[i]
                batch = ops[i].process(batch)
                if not batch:
                    break
        except (OperatorFailure, FencedOut):
            raise
        except Exception as e:
            raise operator_failure(self.names[i], e)  # noqa: B904 - its cause is set: the user's error
        finally:
            activity.since = 0.0
        return batch

    def finish(self) -> list[Any]:
        """End of input: each operator's final output, passed through the rest of the chain."""
        batch: list[Any] = []
        for name, op in zip(self.names, self.ops):
            if batch:
                batch = self.call(name, op.process, batch)
            batch = list(batch) + self.call(name, op.finish)
        return batch

    def snapshot(self, checkpoint_id: int) -> dict[str, Any]:
        """Every operator's state for ``checkpoint_id``, by name."""
        return {name: self.call(name, op.snapshot, checkpoint_id) for name, op in self.all_operators()}

    def notify_complete(self, checkpoint_id: int) -> None:
        for name, op in self.all_operators():
            self.call(name, op.notify_checkpoint_complete, checkpoint_id)

    def close(self) -> None:
        """Every operator's ``close()``, when the task ends however it ended: best effort (an
        operator that never opened, or whose close fails, is passed over: it must not mask
        why the task ended)."""
        for _, op in self.all_operators():
            try:
                op.close()
            except Exception:  # noqa: BLE001 - see the docstring
                pass
