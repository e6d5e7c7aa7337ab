"""Latency markers (runtime/latency.py): they wait behind the records sent before them, go on
one channel of an edge at a time, never round a loop, leave a job's output alone, and their
ages reach JobResult.latency."""

from __future__ import annotations

import collections
import time
from pathlib import Path

import pytest

from abs_engine import Dataflow
from abs_engine import codec
from abs_engine.errors import ConfigError, ProtocolError
from abs_engine.testing import CapturingSink, TestingSource
from examples import bank

PER_RECORD = 0.005  # the workload: each record costs the slow map 5 ms
BATCH = 10


def slow(x: int) -> int:
    time.sleep(PER_RECORD)  # the workload (a lower bound on the marker's age, not synchronisation)
    return x


def test_a_marker_waits_behind_the_records_sent_before_it(tmp_path: Path) -> None:
    """Each marker leaves the source right after a batch of 10 records; the slow map behind a
    rebalance processes those 10 (50 ms) before it passes the marker to its sink. A marker
    that overtook them (handled before the records gathered ahead of it) would be younger."""
    flow = Dataflow("latency")
    sink = CapturingSink(str(tmp_path / "out"))
    (flow.source(TestingSource(range(120), batch_size=BATCH), "read").rebalance()
     .map(slow, "slow").sink(sink, "out"))
    res = flow.run(executor="inprocess", latency_interval=0.001, checkpoint_dir=str(tmp_path / "ck"))
    assert res.latency is not None and res.latency.samples >= 3, res.latency
    assert res.latency.p50_ms >= BATCH * PER_RECORD * 1000 * 0.99, res.latency
    assert res.latency.p50_ms <= res.latency.p99_ms <= res.latency.max_ms
    assert sorted(sink.records()) == list(range(120))


def test_markers_leave_a_loop_and_a_shuffle_exact_on_processes(tmp_path: Path) -> None:
    """The bank loop (a back-edge) and its shuffles with a marker every millisecond (the
    first right after each source's first read): the output equals the oracle and the
    markers reached the sinks."""
    out = str(tmp_path / "out.tsv")
    res = bank.build_flow(20, 3_000, seed=5, output=out, parallelism=2).run(
        checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / "ck"), latency_interval=0.001)
    assert bank.read_output(out) == bank.oracle(20, 3_000, 5)
    assert res.latency is not None and res.latency.samples >= 1


def test_no_markers_when_switched_off(tmp_path: Path) -> None:
    flow = Dataflow("quiet")
    flow.source(TestingSource(range(50)), "read").rebalance().map(slow, "slow").sink(
        CapturingSink(str(tmp_path / "out")), "out")
    assert flow.run(executor="inprocess", latency_interval=0, checkpoint_dir=str(tmp_path / "ck")).latency is None


@pytest.mark.parametrize("bad", [-1, float("nan"), "1s", True])
def test_a_bad_interval_is_a_config_error_naming_it(tmp_path: Path, bad: object) -> None:
    flow = Dataflow("bad")
    flow.source(TestingSource(range(5)), "read").sink(CapturingSink(str(tmp_path / "out")), "out")
    with pytest.raises(ConfigError, match="latency_interval"):
        flow.run(executor="inprocess", latency_interval=bad)


def test_a_marker_frame_round_trips_and_a_malformed_one_is_a_protocol_error() -> None:
    frame = codec.latency_frame(1234.5)
    reader = codec.FrameReader()
    reader.feed(frame)
    kind, payload = reader.next_frame()  # type: ignore[misc]
    assert kind == codec.FrameKind.LATENCY and codec.parse_latency(payload) == 1234.5
    for bad in ("soon", None, True, [1.0]):
        with pytest.raises(ProtocolError):
            codec.parse_latency(codec.pack(bad))


def test_an_edge_sends_each_marker_on_one_channel_in_turn() -> None:
    from abs_engine.plan import OutputSpec
    from abs_engine.runtime.output import Output

    class Channel:
        def __init__(self) -> None:
            self.sent: list[bytes] = []

        def send(self, data: bytes) -> None:
            self.sent.append(data)

    chans = [Channel() for _ in range(3)]
    spec = OutputSpec(0, "hash", "count", ("a", "b", "c"))
    out = Output(spec, chans, None, "read")  # type: ignore[arg-type]
    for i in range(7):
        out.send_marker(codec.latency_frame(float(i)))
    per_channel = collections.Counter(i for i, c in enumerate(chans) for _ in c.sent)
    assert per_channel == {0: 3, 1: 2, 2: 2}
