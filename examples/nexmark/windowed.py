"""Nexmark's event-time queries q5, q7 and q8 as dataflows, and their batch oracles.

Event time is an event's ``date_time`` (ms since the epoch); each source subtask reads its
events in order, so its watermark is ``ascending()``: the newest timestamp - 1. Windows are
``[start, start + size)`` with starts at multiples of the slide (or size) since the epoch.

- q5 hot items: over sliding windows of 10 s every 2 s, the auctions with the most bids.
  Stage 1 counts bids per auction and window, keyed by auction (spread over the subtasks;
  its aggregate merges, so the windows are kept as 2 s panes: one update a bid, not five);
  stage 2 keys those counts by window end and keeps the largest, in a tumbling window of
  the slide on timestamp ``end - 1``: it fires on the very watermark that fired stage 1,
  after every subtask's counts for that window arrived (each sends its results before
  the watermark that fired them, on FIFO channels). One row per window:
  ``[end, sorted auctions with the max count, max count]``.
- q7 highest bid: per tumbling 10 s window, the bid with the greatest
  ``(price, bidder, auction, date_time)``; a per-auction maximum first, then the maximum of
  those per window end, as in q5. One row per window: ``[end, [auction, price, bidder,
  date_time]]``.
- q8 monitor new users: the people who opened an auction in the same tumbling 10 s window
  as they registered. Persons and auctions, keyed by person id and seller, meet in a
  process-window function (a window join). One row per such person and window:
  ``[person id, name, window start]``.

Bids are projected to the fields a query reads before they are shuffled (as a query planner
would): less to encode and send. The rows are the ones ``benchmarks/bytewax_nexmark.py``
checks Bytewax's output against.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any, Iterable

from abs_engine import Dataflow
from operators import Sink, Source
from operators.eventtime import ascending
from operators.nexmark import AUCTION, BID, DEFAULT_RATE, PERSON, NexmarkSource, events
from operators.windows import SlidingWindows, TumblingWindows

Q5_SIZE, Q5_SLIDE, Q7_SIZE, Q8_SIZE = 10_000, 2_000, 10_000, 10_000

Event = list[Any]


def event_time(e: Event) -> int:
    """A person's, auction's or bid's ``date_time``."""
    return int(e[7] if e[0] == PERSON else e[6])


def _events(flow: Dataflow, count: int, parallelism: int, seed: int, rate: int, source: Source[Event] | None) -> Any:
    """The Nexmark stream in event time (``source``: the same events from elsewhere, e.g. a
    TestingSource over a list generated beforehand, as a benchmark reads them)."""
    return flow.source(source if source is not None else NexmarkSource(count, seed, rate), "nexmark",
                       parallelism=parallelism, timestamps=event_time, watermarks=ascending())


def _end_minus_one(r: Any) -> int:
    """A window result ``(key, start, end, value)``'s timestamp: its window's last one."""
    return int(r[2]) - 1


def _window_end(r: Any) -> int:
    return int(r[2])


# -- q5 -------------------------------------------------------------------------------------


def q5_bid(e: Event) -> list[list[int]]:
    """A bid as ``[auction, date_time]``, the two fields q5 reads (projected before the
    shuffle, as a query planner would: less to encode and send); nothing for others."""
    return [[e[1], e[6]]] if e[0] == BID else []


def _first(b: list[Any]) -> Any:
    return b[0]


def _second(b: list[Any]) -> int:
    return int(b[1])


def _zero() -> int:
    return 0


def _plus_one(n: int, e: Event) -> int:
    return n + 1


def _sum(a: int, b: int) -> int:
    return a + b


def _hot_new() -> list[Any]:
    return [0, []]


def _hot_add(acc: list[Any], r: Any) -> list[Any]:
    """``acc = [max count, auctions with it]``; ``r = (auction, start, end, count)``."""
    if r[3] > acc[0]:
        return [r[3], [r[0]]]
    if r[3] == acc[0]:
        acc[1].append(r[0])
    return acc


def _q5_row(r: Any) -> list[Any]:
    end, (top, auctions) = r[0], r[3]
    return [end, sorted(auctions), top]


def build_q5(count: int, sink: Sink, parallelism: int = 2, seed: int = 0, rate: int = DEFAULT_RATE,
             source: Source[Event] | None = None,
             sink_parallelism: int | None = 1) -> Dataflow:
    flow = Dataflow("nexmark-q5", parallelism=parallelism)
    (_events(flow, count, parallelism, seed, rate, source).flat_map(q5_bid, "bids")
     .key_by(_first).window(SlidingWindows(Q5_SIZE, Q5_SLIDE), _second).aggregate(_zero, _plus_one, merge=_sum, name="bids_per_auction")
     .key_by(_window_end).window(TumblingWindows(Q5_SLIDE), _end_minus_one).aggregate(_hot_new, _hot_add, name="hottest")
     .map(_q5_row, "row").sink(sink, "out", parallelism=sink_parallelism))
    return flow


def oracle_q5(count: int, seed: int = 0, rate: int = DEFAULT_RATE) -> list[Event]:
    return plain_q5(events(count, seed, rate))


def plain_q5(evs: Iterable[Event]) -> list[Event]:
    counts: dict[int, Counter[int]] = defaultdict(Counter)
    for e in evs:
        if e[0] == BID:
            last = e[6] - e[6] % Q5_SLIDE
            for start in range(last, e[6] - Q5_SIZE, -Q5_SLIDE):
                counts[start + Q5_SIZE][e[1]] += 1
    rows = []
    for end, c in counts.items():
        top = max(c.values())
        rows.append([end, sorted(a for a, n in c.items() if n == top), top])
    return rows


# -- q7 -------------------------------------------------------------------------------------


def q7_bid(e: Event) -> list[list[int]]:
    """A bid as ``[auction, price, bidder, date_time]`` (projected before the shuffle)."""
    return [[e[1], e[3], e[2], e[6]]] if e[0] == BID else []


def _rank(b: list[Any]) -> tuple[int, int, int, int]:
    """Of a projected bid: ``(price, bidder, auction, date_time)``."""
    return b[1], b[2], b[0], b[3]


def _fourth(b: list[Any]) -> int:
    return int(b[3])


def _higher_bid(a: list[Any], b: list[Any]) -> list[Any]:
    return b if (b[1], b[2], b[0], b[3]) > (a[1], a[2], a[0], a[3]) else a  # _rank(b) > _rank(a), inlined


def _higher_result(a: Any, b: Any) -> Any:
    """Of two window results ``(auction, start, end, bid)``, the one with the higher bid."""
    return b if _rank(b[3]) > _rank(a[3]) else a


def _q7_row(r: Any) -> list[Any]:
    return [r[0], list(r[3][3])]


def build_q7(count: int, sink: Sink, parallelism: int = 2, seed: int = 0, rate: int = DEFAULT_RATE,
             source: Source[Event] | None = None,
             sink_parallelism: int | None = 1) -> Dataflow:
    flow = Dataflow("nexmark-q7", parallelism=parallelism)
    (_events(flow, count, parallelism, seed, rate, source).flat_map(q7_bid, "bids")
     .key_by(_first).window(TumblingWindows(Q7_SIZE), _fourth).reduce(_higher_bid, "top_per_auction")
     .key_by(_window_end).window(TumblingWindows(Q7_SIZE), _end_minus_one).reduce(_higher_result, "top")
     .map(_q7_row, "row").sink(sink, "out", parallelism=sink_parallelism))
    return flow


def oracle_q7(count: int, seed: int = 0, rate: int = DEFAULT_RATE) -> list[Event]:
    return plain_q7(events(count, seed, rate))


def plain_q7(evs: Iterable[Event]) -> list[Event]:
    best: dict[int, Event] = {}
    for e in evs:
        if e[0] == BID:
            end = e[6] - e[6] % Q7_SIZE + Q7_SIZE
            b = q7_bid(e)[0]
            if end not in best or _rank(b) > _rank(best[end]):
                best[end] = b
    return [[end, b] for end, b in best.items()]


# -- q8 -------------------------------------------------------------------------------------


def q8_side(e: Event) -> bool:
    return bool(e[0] == PERSON or e[0] == AUCTION)


def q8_key(e: Event) -> int:
    """A person's id, an auction's seller."""
    return int(e[1] if e[0] == PERSON else e[8])


def q8_join(person_id: int, start: int, end: int, records: list[Event]) -> Iterable[list[Any]]:
    if any(r[0] == AUCTION for r in records):
        return [[person_id, r[2], start] for r in records if r[0] == PERSON]
    return []


def build_q8(count: int, sink: Sink, parallelism: int = 2, seed: int = 0, rate: int = DEFAULT_RATE,
             source: Source[Event] | None = None,
             sink_parallelism: int | None = 1) -> Dataflow:
    flow = Dataflow("nexmark-q8", parallelism=parallelism)
    (_events(flow, count, parallelism, seed, rate, source)
     .filter(q8_side, "people_and_auctions").key_by(q8_key).window(TumblingWindows(Q8_SIZE), event_time)
     .process(q8_join, "new_sellers").sink(sink, "out", parallelism=sink_parallelism))
    return flow


def oracle_q8(count: int, seed: int = 0, rate: int = DEFAULT_RATE) -> list[Event]:
    return plain_q8(events(count, seed, rate))


def plain_q8(evs: Iterable[Event]) -> list[Event]:
    people: dict[tuple[int, int], str] = {}
    sold: set[tuple[int, int]] = set()
    for e in evs:
        ts = event_time(e)
        start = ts - ts % Q8_SIZE
        if e[0] == PERSON:
            people[(e[1], start)] = e[2]
        elif e[0] == AUCTION:
            sold.add((e[8], start))
    return [[pid, name, start] for (pid, start), name in people.items() if (pid, start) in sold]
