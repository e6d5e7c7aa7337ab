"""A task built from its Deploy: the part of a worker's start-up that does not depend on
where the task runs (a worker process over sockets, or the in-process executor over
memory): its operators (fresh instances of the user's code), opened and restored, the
channel state it replays first, and its options.

Invariants: user code is loaded only from the Deploy (code the user wrote, shipped by the
authenticated driver), never from a checkpoint; every operator is restored from files read
with storage's checks (runtime/restore.py). A failure names the operator it happened in
(OperatorFailure); CheckpointError and FencedOut pass through unchanged.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, Callable

from operators.base import OperatorContext

from .. import codeship, messages
from ..checkpoint import restore_spec
from ..checkpoint.fence import Fence
from ..errors import CheckpointError, FencedOut, RescaleError
from ..plan import Plan, TaskSpec
from . import restore
from .chain import Chain
from .clock import SYSTEM, Clock
from .output import OperatorFailure
from .task import TaskOptions
from .watchdog import Activity


@dataclass
class Prepared:
    """A task's chain, opened and restored, and what it needs to run."""

    plan: Plan
    spec: TaskSpec
    chain: Chain
    key_fns: Mapping[str, Callable[[Any], Any] | None]
    options: TaskOptions
    replay: list[tuple[int, list[Any]]]
    restored_finished: bool
    #: The restored checkpoint was the job's final one and the chain has committed it: the
    #: task only says Committed and stops.
    final_committed: bool


def file_tag(fence: str, generation: int) -> str:
    """A short tag unique to this attempt of this driver run, for state file names."""
    return hashlib.sha256(f"{fence}/{generation}".encode()).hexdigest()[:12]


def options_of(deploy: messages.Deploy, generation: int) -> TaskOptions:
    """The task's options from its Deploy."""
    return TaskOptions(
        snapshot_encoding=deploy.snapshot_encoding, incremental=deploy.incremental,
        aligned_timeout=deploy.aligned_timeout, unaligned=deploy.unaligned,
        channel_state_memory=deploy.channel_state_memory, loop_memory=deploy.loop_memory,
        loop_disk=deploy.loop_disk, loop_spill_dir=deploy.loop_spill_dir or None,
        file_tag=file_tag(deploy.fence, generation), latency_interval=deploy.latency_interval)


def prepare(deploy: messages.Deploy, task_id: str, generation: int, activity: Activity,
            tls: bool = False, clock: Clock = SYSTEM) -> Prepared:
    """Load, open and restore task ``task_id``'s chain as ``deploy`` says (its operators
    read time from ``clock``)."""
    plan = Plan.from_dict(deploy.plan)
    spec = plan.task(task_id)
    chain_spec = plan.chain(spec.chain)
    code = codeship.load(deploy.code)  # user code from the authenticated driver, never data
    templates, key_fns = code["ops"], code["keys"]
    # Parsed before any operator code runs: a malformed spec is the connection's fault (ProtocolError).
    what = None if deploy.restore is None else restore_spec.from_data(deploy.restore)
    restored = what is not None
    fence = Fence(deploy.fence_dir or deploy.checkpoint_dir, deploy.fence) if deploy.fence else None

    def ctx(name: str) -> Any:
        return OperatorContext(name, spec.index, spec.parallelism, generation, restored, fence,
                               max_parallelism=plan.max_parallelism, tls=tls, clock=clock, job=plan.job)

    names = list(chain_spec.operators)
    source: Any = None
    source_name: str | None = None
    if chain_spec.is_source:
        source_name = names.pop(0)
        source = templates[source_name]
    chain = Chain(names, [templates[n] for n in names], source, source_name, activity)
    current: str = source_name or (names[0] if names else task_id)
    replay: list[tuple[int, list[Any]]] = []
    restored_finished = final_committed = False
    try:
        for n, op in chain.all_operators():
            current = n
            op.open(ctx(n))
        if what is not None:
            snap = restore.load(what, plan, spec, dict(chain.all_operators()), key_fns)
            restored_finished = snap.finished
            replay = restore.replay(snap, names, isinstance(what, restore_spec.Rescale))
            for n, op in chain.all_operators():
                current = n
                if n in snap.states:
                    op.restore(snap.states[n])
            if deploy.restore_final:
                # The final checkpoint completed: commit what it holds (idempotent) and stop.
                for n, op in chain.all_operators():
                    current = n
                    op.notify_checkpoint_complete(what.checkpoint_id)
                final_committed = True
    except (CheckpointError, FencedOut):
        raise
    except RescaleError as e:
        raise OperatorFailure(e.operator or current, fatal=True) from e
    except Exception as e:
        raise OperatorFailure(current) from e
    return Prepared(plan, spec, chain, key_fns, options_of(deploy, generation), replay, restored_finished,
                    final_committed)
