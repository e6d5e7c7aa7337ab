"""Nexmark events (persons, auctions, bids) and a replayable source of them.

After the Nexmark benchmark's generator (Tucker et al.; the Beam and Flink generators): of
every 50 events 1 is a person, 3 are auctions and 46 are bids; ids start at 1000; bids go
to a hot auction half of the time and come from a hot bidder three times in four; sellers
are hot three times in four; at most 1,000 people are active and 100 auctions in flight;
prices are ``round(10 ** (6 * u) * 100)`` cents. Event ``n`` happens at
``BASE_TIME + n * 1000 // rate`` ms (event time; 10,000 events a second by default).

Every event is a pure function of ``(seed, n)``: a subtask can generate any share of the
stream, replay it from an offset after a restore, and be rescaled, and a test's batch oracle
generates the very same events. Where this differs from the specification: the ``extra``
padding fields are left out, and an auction's expiry is drawn uniformly (2 to 20 seconds of
event time) rather than from the count of auctions in flight.

Events travel as lists (msgpack keeps no tuples):
- person  ``["P", id, name, email, credit_card, city, state, date_time]``
- auction ``["A", id, item_name, description, initial_bid, reserve, date_time, expires, seller, category]``
- bid     ``["B", auction, bidder, price, channel, url, date_time]``
"""

from __future__ import annotations

import random
from typing import Any, Iterator, Sequence

from .generators import IndexSource

PERSON, AUCTION, BID = "P", "A", "B"
PERSON_PROPORTION, AUCTION_PROPORTION, BID_PROPORTION = 1, 3, 46
TOTAL_PROPORTION = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION
FIRST_PERSON_ID, FIRST_AUCTION_ID, FIRST_CATEGORY_ID, NUM_CATEGORIES = 1000, 1000, 10, 5
HOT_AUCTION_RATIO, HOT_BIDDER_RATIO, HOT_SELLER_RATIO = 2, 4, 4
NUM_ACTIVE_PEOPLE, NUM_IN_FLIGHT_AUCTIONS, PERSON_ID_LEAD, AUCTION_ID_LEAD = 1000, 100, 10, 10
BASE_TIME = 1_700_000_000_000  #: ms since the epoch of event 0
DEFAULT_RATE = 10_000  #: events per second of event time

US_STATES = ["AZ", "CA", "ID", "OR", "WA", "WY"]
US_CITIES = ["Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent",
             "Cheyenne"]
FIRST_NAMES = ["Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter"]
LAST_NAMES = ["Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris"]
CHANNELS = ["Google", "Facebook", "Baidu", "Apple"]


def kind_of(n: int) -> str:
    offset = n % TOTAL_PROPORTION
    return PERSON if offset < PERSON_PROPORTION else AUCTION if offset < PERSON_PROPORTION + AUCTION_PROPORTION else BID


def last_person(n: int) -> int:
    """Base-0 id of the newest person at or before event ``n``."""
    epoch, offset = divmod(n, TOTAL_PROPORTION)
    return epoch * PERSON_PROPORTION + min(offset, PERSON_PROPORTION - 1)


def last_auction(n: int) -> int:
    """Base-0 id of the newest auction at or before event ``n`` (-1: none yet)."""
    epoch, offset = divmod(n, TOTAL_PROPORTION)
    if offset < PERSON_PROPORTION:
        epoch, offset = epoch - 1, AUCTION_PROPORTION - 1
    elif offset >= PERSON_PROPORTION + AUCTION_PROPORTION:
        offset = AUCTION_PROPORTION - 1
    else:
        offset -= PERSON_PROPORTION
    return epoch * AUCTION_PROPORTION + offset


def _some_person(n: int, rnd: random.Random) -> int:
    people = last_person(n) + 1
    active = min(people, NUM_ACTIVE_PEOPLE)
    return people - active + rnd.randrange(active + PERSON_ID_LEAD)


def _some_auction(n: int, rnd: random.Random) -> int:
    newest = max(last_auction(n), 0)
    oldest = max(newest - NUM_IN_FLIGHT_AUCTIONS, 0)
    return oldest + rnd.randrange(newest - oldest + 1 + AUCTION_ID_LEAD)


def _price(rnd: random.Random) -> int:
    return int(round(float(10.0 ** (rnd.random() * 6.0)) * 100.0))


def timestamp(n: int, rate: int = DEFAULT_RATE) -> int:
    return BASE_TIME + n * 1000 // rate


def event(n: int, seed: int = 0, rate: int = DEFAULT_RATE) -> list[Any]:
    """Event number ``n`` of the stream of ``seed``."""
    rnd = random.Random(seed * 1_000_003 + n)
    ts = timestamp(n, rate)
    kind = kind_of(n)
    if kind == PERSON:
        pid = last_person(n) + FIRST_PERSON_ID
        name = f"{rnd.choice(FIRST_NAMES)} {rnd.choice(LAST_NAMES)}"
        return [PERSON, pid, name, f"{name.replace(' ', '.').lower()}@example.com",
                " ".join(f"{rnd.randrange(10_000):04d}" for _ in range(4)), rnd.choice(US_CITIES),
                rnd.choice(US_STATES), ts]
    if kind == AUCTION:
        aid = last_auction(n) + FIRST_AUCTION_ID
        seller = ((last_person(n) // HOT_SELLER_RATIO) * HOT_SELLER_RATIO if rnd.randrange(HOT_SELLER_RATIO)
                  else _some_person(n, rnd)) + FIRST_PERSON_ID
        initial = _price(rnd)
        return [AUCTION, aid, f"item-{aid}", f"description of item {aid}", initial, initial + _price(rnd), ts,
                ts + rnd.randrange(2_000, 20_000), seller, FIRST_CATEGORY_ID + rnd.randrange(NUM_CATEGORIES)]
    auction = ((max(last_auction(n), 0) // HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO if rnd.randrange(HOT_AUCTION_RATIO)
               else _some_auction(n, rnd)) + FIRST_AUCTION_ID
    bidder = ((last_person(n) // HOT_BIDDER_RATIO) * HOT_BIDDER_RATIO + 1 if rnd.randrange(HOT_BIDDER_RATIO)
              else _some_person(n, rnd)) + FIRST_PERSON_ID
    channel = rnd.choice(CHANNELS)
    return [BID, auction, bidder, _price(rnd), channel, f"https://www.nexmark.com/{channel.lower()}/item.htm?query=1",
            ts]


def events(count: int, seed: int = 0, rate: int = DEFAULT_RATE) -> Iterator[list[Any]]:
    """The first ``count`` events, in order: what a batch oracle reads."""
    return (event(n, seed, rate) for n in range(count))


class NexmarkSource(IndexSource[list[Any]]):
    """The first ``count`` Nexmark events; subtask k of p generates events n with
    n % p == k, in order. An IndexSource: it replays from a checkpoint and rescales."""

    def __init__(self, count: int, seed: int = 0, rate: int = DEFAULT_RATE, batch_size: int = 1000):
        if count < 0 or rate <= 0 or batch_size <= 0:
            raise ValueError(f"NexmarkSource needs count >= 0, rate > 0 and batch_size > 0 (got {count}, {rate}, "
                             f"{batch_size})")
        self.count, self.seed, self.rate, self.batch_size = count, seed, rate, batch_size

    def records(self, indices: Sequence[int]) -> list[list[Any]]:
        seed, rate = self.seed, self.rate
        return [event(n, seed, rate) for n in indices]
