"""The simulated jobs: their tasks and channels as the compiler's plan types (TaskSpec,
ChannelSpec, OutputSpec), and the user code they run (a replayable source, a keyed
counter, a loop step and a two-phase-commit sink) as ordinary operators.

dag/dag3: p sources -> hash exchange -> p keyed counters -> one sink. cycle: a source ->
hash exchange -> two step tasks whose main output loops back to them (back-edges, hashed)
and whose side output leaves the loop to a sink. Every record is routed by the runtime's
own ``Output`` (key groups), as in a job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from operators.base import Operator, Source

from ..plan import ChannelSpec, OutputSpec, TaskSpec

TOPOLOGIES = ("dag", "cycle", "dag3")


@dataclass(frozen=True)
class Topology:
    name: str
    kinds: dict[str, str]  #: task -> "source" | "counter" | "step" | "sink"
    specs: dict[str, TaskSpec]
    keys: dict[tuple[str, int], Callable[[Any], Any]]  #: (producer, edge) -> key function
    loops: dict[int, tuple[frozenset[str], frozenset[str]]]  #: as plan.loops(): (inside, feeders)

    @property
    def channels(self) -> list[ChannelSpec]:
        return [c for s in self.specs.values() for c in s.inputs]


def _key_of_token(record: Any) -> Any:
    return record[0] + record[1]  # (id, n, n0): a token lands on another step each trip


def _key_of_id(record: Any) -> Any:
    return record[0]


def _key_itself(record: Any) -> Any:
    return record


def build_topology(name: str) -> Topology:
    edges: list[tuple[str, list[str], bool, bool]] = []  #: (producer, consumers, back-edge, side output)
    keys: dict[tuple[str, int], Callable[[Any], Any]] = {}
    loops: dict[int, tuple[frozenset[str], frozenset[str]]] = {}
    if name in ("dag", "dag3"):
        p = 3 if name == "dag3" else 2
        srcs, cnts = [f"src{i}" for i in range(p)], [f"count{i}" for i in range(p)]
        kinds = {**{s: "source" for s in srcs}, **{c: "counter" for c in cnts}, "sink": "sink"}
        for s in srcs:
            edges.append((s, cnts, False, False))
            keys[(s, 0)] = _key_itself
        for c in cnts:
            edges.append((c, ["sink"], False, False))
            keys[(c, 0)] = _key_itself
    elif name == "cycle":
        steps = ["step0", "step1"]
        kinds = {"src0": "source", "step0": "step", "step1": "step", "sink": "sink"}
        edges.append(("src0", steps, False, False))
        keys[("src0", 0)] = _key_of_id
        for s in steps:
            edges.append((s, steps, True, False))
            keys[(s, 0)] = _key_of_token
            edges.append((s, ["sink"], False, True))
            keys[(s, 1)] = _key_itself
        loops[0] = (frozenset(steps), frozenset({"src0"}))
    else:
        raise ValueError(f"unknown topology {name!r}")
    inputs: dict[str, list[ChannelSpec]] = {t: [] for t in kinds}
    outputs: dict[str, list[OutputSpec]] = {t: [] for t in kinds}
    for edge, (producer, consumers, back, side) in enumerate(edges):
        ids = tuple(f"{producer}->{c}" for c in consumers)
        for cid, c in zip(ids, consumers):
            inputs[c].append(ChannelSpec(cid, producer, c, edge, back))
        port = len(outputs[producer])
        outputs[producer].append(OutputSpec(edge, "hash" if len(consumers) > 1 else "forward", consumers[0], ids, side))
        if (producer, port) not in keys:
            keys[(producer, port)] = _key_itself
    specs = {t: TaskSpec(t, t, 0, 1, tuple(inputs[t]), tuple(outputs[t])) for t in kinds}
    return Topology(name, kinds, specs, keys, loops)


# ---- the user code: deterministic state, msgpack-encodable -----------------------------


class SimSource(Source[Any]):
    """Replayable input; the offset is the state. dag records are keys; cycle records are
    tokens (id, amount left, initial amount). ``size()`` draws each batch's size."""

    def __init__(self, items: list[Any], size: Callable[[], int]):
        self.items, self.size, self.pos = items, size, 0

    def read_batch(self) -> list[Any] | None:
        if self.pos >= len(self.items):
            return None
        batch = self.items[self.pos : self.pos + self.size()]
        self.pos += len(batch)
        return batch

    def snapshot(self, checkpoint_id: int) -> Any:
        return {"pos": self.pos}

    def restore(self, state: Any) -> None:
        self.pos = int(state["pos"])


class Counter(Operator):
    """Per-key running counts; emits (key, count so far) for every record."""

    def __init__(self) -> None:
        self.counts: dict[Any, int] = {}

    def process(self, batch: list[Any]) -> list[Any]:
        counts, out = self.counts, []
        for rec in batch:
            counts[rec] = n = counts.get(rec, 0) + 1
            out.append((rec, n))
        return out

    def snapshot(self, checkpoint_id: int) -> Any:
        return {"counts": dict(self.counts)}

    def restore(self, state: Any) -> None:
        self.counts = dict(state["counts"])


class Step(Operator):
    """A token (id, n, n0) pays one unit into the balance and goes round the loop with n-1;
    at n == 0 it leaves the loop (the side output) as (id, n0)."""

    def __init__(self) -> None:
        self.balance = 0
        self.exits: list[Any] = []

    def process(self, batch: list[Any]) -> list[Any]:
        out = []
        for rid, n, n0 in batch:
            if n == 0:
                self.exits.append((rid, n0))
            else:
                self.balance += 1
                out.append((rid, n - 1, n0))
        return out

    def take_side_output(self) -> list[Any]:
        exits, self.exits = self.exits, []
        return exits

    def snapshot(self, checkpoint_id: int) -> Any:
        return {"balance": self.balance}

    def restore(self, state: Any) -> None:
        self.balance = int(state["balance"])


class TwoPhaseSink(Operator):
    """Two-phase commit like FileSink: staged per epoch in the snapshot, published on
    notify-complete; restore truncates the output to the committed length and publishes
    the pending epochs again. ``transactional=False`` is the deliberate bug: at least once."""

    def __init__(self, output: list[Any], transactional: bool = True):
        self.output, self.transactional = output, transactional
        self.buffer: list[Any] = []
        self.pending: list[tuple[int, tuple[Any, ...]]] = []
        self.published = 0

    def process(self, batch: list[Any]) -> list[Any]:
        recs = [tuple(r) for r in batch]  # records cross channels as msgpack arrays
        if self.transactional:
            self.buffer.extend(recs)
        else:
            self.output.extend(recs)
            self.published += len(recs)
        return []

    def snapshot(self, checkpoint_id: int) -> Any:
        if self.buffer:
            self.pending.append((checkpoint_id, tuple(self.buffer)))
            self.buffer = []
        return {"published": self.published, "pending": list(self.pending)}

    def restore(self, state: Any) -> None:
        self.published = state["published"]
        # State decodes arrays as lists (codec.unpack_state); records are tuples.
        self.pending = [(int(e), tuple(tuple(r) if isinstance(r, list) else r for r in recs))
                        for e, recs in state["pending"]]
        if self.transactional:
            del self.output[self.published :]
            self._publish(None)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._publish(checkpoint_id)

    def _publish(self, upto: int | None) -> None:
        ready = [e for e in self.pending if upto is None or e[0] <= upto]
        self.pending = [e for e in self.pending if e not in ready]
        for _, recs in ready:
            self.output.extend(recs)
            self.published += len(recs)
