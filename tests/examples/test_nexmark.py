"""Nexmark q0-q3, q5, q7 and q8 exactly once: each query's output, with workers SIGKILLed
right after checkpoints, equals its plain Python batch oracle over the same generated events;
q3's join state and q5's windows and timers also survive a rescale."""

from __future__ import annotations

import pytest

from abs_engine.testing import CapturingSink, GatedSource, KillOnCheckpoints
from operators.nexmark import DEFAULT_RATE, NexmarkSource
from examples.nexmark.queries import EVENT_TIME, QUERIES, canonical
from tests.chaos_checks import assert_each_kill_restored

pytestmark = pytest.mark.slow

EVENTS = 40_000
#: The windowed queries run at 1,000 events a second of event time: 40 s, so several windows.
RATE = 1_000


def rate_of(query: str) -> dict[str, int]:
    return {"rate": RATE} if query in EVENT_TIME else {}


@pytest.mark.parametrize("parallelism", [1, 2])
@pytest.mark.parametrize("query", sorted(QUERIES))
def test_query_exactly_once_under_sigkill(tmp_path, query, parallelism):
    """Each source subtask holds an eighth of the way in until both kills are made (the gate
    the chaos opens), so the kills land mid-job however fast the machine runs it."""
    build, oracle = QUERIES[query]
    sink, gate = CapturingSink(tmp_path / "out"), tmp_path / "gate"
    chaos = KillOnCheckpoints([1, 3], seed=parallelism, open_gate=gate)
    held = GatedSource(NexmarkSource(EVENTS, 5, rate_of(query).get("rate", DEFAULT_RATE)), gate, after=EVENTS // 8)
    res = build(EVENTS, sink, parallelism, 5, **rate_of(query), source=held).run(
        chaos=chaos, restart_delay=0, checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / "ck"))
    assert_each_kill_restored(res, chaos, min_kills=len(chaos.after))  # (all mid-job: held)
    assert res.skipped_records == 0  # no record was late: the watermarks only trail each source's newest
    expected = canonical(oracle(EVENTS, 5, **rate_of(query)))
    assert expected  # the query selects something from these events
    assert canonical(sink.records()) == expected


@pytest.mark.parametrize("query", ["q3", "q5"])
def test_keyed_state_rescales(tmp_path, query):
    """Cancel the query at parallelism 2 after three checkpoints (q3's join holds persons and
    waiting auctions; q5's two window stages hold windows, timers and watermarks), resume it
    at parallelism 3: the results are exactly the oracle's. The first run holds each source
    subtask half-way until the test opens the gate, so it is always stopped mid-job."""
    build, oracle = QUERIES[query]
    sink, gate = CapturingSink(tmp_path / "out"), tmp_path / "gate"

    def held() -> GatedSource[list[object]]:  # the events the query would generate itself
        return GatedSource(NexmarkSource(EVENTS, 5, rate_of(query).get("rate", DEFAULT_RATE)), gate, after=EVENTS // 4)

    first = build(EVENTS, sink, 2, 5, **rate_of(query), source=held()).run(
        checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / "ck1"), stop_when=lambda r: r.checkpoints_completed >= 3)
    assert first.cancelled and first.checkpoints_completed >= 3
    latest = first.checkpoints[-1].checkpoint_id
    gate.touch()
    res = build(EVENTS, sink, 3, 5, **rate_of(query), source=held()).run(
        checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / "ck1"), resume=True)
    assert res.restored_from and res.restored_from[0] == latest
    assert canonical(sink.records()) == canonical(oracle(EVENTS, 5, **rate_of(query)))
