"""The simulation's oracle: what must hold of every completed checkpoint (verified in
storage, retention keeping exactly the newest ``retain`` completed ones, a consistent cut)
and of the sink's output at the end (exactly once, against a batch computation).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from ..checkpoint.metadata import Metadata

if TYPE_CHECKING:
    from .sim import Sim


class SimFailure(Exception):
    """An invariant of the protocol was violated."""


def check_checkpoint(sim: Sim, meta: Metadata) -> None:
    """A completed checkpoint: every task's ack of this attempt, in order, verified, and a consistent cut."""
    cid = meta.checkpoint_id
    missing = sorted(set(sim.tasks) - set(meta.tasks))
    unsent = sorted(t for t in meta.tasks if (cid, t) not in sim.acks_sent)
    if missing or unsent:
        raise SimFailure(f"checkpoint {cid} completed without acks of {missing + unsent}")
    if sim.completed and cid <= max(sim.completed):
        raise SimFailure(f"checkpoint {cid} completed after checkpoint {max(sim.completed)}")
    held, want = sim.storage.completed_ids(), [*sim.completed, cid][-sim.storage.retain:]
    if held != want:
        raise SimFailure(f"retention: after checkpoint {cid} completed, storage holds checkpoints {held}; it must "
                         f"hold the newest {sim.storage.retain} completed, {want}")
    stored = sim.storage.load_metadata(cid)  # verified below: every file read back with every check
    sim.completed.append(cid)
    sim.note(f"completed {cid} final={meta.final}")
    sim.crash_next = sim.rng.random() < sim.crash_after_complete
    # Channel state: what each task logged (back-edges; every input when unaligned).
    states: dict[str, Any] = {}
    logged: dict[str, list[Any]] = {}
    for t in stored.tasks:
        snap = sim.storage.read_snapshot(cid, t, stored)
        states[t] = snap.states[t]
        logged[t] = [r for recs in snap.logs.values() for r in recs]
    sim.stats["channel_state"] += sum(len(v) for t, v in logged.items() if t == "sink" or
                                       sim.topo.kinds[t] == "counter")
    sink = states["sink"]
    staged = sink["published"] + sum(len(recs) for _, recs in sink["pending"])
    emitted = {s: sim.inputs[s][: states[s]["pos"]] for s in sim.sources}
    if sim.topo.name == "cycle":
        money = sum(n0 for recs in emitted.values() for _, _, n0 in recs)
        held = sum(states[t]["balance"] for t, k in sim.topo.kinds.items() if k == "step")
        in_loop = [r for t, k in sim.topo.kinds.items() if k == "step" for r in logged[t]]
        in_flight = sum(n for _, n, _ in in_loop)
        if held + in_flight != money:
            raise SimFailure(f"checkpoint {cid} breaks conservation: balances {held} + logged {in_flight} "
                            f"!= emitted {money}")
        tokens = sum(len(recs) for recs in emitted.values())
        if len(in_loop) + len(logged["sink"]) + staged != tokens:
            raise SimFailure(f"checkpoint {cid}: {len(in_loop)} tokens logged in the loop + "
                            f"{len(logged['sink'])} logged into the sink + {staged} in the sink != {tokens} emitted")
    else:
        expected = Counter(k for recs in emitted.values() for k in recs)
        counts: Counter[int] = Counter()
        for t, k in sim.topo.kinds.items():
            if k == "counter":
                counts.update(states[t]["counts"])
                counts.update(logged[t])  # keys in flight into the counter
        if counts != expected:
            raise SimFailure(f"checkpoint {cid} is not a consistent cut: counters + their channel state "
                            f"{dict(counts)} != records below the offsets {dict(expected)}")
        counted = sum(counts.values()) - sum(len(logged[t]) for t, k in sim.topo.kinds.items() if k == "counter")
        if staged + len(logged["sink"]) != counted:
            raise SimFailure(f"checkpoint {cid}: sink holds {staged} records and {len(logged['sink'])} in "
                            f"flight to it, counters counted {counted}")

def expected_output(sim: Sim) -> Counter[Any]:
    """The batch oracle: what the sink must hold at the end, exactly once."""
    if sim.topo.name == "cycle":
        return Counter((rid, n0) for recs in sim.inputs.values() for rid, _, n0 in recs)
    totals = Counter(k for recs in sim.inputs.values() for k in recs)
    return Counter((k, i) for k, n in totals.items() for i in range(1, n + 1))

def check_final(sim: Sim) -> None:
    if not sim.completed or not sim.storage.load_metadata(max(sim.completed)).final:
        raise SimFailure("the job ended without a completed final checkpoint")
    got, want = Counter(sim.output), expected_output(sim)
    if got != want:
        raise SimFailure(f"sink output is not exactly once: missing {dict(want - got)}, "
                         f"duplicated or extra {dict(got - want)}")
