"""The JSON documents of a job's statistics: what the dashboard's API serves, what is stored
beside the checkpoints and what ``abs-engine report`` draws. Field names are Flink's REST
API's where Flink has one (``/jobs/:id/checkpoints``: ``counts``, ``summary``, ``latest``,
``history``; per checkpoint ``end_to_end_duration``, ``state_size``, ``checkpointed_size``,
``persisted_data``; per subtask ``checkpoint.sync``, ``alignment.duration``,
``start_delay``). Times are milliseconds since the epoch; durations milliseconds.

Every function here but ``pipeline`` is called with the tracker's lock held and only reads it.
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any

import networkx as nx

from ..plan import Plan
from .latency import RECENT_S, LatencySummary
from .model import KEEP_CHECKPOINT_STATS, CheckpointStat, CheckpointStatus, RecoveryEvent, SubtaskStat

if TYPE_CHECKING:
    from .tracker import JobTracker

VERSION = 1  #: of the stored document's layout
HISTORY = 100  #: checkpoints listed in the API's history (the newest)

_TYPES = {"aligned": "CHECKPOINT", "unaligned": "UNALIGNED_CHECKPOINT", "savepoint": "SAVEPOINT",
          "stop-the-world": "STOP_THE_WORLD"}


def graph(plan: Plan) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Vertices (chains: Flink's job vertices) and the edges between them, each vertex in
    the column of its longest path from a source over forward edges (back-edges left out)."""
    chain_of = {op: c.name for c in plan.chains for op in c.operators}
    g = nx.DiGraph()
    g.add_nodes_from(c.name for c in plan.chains)
    edges = []
    for e in plan.edges:
        a, b = chain_of[e.src], chain_of[e.dst]
        if not e.back_edge:
            g.add_edge(a, b)
        edges.append({"source": a, "target": b, "ship_strategy": e.partition.upper(), "back_edge": e.back_edge})
    layer: dict[str, int] = {}
    for n in nx.topological_sort(g):
        layer[n] = max((layer[p] + 1 for p in g.predecessors(n)), default=0)
    tasks: dict[str, list[str]] = {}
    for t in sorted(plan.tasks, key=lambda t: t.index):
        tasks.setdefault(t.chain, []).append(t.id)
    vertices = [{"id": c.name, "name": " -> ".join(c.operators), "operators": list(c.operators),
                 "parallelism": c.parallelism, "is_source": c.is_source, "loop": c.loop, "layer": layer[c.name],
                 "tasks": tasks.get(c.name, [])} for c in plan.chains]
    return vertices, edges


def job(tr: "JobTracker") -> dict[str, Any]:
    now = tr.clock()
    end = tr.end_time
    return {
        "jid": tr.job_id, "name": tr.plan.job, "state": tr.state.value,
        "start-time": _ms(tr.start_time), "end-time": _ms(end) if end is not None else -1,
        "duration": _ms((end if end is not None else now) - tr.start_time), "now": _ms(now),
        "mode": tr.mode, "checkpoint_interval": None if tr.interval is None else _num(tr.interval), "attempt": tr.attempt, "restarts": tr.restarts,
        "source_records": tr.source_records,
        "vertices": tr.vertices, "edges": tr.edges,
        "tasks": [{"id": k, "vertex": t.vertex, "subtask": t.index, "status": t.status, "pid": t.pid,
                   "records_in": t.records_in, "records_out": t.records_out,
                   "records_in_per_second": _num(t.in_rate), "records_out_per_second": _num(t.out_rate),
                   "backpressure": _num(t.backpressure), **health(t)} for k, t in tr.tasks.items()],
        "watermarks": watermarks(tr),
        "sources": sources(tr),
        "operators": operators(tr),
        "throughput": None,  # the caller fills it in: throughput()
        "recoveries": [recovery(r) for r in tr.recoveries],
        "latency": latency(tr.latency.last(now), tr.latency.run()),
    }


def pipeline(name: str, tr: "JobTracker") -> dict[str, Any]:
    """One pipeline's line of ``/api/pipelines``: its state and what tells it from the
    others (its restarts, checkpoints and progress are its own). Takes the tracker's lock."""
    with tr.lock:
        n = counts(tr)
        latest = tr.history.completed[-1].checkpoint_id if tr.history.completed else None
        return {"name": name, "state": tr.state.value, "attempt": tr.attempt, "restarts": tr.restarts,
                "vertices": [c.name for c in tr.plan.chains], "tasks": len(tr.tasks),
                "source_records": tr.source_records, "watermark": watermarks(tr)["job"],
                "checkpoints": {**{k: n[k] for k in ("completed", "expired", "aborted", "in_progress")},
                                "latest_completed": latest}}


def health(t: Any) -> dict[str, Any]:
    """A task's health (tracker.TaskMetrics): None where not known."""
    return {"watermark": None if t.watermark is None else _num(t.watermark), "cpu_seconds": _num(t.cpu_s),
            "rss_bytes": t.rss or None, "keys": None if t.keys < 0 else t.keys,
            "timers": None if t.timers < 0 else t.timers, "late_records": t.late, "skipped_records": t.skipped,
            "late_by_operator": dict(t.late_by_operator), "skipped_by_operator": dict(t.skipped_by_operator),
            "progress": None if not t.unit else {"left": None if t.left < 0 else t.left,
                                                 "total": None if t.total < 0 else t.total, "unit": t.unit,
                                                 "position": t.position}}


def sources(tr: "JobTracker") -> dict[str, Any]:
    """Per source vertex, its progress through its input (operators/progress.py): units
    ``done`` and ``left`` of the ``total`` (None: unbounded or not known, e.g. until every
    subtask has said), and ``fraction`` done."""
    out: dict[str, Any] = {}
    for c in tr.plan.chains:
        if not c.is_source:
            continue
        ts = [t for t in tr.tasks.values() if t.vertex == c.name]
        units = {t.unit for t in ts}
        if "" in units or len(units) != 1:  # not every subtask has said, or they count apart
            out[c.name] = None
            continue
        left = None if any(t.left < 0 for t in ts) else sum(t.left for t in ts)
        total = max(t.total for t in ts)
        total_ = None if total < 0 else total
        done = None if left is None or total_ is None else max(0, total_ - left)
        out[c.name] = {"unit": units.pop(), "left": left, "total": total_, "done": done,
                       "fraction": None if done is None or not total_ else _num(min(1.0, done / total_))}
    return out


def operators(tr: "JobTracker") -> list[dict[str, Any]]:
    """Every operator of the plan (a chain's source first), in plan order, with its vertex
    and the late records it met and the records it skipped, its subtasks' together; after a
    chain's operators, its out-edges' key functions that skipped records (``key_by(...)``)."""
    out = []
    for c in tr.plan.chains:
        ts = [t for t in tr.tasks.values() if t.vertex == c.name]
        edges = sorted({n for t in ts for n in (*t.late_by_operator, *t.skipped_by_operator)} - set(c.operators))
        for op in (*c.operators, *edges):
            out.append({"name": op, "vertex": c.name,
                        "late_records": sum(t.late_by_operator.get(op, 0) for t in ts),
                        "skipped_records": sum(t.skipped_by_operator.get(op, 0) for t in ts)})
    return out


def watermarks(tr: "JobTracker") -> dict[str, Any]:
    """Event time per vertex (the lowest of its subtasks') and the job's (the lowest of
    all); ``lag``: how far the slowest operator's watermark is behind the sources' (their
    lowest: the event time every source has passed), in event-time units. None: no event
    time (or no operator past the sources)."""
    by_vertex: dict[str, float] = {}
    sources = {c.name for c in tr.plan.chains if c.is_source}
    for t in tr.tasks.values():
        if t.watermark is not None:
            by_vertex[t.vertex] = min(by_vertex.get(t.vertex, t.watermark), t.watermark)
    if not by_vertex:
        return {"job": None, "lag": None, "vertices": {}}
    source_low = min((w for v, w in by_vertex.items() if v in sources), default=None)
    others_low = min((w for v, w in by_vertex.items() if v not in sources), default=None)
    lag = None if source_low is None or others_low is None else _num(max(0.0, source_low - others_low))
    return {"job": _num(min(by_vertex.values())), "lag": lag, "vertices": {v: _num(w) for v, w in by_vertex.items()}}


def latency(recent: LatencySummary | None, run: LatencySummary | None) -> dict[str, Any]:
    """Source-to-sink latency (monitor/latency.py): over the last RECENT_S seconds and the run."""
    return {"recent": None if recent is None else recent.to_dict(), "run": None if run is None else run.to_dict(),
            "recent_seconds": RECENT_S}


def throughput(samples: list[tuple[float, dict[str, tuple[float, float, float, float | None]]]],
               tasks: list[str]) -> dict[str, Any]:
    """The throughput samples as columns: a time axis and, per task, one value per sample
    (a watermark: None where the task had none)."""
    def value(s: dict[str, tuple[float, float, float, float | None]], k: str, i: int) -> float | None:
        v = s[k][i] if k in s else None
        return _num(v) if v is not None else (None if i == 3 else 0.0)

    def column(i: int) -> dict[str, list[float | None]]:
        return {k: [value(s, k, i) for _, s in samples] for k in tasks}

    return {"time": [t for t, _ in samples], "records_in_per_second": column(0),
            "records_out_per_second": column(1), "backpressure": column(2), "watermark": column(3)}


def recovery(r: RecoveryEvent) -> dict[str, Any]:
    return {"time": _ms(r.time), "attempt": r.attempt, "failed_task": r.failed_task, "reason": r.reason,
            "restored_from": r.restored_from,
            "running_after_ms": None if r.running_after_s is None else _num(r.running_after_s * 1000)}


def entry(s: CheckpointStat) -> dict[str, Any]:
    """One ended checkpoint, as Flink's history lists one."""
    ctype = "UNALIGNED_CHECKPOINT" if s.mode == "aligned" and s.unaligned_tasks else _TYPES.get(s.mode, "CHECKPOINT")
    acked = len(s.subtasks) if s.subtasks or s.status is not CheckpointStatus.COMPLETED else s.num_subtasks
    return {
        "id": s.checkpoint_id, "status": s.status.value, "checkpoint_type": ctype, "mode": s.mode,
        "is_savepoint": s.mode == "savepoint", "attempt": s.attempt,
        "trigger_timestamp": _ms(s.trigger_time), "latest_ack_timestamp": _ms(s.latest_ack_time) or None,
        "end_to_end_duration": _num(s.duration_ms), "state_size": s.state_size, "checkpointed_size": s.bytes,
        "persisted_data": s.inflight_bytes, "persisted_records": s.inflight_records,
        "num_subtasks": s.num_subtasks, "num_acknowledged_subtasks": acked, "unaligned_subtasks": s.unaligned_tasks,
        "failure_timestamp": (_ms(s.trigger_time + s.duration_ms / 1000)
                              if s.status in (CheckpointStatus.FAILED, CheckpointStatus.ABORTED) else None),
        "failure_message": s.failure or None,
    }


def _pending_entry(tr: "JobTracker", cid: int) -> dict[str, Any]:
    return entry(tr.stat_of(tr.pending[cid], CheckpointStatus.IN_PROGRESS))


def subtask(s: SubtaskStat) -> dict[str, Any]:
    return {"task": s.task, "vertex": s.vertex, "index": s.index, "status": "COMPLETED",
            "ack_timestamp": _ms(s.ack_time), "end_to_end_duration": _num(s.end_to_end_ms),
            "state_size": s.state_size, "persisted_data": s.persisted_bytes,
            "checkpoint": {"sync": _num(s.sync_ms), "async": _num(s.async_ms)},
            "alignment": {"duration": _num(s.alignment_ms), "persisted": s.persisted_bytes},
            "start_delay": _num(s.start_delay_ms), "unaligned_checkpoint": s.unaligned}


def _pending_subtasks(tr: "JobTracker", acked: dict[str, SubtaskStat]) -> list[dict[str, Any]]:
    out = []
    for k, t in tr.tasks.items():
        if k in acked:
            out.append(subtask(acked[k]))
        else:
            out.append({"task": k, "vertex": t.vertex, "index": t.index, "status": "PENDING", "ack_timestamp": None,
                        "end_to_end_duration": None, "state_size": 0, "persisted_data": 0,
                        "checkpoint": {"sync": 0.0, "async": 0.0}, "alignment": {"duration": 0.0, "persisted": 0},
                        "start_delay": 0.0, "unaligned_checkpoint": False})
    return sorted(out, key=lambda d: (d["vertex"], d["index"]))


def counts(tr: "JobTracker") -> dict[str, int]:
    """The checkpoints by status. ("failed" as Flink counts it: every checkpoint that did not
    complete; "expired" and "aborted" split it, as the history's statuses do.)"""
    by = tr.history.counts
    completed, expired, aborted = (by.get(s, 0) for s in (CheckpointStatus.COMPLETED, CheckpointStatus.FAILED,
                                                          CheckpointStatus.ABORTED))
    return {"restored": tr.restored, "total": completed + expired + aborted + len(tr.pending),
            "in_progress": len(tr.pending), "completed": completed, "failed": expired + aborted,
            "expired": expired, "aborted": aborted}


def checkpoints(tr: "JobTracker") -> dict[str, Any]:
    completed, failed = tr.history.completed[-KEEP_CHECKPOINT_STATS:], tr.history.failed
    savepoints = [s for s in completed if s.mode == "savepoint"]
    history = [_pending_entry(tr, c) for c in sorted(tr.pending, reverse=True)]
    history += [entry(s) for s in reversed(tr.history.ended()[-HISTORY:])]
    return {
        "counts": counts(tr),
        "summary": {
            "end_to_end_duration": _summary([s.duration_ms for s in completed]),
            "state_size": _summary([s.state_size for s in completed]),
            "checkpointed_size": _summary([s.bytes for s in completed]),
            "persisted_data": _summary([s.inflight_bytes for s in completed]),
        },
        "latest": {"completed": entry(completed[-1]) if completed else None,
                   "savepoint": entry(savepoints[-1]) if savepoints else None,
                   "failed": entry(failed[-1]) if failed else None,
                   "restored": tr.latest_restored},
        "history": history[:HISTORY],
    }


def checkpoint(tr: "JobTracker", cid: int) -> dict[str, Any] | None:
    """One checkpoint with its subtasks; None if it is not (or no longer) known."""
    if cid in tr.pending:
        return {**_pending_entry(tr, cid), "subtasks": _pending_subtasks(tr, tr.pending[cid].subtasks)}
    for s in itertools.chain(reversed(tr.history.completed), reversed(tr.history.failed)):
        if s.checkpoint_id == cid:
            return {**entry(s), "subtasks": [subtask(x) for x in s.subtasks]}
    return None


def _summary(values: list[float] | list[int]) -> dict[str, float | None] | None:
    if not values:
        return None
    ordered = sorted(values)

    def rank(q: float) -> float:  # nearest rank
        return float(ordered[max(0, math.ceil(q * len(ordered)) - 1)])

    return {"min": _num(ordered[0]), "max": _num(ordered[-1]), "avg": _num(sum(ordered) / len(ordered)),
            "p50": _num(rank(0.5)), "p99": _num(rank(0.99))}


def _num(x: float) -> float | None:
    """Rounded to a microsecond of a millisecond; None for what JSON cannot hold (inf, nan)."""
    x = float(x)
    return round(x, 3) if math.isfinite(x) else None


def _ms(t: float) -> int:
    return int(t * 1000)
