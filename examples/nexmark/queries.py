"""Nexmark queries q0-q3 as dataflows, and their batch oracles (q5, q7 and q8, over event
time, are in windowed.py; QUERIES has them all).

- q0 pass-through: every bid.
- q1 currency conversion: every bid with its price in euros (``0.908 * price``).
- q2 selection: ``[auction, price]`` of the bids on auctions whose id is a multiple of 123.
- q3 local item suggestion (a join): ``[name, city, state, auction]`` for every auction of
  category 10 whose seller lives in Oregon, Idaho or California. An incremental two-input
  join keyed by person id: a person's details wait in keyed state for their auctions, and
  auctions that arrive before their seller wait for the seller.

Each ``build_*(events, sink, parallelism, seed, rate)`` ends in ``sink``; ``oracle_*(events,
seed, rate)`` computes the same output in plain Python from the same generated events. Outputs are
compared as multisets (a parallel job interleaves its subtasks' records).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

from abs_engine import Dataflow
from operators import Sink, Source
from operators.nexmark import AUCTION, BID, DEFAULT_RATE, PERSON, NexmarkSource, events

from .windowed import build_q5, build_q7, build_q8, oracle_q5, oracle_q7, oracle_q8, plain_q5, plain_q7, plain_q8

EURO_RATE = 0.908
Q3_STATES = ("OR", "ID", "CA")
Q3_CATEGORY = 10

Event = list[Any]


def is_bid(e: Event) -> bool:
    return bool(e[0] == BID)


def to_euro(e: Event) -> Event:
    return [e[1], e[2], EURO_RATE * e[3], e[6]]


def q2_pick(e: Event) -> bool:
    return bool(e[0] == BID and e[1] % 123 == 0)


def q2_project(e: Event) -> Event:
    return [e[1], e[3]]


def q3_side(e: Event) -> bool:
    """The persons and auctions q3 joins."""
    return bool((e[0] == PERSON and e[6] in Q3_STATES) or (e[0] == AUCTION and e[9] == Q3_CATEGORY))


def q3_key(e: Event) -> int:
    return int(e[1] if e[0] == PERSON else e[8])


def q3_join(state: Any, e: Event) -> tuple[Any, list[Event]]:
    """State per person id: ``[person or None, auction ids waiting for it]``."""
    person, waiting = state if state is not None else (None, [])
    if e[0] == PERSON:
        person = [e[2], e[5], e[6]]
        out = [[*person, a] for a in waiting]
        return [person, []], out
    if person is not None:
        return [person, waiting], [[*person, e[1]]]
    return [person, [*waiting, e[1]]], []


def _source(flow: Dataflow, count: int, parallelism: int, seed: int, rate: int, source: Source[Event] | None) -> Any:
    """The Nexmark stream (``source``: the same events from elsewhere, e.g. a test's gated
    source, as in windowed.py)."""
    return flow.source(source if source is not None else NexmarkSource(count, seed, rate), "nexmark",
                       parallelism=parallelism)


def build_q0(count: int, sink: Sink, parallelism: int = 2, seed: int = 0,
             rate: int = DEFAULT_RATE, source: Source[Event] | None = None,
             sink_parallelism: int | None = 1) -> Dataflow:
    flow = Dataflow("nexmark-q0", parallelism=parallelism)
    _source(flow, count, parallelism, seed, rate, source).filter(is_bid, "bids").sink(sink, "out", parallelism=sink_parallelism)
    return flow


def build_q1(count: int, sink: Sink, parallelism: int = 2, seed: int = 0,
             rate: int = DEFAULT_RATE, source: Source[Event] | None = None,
             sink_parallelism: int | None = 1) -> Dataflow:
    flow = Dataflow("nexmark-q1", parallelism=parallelism)
    _source(flow, count, parallelism, seed, rate, source).filter(is_bid, "bids").map(to_euro, "euro").sink(sink, "out", parallelism=sink_parallelism)
    return flow


def build_q2(count: int, sink: Sink, parallelism: int = 2, seed: int = 0,
             rate: int = DEFAULT_RATE, source: Source[Event] | None = None,
             sink_parallelism: int | None = 1) -> Dataflow:
    flow = Dataflow("nexmark-q2", parallelism=parallelism)
    _source(flow, count, parallelism, seed, rate, source).filter(q2_pick, "pick").map(q2_project, "project").sink(sink, "out", parallelism=sink_parallelism)
    return flow


def build_q3(count: int, sink: Sink, parallelism: int = 2, seed: int = 0,
             rate: int = DEFAULT_RATE, source: Source[Event] | None = None,
             sink_parallelism: int | None = 1) -> Dataflow:
    flow = Dataflow("nexmark-q3", parallelism=parallelism)
    (_source(flow, count, parallelism, seed, rate, source).filter(q3_side, "sides").key_by(q3_key)
     .stateful_map(q3_join, "join").flat_map(lambda kv: kv[1], "results").sink(sink, "out", parallelism=sink_parallelism))
    return flow


# The plain single-process implementations: each query over a sequence of events, in one
# loop of plain Python. They are the batch oracles (``oracle_*`` runs them over the
# generated events) and the per-core baseline of benchmarks/nexmark_bench.py.


def plain_q0(evs: Iterable[Event]) -> list[Event]:
    return list(rows_q0(evs))


def plain_q1(evs: Iterable[Event]) -> list[Event]:
    return list(rows_q1(evs))


def plain_q2(evs: Iterable[Event]) -> list[Event]:
    return list(rows_q2(evs))


def plain_q3(evs: Iterable[Event]) -> list[Event]:
    return list(rows_q3(evs))


# The same queries as generators of their rows: what a plain loop that hands each row on
# (and keeps none) does; the benchmark times these, as the engine's runs end in a sink
# that keeps nothing.


def rows_q0(evs: Iterable[Event]) -> Iterator[Event]:
    return (e for e in evs if e[0] == BID)


def rows_q1(evs: Iterable[Event]) -> Iterator[Event]:
    return ([e[1], e[2], EURO_RATE * e[3], e[6]] for e in evs if e[0] == BID)


def rows_q2(evs: Iterable[Event]) -> Iterator[Event]:
    return ([e[1], e[3]] for e in evs if e[0] == BID and e[1] % 123 == 0)


def rows_q3(evs: Iterable[Event]) -> Iterator[Event]:
    """As the dataflow does it, incrementally: a person waits for their auctions, an
    auction for its seller."""
    people: dict[int, list[Any]] = {}
    waiting: dict[int, list[int]] = {}
    for e in evs:
        if e[0] == PERSON:
            if e[6] in Q3_STATES:
                person = people[e[1]] = [e[2], e[5], e[6]]
                for a in waiting.pop(e[1], ()):
                    yield [*person, a]
        elif e[0] == AUCTION and e[9] == Q3_CATEGORY:
            seller = people.get(e[8])
            if seller is not None:
                yield [*seller, e[1]]
            else:
                waiting.setdefault(e[8], []).append(e[1])


def oracle_q0(count: int, seed: int = 0, rate: int = DEFAULT_RATE) -> list[Event]:
    return plain_q0(events(count, seed, rate))


def oracle_q1(count: int, seed: int = 0, rate: int = DEFAULT_RATE) -> list[Event]:
    return plain_q1(events(count, seed, rate))


def oracle_q2(count: int, seed: int = 0, rate: int = DEFAULT_RATE) -> list[Event]:
    return plain_q2(events(count, seed, rate))


def oracle_q3(count: int, seed: int = 0, rate: int = DEFAULT_RATE) -> list[Event]:
    return plain_q3(events(count, seed, rate))


QUERIES: dict[str, tuple[Callable[..., Dataflow], Callable[..., list[Event]]]] = {
    "q0": (build_q0, oracle_q0), "q1": (build_q1, oracle_q1), "q2": (build_q2, oracle_q2), "q3": (build_q3, oracle_q3),
    "q5": (build_q5, oracle_q5), "q7": (build_q7, oracle_q7), "q8": (build_q8, oracle_q8),
}
EVENT_TIME = ("q5", "q7", "q8")  #: the windowed queries (windowed.py)
#: Each query's plain single-process implementation over a sequence of events (its rows
#: as a list: the oracle; ROWS: as a generator).
PLAIN: dict[str, Callable[[Iterable[Event]], list[Event]]] = {
    "q0": plain_q0, "q1": plain_q1, "q2": plain_q2, "q3": plain_q3, "q5": plain_q5, "q7": plain_q7, "q8": plain_q8,
}
ROWS: dict[str, Callable[[Iterable[Event]], Iterable[Event]]] = {
    **PLAIN, "q0": rows_q0, "q1": rows_q1, "q2": rows_q2, "q3": rows_q3,  # (q5-q8 emit a row a window: lists)
}


def canonical(records: list[Any]) -> list[str]:
    """A multiset as a sorted list, for comparing outputs whatever their order (tuples and
    lists alike: a sink may read msgpack arrays back as either)."""
    return sorted(repr(_lists(r)) for r in records)


def _lists(v: Any) -> Any:
    return [_lists(x) for x in v] if isinstance(v, (list, tuple)) else v
