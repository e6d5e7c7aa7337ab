"""What each task of a job restores from a checkpoint, at the same or another parallelism.

Pure data in, pure data out (the driver plans, the workers act; worker.py applies it).
A checkpoint of the same plan restores one state file per task, as always. A checkpoint
of the same dataflow at another parallelism (the same ``Plan.shape()``, recorded in its
metadata's layout) is *rescaled*. Invariants of a rescale:
- Every operator's state is rebuilt per operator, never per task: chaining may differ
  between the two plans, the operator names do not. An operator whose parallelism is
  unchanged restores its own subtask's state; one whose parallelism changed gets, in every
  new subtask, the states of all its old subtasks, which ``rescale_state`` splits (keyed
  state by key group, source splits dealt out).
- Channel state (records in flight at the cut: logged on back-edges, and on every input
  of an unaligned snapshot) is replayed into the operator it was logged for, by the new
  subtasks of that operator, before any new input, at that operator's place in the new
  chain (which may fuse it behind others now). When the operator's parallelism is
  unchanged, subtask i replays what old subtask i logged; when it changed, the old logs are
  pooled and each record goes, channel by channel, to the subtask that now owns its key
  group (a hash edge: the operator's state for that key is there too) or, on forward and
  rebalance edges (no key to honour), to subtask ``position % parallelism``.
- Nothing is rescaled from a checkpoint of another key-group count, with state of an
  operator the job no longer has, or from a job's final checkpoint: RescaleError, naming
  the operator and the fix.
"""

from __future__ import annotations

from .. import ids
from ..errors import RescaleError, RescaleErrorReason
from ..plan import Plan, operator_kind
from .incremental import ChainRef
from .metadata import FileRef, Metadata
from .restore_spec import Inflight, Rescale, RestoreSpec, SamePlan

_R = RescaleErrorReason


def restore_specs(plan: Plan, meta: Metadata, root: str, max_parallelism: int,
                  allow_non_restored_state: bool = False) -> dict[str, RestoreSpec]:
    """task id -> what it restores (its Deploy carries ``restore_spec.to_data`` of it). With
    ``allow_non_restored_state``, a checkpoint of a changed dataflow restores operator by
    operator, by name: the state of operators the dataflow no longer has is dropped, added
    operators start empty, an operator whose kind changed is refused."""
    if meta.fingerprint == plan.fingerprint():
        return {t.id: SamePlan(meta.checkpoint_id, root, _file(meta, t.id), _chain(meta, t.id)) for t in plan.tasks}
    old_ops: dict[str, list[str]] = meta.layout["operators"]
    _check(plan, meta, old_ops, max_parallelism, allow_non_restored_state)
    specs: dict[str, RestoreSpec] = {}
    for task in plan.tasks:
        chain = plan.chain(task.chain)
        operators: dict[str, tuple[str, ...]] = {}
        changed: set[str] = set()
        for op in chain.operators:
            if op not in old_ops:
                continue  # added to the dataflow (allow_non_restored_state): starts empty
            olds = old_ops[op]
            if len(olds) == task.parallelism:
                operators[op] = (olds[task.index],)
            else:
                operators[op] = tuple(olds)
                changed.add(op)
        inflight = _inflight(plan, task.index, task.parallelism, chain.operators, old_ops)
        needed = sorted({t for ids in operators.values() for t in ids} | {t for f in inflight for t in f.sources})
        specs[task.id] = Rescale(
            meta.checkpoint_id, root,
            files={t: _file(meta, t) for t in needed},
            chains={t: _chain(meta, t) for t in needed if t in meta.chains},
            operators=operators, changed=frozenset(changed), inflight=inflight, max_parallelism=max_parallelism)
    return specs


def _inflight(plan: Plan, index: int, parallelism: int, chain: tuple[str, ...],
              old_ops: dict[str, list[str]]) -> tuple[Inflight, ...]:
    """Where a new subtask's channel state comes from: per operator of its chain that headed
    old tasks (channel state is kept by the task whose head received it), the old tasks to
    read, whether their records must be re-routed (the operator's parallelism changed), and
    whether it is keyed: every input of a keyed operator is a hash edge (the compiler
    refuses any other), so its records go by key group; a keyed operator cannot have become
    unkeyed under the same name (_check refuses a changed kind)."""
    out = []
    for op in chain:
        olds = [t for t in old_ops.get(op, []) if ids.head_of(t) == op]
        if not olds:
            continue  # it headed no old task: nothing was in flight into it at the cut
        same = len(olds) == parallelism
        out.append(Inflight(op, (olds[index],) if same else tuple(olds), not same, _by_key(plan, op)))
    return tuple(out)


def _by_key(plan: Plan, op: str) -> bool:
    """Records in flight into ``op`` go by key group: it is keyed, or every regular input of
    it is a hash edge (an operator after ``key_by`` that keeps no keyed state, a map or a
    sink, gets a key's records on one subtask, as the live shuffle sends them)."""
    inputs = [e for e in plan.edges if e.dst == op and not e.back_edge]
    return plan.operator(op).keyed or (bool(inputs) and all(e.partition == "hash" for e in inputs))


def _file(meta: Metadata, task: str) -> FileRef:
    return meta.tasks[task]


def _chain(meta: Metadata, task: str) -> tuple[ChainRef, ...]:
    """The incremental chain of a task's file (checkpoint/incremental.py)."""
    return tuple(meta.chains.get(task, []))


def _check(plan: Plan, meta: Metadata, old_ops: dict[str, list[str]], max_parallelism: int,
           allow_non_restored_state: bool) -> None:
    names = {o.name for o in plan.operators}
    for op in old_ops:
        if op not in names and not allow_non_restored_state:
            raise RescaleError(_R.REMOVED_OPERATOR,
                               f"checkpoint {meta.checkpoint_id} holds state of operator {op!r}, which this dataflow "
                               "does not have: restore it with the dataflow that took it, or pass "
                               "allow_non_restored_state=True to drop that state", op)
    if not names & set(old_ops):
        raise RescaleError(_R.REMOVED_OPERATOR,
                           f"checkpoint {meta.checkpoint_id} holds state of none of this dataflow's operators "
                           f"(it has {sorted(old_ops)}): it is another job's; use an empty checkpoint directory")
    if meta.layout.get("shape") != plan.shape():
        kinds = meta.layout.get("kinds", {})
        for o in plan.operators:
            if o.name in old_ops and kinds.get(o.name) != operator_kind(o):
                raise RescaleError(_R.CHANGED_OPERATOR,
                                   f"operator {o.name!r} is a {operator_kind(o)} now, but checkpoint "
                                   f"{meta.checkpoint_id} holds "
                                   f"the state of a {kinds.get(o.name, 'operator of an unrecorded kind')} of that "
                                   "name: its state cannot be restored into it; give the new operator another name "
                                   "(it then starts empty)", o.name)
    old_max = meta.layout.get("max_parallelism", max_parallelism)
    if old_max != max_parallelism:
        raise RescaleError(_R.MAX_PARALLELISM,
                           f"checkpoint {meta.checkpoint_id} spreads its keys over {old_max} key groups and this job "
                           f"over {max_parallelism}: keep max_parallelism={old_max} for the life of the job")
    if meta.final:
        raise RescaleError(_R.FINISHED,
                           f"checkpoint {meta.checkpoint_id} is the final checkpoint of a job that finished: there is "
                           "nothing left to run at another parallelism; resume at the parallelism it ran with")
    for o in plan.operators:
        if o.parallelism > max_parallelism:
            raise RescaleError(_R.MAX_PARALLELISM,
                               f"operator {o.name!r} would run {o.parallelism} subtasks but the job has only "
                               f"{max_parallelism} key groups (max_parallelism): lower its parallelism", o.name)
