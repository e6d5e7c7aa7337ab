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

from typing import Any, Callable

from ..checkpoint.incremental import ChainRef
from ..checkpoint.remote import load_task_state
from ..checkpoint.storage import TaskSnapshotData
from ..errors import RescaleError, RescaleErrorReason
from ..plan import Plan, TaskSpec


def load(restore: dict[str, Any], plan: Plan, spec: TaskSpec, operators: dict[str, Any],
         key_fns: dict[str, Callable[[Any], Any]]) -> TaskSnapshotData:
    """The snapshot task ``spec`` restores; ``operators`` are its opened operator instances
    (by name), ``key_fns`` the job's key functions (by keyed operator)."""
    root, cid = restore["root"], int(restore["checkpoint_id"])
    if "rescale" not in restore:
        return load_task_state(root, cid, restore["file"], int(restore["size"]), restore["sha256"],
                               _refs(restore.get("chain")))
    from ..keygroups import key_group, key_group_range

    r = restore["rescale"]
    chains = r.get("chains", {})
    snaps = {t: load_task_state(root, cid, f, int(size), sha, _refs(chains.get(t)))
             for t, (f, size, sha) in r["files"].items()}
    groups = key_group_range(int(r["max_parallelism"]), spec.parallelism, spec.index)
    max_p = int(r["max_parallelism"])

    def owns(key: Any) -> bool:
        return key_group(key, max_p) in groups

    # Every old task involved had finished: so has this one (it only passes end of stream on;
    # what finish() emitted is past the cut already). Some had: only an operator whose old
    # subtasks hold nothing keyed (a source has no splits left, a stateless one no keys)
    # can be rebuilt, or finish() would emit again what the finished ones emitted.
    finished = bool(snaps) and all(s.finished for s in snaps.values())
    states: dict[str, Any] = {}
    for name, olds in r["operators"].items():
        old_states = [snaps[t].states.get(name) for t in olds]
        if name not in r["changed"]:
            states[name] = old_states[0]
            continue
        op = operators[name]
        if not finished and any(snaps[t].finished for t in olds) and not (
                hasattr(op, "read_batch") or all(st is None for st in old_states)):
            raise RescaleError(RescaleErrorReason.FINISHED,
                               f"checkpoint {cid} was taken after some subtasks of operator {name!r} had finished "
                               "their input and emitted their final output: resume from an earlier checkpoint, or "
                               "at the parallelism it ran with", name)
        states[name] = op.rescale_state(old_states, spec.index, spec.parallelism, owns)
    pooled = [rec for t in r["logs_from"] for ch in sorted(snaps[t].logs) for rec in snaps[t].logs[ch]]
    if r["route_logs"] and pooled:
        pooled = _mine(pooled, plan, spec, key_fns, owns, cid)
    return TaskSnapshotData(states, {"rescaled": pooled} if pooled else {}, finished)


def _refs(raw: Any) -> list[ChainRef]:
    """A chain from a Deploy (the driver's own data, built from verified metadata)."""
    return [ChainRef(int(c), str(f), int(n), str(sha)) for c, f, n, sha in raw or []]


def _mine(records: list[Any], plan: Plan, spec: TaskSpec, key_fns: dict[str, Callable[[Any], Any]],
          owns: Callable[[Any], bool], cid: int) -> list[Any]:
    """The logged records this subtask replays: those whose key group it owns (hash
    back-edges), or every ``parallelism``-th (other back-edges: any subtask may take them)."""
    head = plan.chain(spec.chain).operators[0]
    back = {i for i, e in enumerate(plan.edges) if e.back_edge and e.dst == head}
    kinds = {plan.edges[i].partition == "hash" for i in back}
    if kinds == {False}:
        return records[spec.index :: spec.parallelism]
    if kinds != {True}:
        raise RescaleError(RescaleErrorReason.IN_FLIGHT,
                           f"checkpoint {cid}: records in flight round a loop into {head!r} arrived on back-edges "
                           "of which some are keyed and some not, so they cannot be re-routed; resume at the old "
                           "parallelism, or from a checkpoint taken when the loop was empty", head)
    key_ops = {o.key_operator for t in plan.tasks for o in t.outputs if o.edge in back}
    fns = {key_fns.get(k) for k in key_ops}
    if len(fns) != 1:
        raise RescaleError(RescaleErrorReason.IN_FLIGHT,
                           f"checkpoint {cid}: records in flight into {head!r} were keyed by several functions; "
                           "they cannot be re-routed: resume at the old parallelism", head)
    fn = fns.pop()
    return [rec for rec in records if owns(fn(rec) if fn is not None else rec)]
