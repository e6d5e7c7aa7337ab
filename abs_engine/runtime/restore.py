"""A worker's side of a restore: the snapshot its task starts from, read from one state file
(the same plan) or rebuilt from the old subtasks' files (a rescale; see
checkpoint/rescale.py for the plan and its invariants).

Every file is read with storage's checks (plain name, bounded by its recorded size,
sha256) before a byte of it is decoded. Rebuilt states come from the operators' own
``rescale_state`` (operators/base.py); the key groups this subtask owns are
``keygroups.key_group_range`` of its index, the same ranges routing uses, so a key's state
and its records meet in one subtask.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

from operators.base import Source

from ..checkpoint.remote import load_task_state
from ..checkpoint.restore_spec import Inflight, RestoreSpec, SamePlan
from ..checkpoint.snapshot_file import TaskSnapshotData
from ..errors import RescaleError, RescaleErrorReason
from ..plan import Plan, TaskSpec


def load(restore: RestoreSpec, plan: Plan, spec: TaskSpec, operators: dict[str, Any],
         key_fns: Mapping[str, Callable[[Any], Any] | None]) -> TaskSnapshotData:
    """The snapshot task ``spec`` restores; ``operators`` are its opened operator instances
    (by name), ``key_fns`` the job's key functions (by keyed operator)."""
    root, cid = restore.root, restore.checkpoint_id
    if isinstance(restore, SamePlan):
        own = restore.file
        return load_task_state(root, cid, own.file, own.size, own.sha256, list(restore.chain))
    from ..keygroups import key_group, key_group_range

    r = restore
    snaps = {t: load_task_state(root, cid, f.file, f.size, f.sha256, list(r.chains.get(t, ())))
             for t, f in r.files.items()}
    max_p = r.max_parallelism
    groups = key_group_range(max_p, spec.parallelism, spec.index)

    def owns(key: Any) -> bool:
        return key_group(key, max_p) in groups

    # Every old task involved had finished: so has this one (it only passes end of stream on;
    # what finish() emitted is past the cut already). Some had: only an operator whose old
    # subtasks hold nothing keyed (a source has no splits left, a stateless one no keys)
    # can be rebuilt, or finish() would emit again what the finished ones emitted.
    finished = bool(snaps) and all(s.finished for s in snaps.values())
    states: dict[str, Any] = {}
    for name, olds in r.operators.items():
        old_states = [snaps[t].states.get(name) for t in olds]
        if name not in r.changed:
            states[name] = old_states[0]
            continue
        op = operators[name]
        if not finished and any(snaps[t].finished for t in olds) and not (
                isinstance(op, Source) or all(st is None for st in old_states)):
            raise RescaleError(RescaleErrorReason.FINISHED,
                               f"checkpoint {cid} was taken after some subtasks of operator {name!r} had finished "
                               "their input and emitted their final output: resume from an earlier checkpoint, or "
                               "at the parallelism it ran with", name)
        # (a keyed operator's default: the keys its declared state_layout gives this subtask)
        states[name] = op.rescale_state(old_states, spec.index, spec.parallelism, owns)
    logs: dict[str, list[Any]] = {}
    for f in r.inflight:
        records = _routed(f, snaps, spec, key_fns, owns) if f.route else [
            rec for t in f.sources for ch in sorted(snaps[t].logs) for rec in snaps[t].logs[ch]]
        if records:
            logs[f.operator] = records
    return TaskSnapshotData(states, logs, finished)


def replay(snap: TaskSnapshotData, chain: list[str], rescaled: bool) -> list[tuple[int, list[Any]]]:
    """The records a restored task processes before any input, each batch with the index in
    ``chain`` (its operators, sources excluded) of the operator it goes into: the chain's
    head for a restore of the same plan (logs by channel), the operator named for a
    rescale (logs by operator: it may be fused behind others now).

    Invariant: downstream first. An operator's channel state was sent to it before the cut,
    so it must reach it before anything that operators upstream of it in the chain emit
    after the cut, their own replays included."""
    if not rescaled:
        return [(0, [rec for records in snap.logs.values() for rec in records])] if snap.logs else []
    return sorted(((chain.index(op), records) for op, records in snap.logs.items()), key=lambda b: -b[0])


def _routed(f: Inflight, snaps: dict[str, TaskSnapshotData], spec: TaskSpec,
            key_fns: Mapping[str, Callable[[Any], Any] | None], owns: Callable[[Any], bool]) -> list[Any]:
    """This subtask's share of the records the old subtasks of operator ``f.operator`` logged:
    into a keyed operator (hash edges only), those whose key group it owns, by the
    operator's key function; into any other, every ``parallelism``-th of them (forward and
    rebalance edges honour no key)."""
    records = [rec for t in f.sources for ch in sorted(snaps[t].logs) for rec in snaps[t].logs[ch]]
    if not f.keyed:
        return records[spec.index :: spec.parallelism]
    fn = key_fns.get(f.operator)
    return [rec for rec in records if owns(fn(rec) if fn is not None else rec)]
