"""The Nexmark generator: the specification's proportions and id rules, determinism (the
same events in every process and replay), and a source whose subtasks share the stream
exactly (every event once, at any parallelism, after a rescale too)."""

from __future__ import annotations

import collections
from typing import Any

from operators.generators import Progressions
from operators.nexmark import (AUCTION, BID, FIRST_AUCTION_ID, FIRST_PERSON_ID, PERSON, NexmarkSource, event,
                               last_auction,
                               events, timestamp)


def test_proportions_ids_and_times_follow_the_specification() -> None:
    evs = list(events(50 * 200))
    kinds = collections.Counter(e[0] for e in evs)
    assert kinds == {PERSON: 200, AUCTION: 600, BID: 9200}  # 1 : 3 : 46 of every 50
    people = [e[1] for e in evs if e[0] == PERSON]
    auctions = [e[1] for e in evs if e[0] == AUCTION]
    assert people == list(range(FIRST_PERSON_ID, FIRST_PERSON_ID + 200))  # consecutive, in order
    assert auctions == list(range(FIRST_AUCTION_ID, FIRST_AUCTION_ID + 600))
    assert [e[-1] if e[0] != AUCTION else e[6] for e in evs] == [timestamp(n) for n in range(len(evs))]
    for e in evs:
        if e[0] == AUCTION:
            assert e[8] >= FIRST_PERSON_ID and 10 <= e[9] < 15 and e[5] > e[4] > 0 and e[7] > e[6]
        elif e[0] == BID:
            assert e[1] >= FIRST_AUCTION_ID and e[2] >= FIRST_PERSON_ID and e[3] > 0
    # Half the bids (and a few more by chance) go to the hot auction of the moment.
    hot = sum(e[1] == (last_auction(n) // 2) * 2 + FIRST_AUCTION_ID for n, e in enumerate(evs) if e[0] == BID)
    assert 0.45 < hot / 9200 < 0.6


def test_events_are_a_function_of_seed_and_number() -> None:
    assert event(12345, seed=7) == event(12345, seed=7)
    assert list(events(500, seed=1)) != list(events(500, seed=2))
    assert [event(n) for n in range(300)] == list(events(300))


class Ctx:
    def __init__(self, index: int, parallelism: int):
        self.subtask_index, self.parallelism = index, parallelism


def read_all(src: NexmarkSource, limit: int | None = None) -> list[Any]:
    out: list[Any] = []
    while (batch := src.read_batch()) is not None:
        out += batch
        if limit is not None and len(out) >= limit:
            break
    return out


def test_subtasks_share_the_stream_and_rescale_without_loss_or_duplicate() -> None:
    count = 5000
    subtasks = []
    for k in range(3):
        s = NexmarkSource(count, seed=3, batch_size=97)
        s.open(Ctx(k, 3))  # type: ignore[arg-type]
        subtasks.append(s)
    first = [read_all(s, limit=500) for s in subtasks]
    states = [s.snapshot(1) for s in subtasks]
    rest = []
    for k in range(2):  # rescale 3 -> 2 from the snapshot
        s = NexmarkSource(count, seed=3, batch_size=97)
        s.open(Ctx(k, 2))  # type: ignore[arg-type]
        s.restore(s.rescale_state(states, k, 2, lambda key: True))
        rest += read_all(s)
    got = [e for part in first for e in part] + rest
    assert sorted(map(repr, got)) == sorted(map(repr, events(count, seed=3)))
    assert Progressions.of_subtask(count, 0, 1).todo == [[0, 1]]
