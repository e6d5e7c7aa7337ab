"""The loops of test_loop_memory.py's memory test, run as a script so that the peak RSS of
their workers is exact:
``python -m tests.abs_engine.executors.loop_memory_job OUT.json SPILL_DIR GUARD_MIB PARALLELISM``.

The driver runs here and its workers are its children: once a job is over they have all
been waited for, so ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` is the peak resident set of
the largest of them (Linux), exactly, not a sample. A fresh process, so no other test's
workers count. Two jobs, one after the other, with the same dataflow and operator:

1. the **baseline**: 20,000 records go round the loop 30 times each and leave (nothing
   to spill: well under loop_memory in flight), batches as large as they get, checkpoints
   on. Its peak is a busy worker's own memory.
2. the **amplifying loop**: every trip round makes two records of one, without end, with
   loop_memory=8 MiB, loop_disk=64 MiB and channel_state_memory=4 MiB. It must fail with
   LoopOverflow. A chaos hook reads the workers' VmHWM (their peak so far) on every turn of
   the driver's loop and stops the job (stop_when) once one passes ``guard_mib`` over the
   baseline, so an engine that does not bound the loop cannot take the machine with it;
   the test fails then. The same happens after 120 s without an outcome.

Written to OUT.json: both peaks (KiB), the amplifying job's error (or that it was stopped
and why), the spill directory's listing afterwards.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from typing import Any

from abs_engine import Dataflow
from abs_engine.errors import JobFailed
from abs_engine.testing import CapturingSink, TestingSource
from operators import Operator

PAD = "p" * 100  #: bytes a record carries, so that a loop's backlog is bytes, fast
MIB = 1 << 20
LOOP_MEMORY = 8 * MIB
LOOP_DISK = 64 * MIB
CHANNEL_STATE_MEMORY = 4 * MIB
BASELINE_RECORDS = 20_000
BASELINE_TRIPS = 30
MAX_SECONDS = 120.0


class Trip(Operator):
    """One trip round the loop: ``copies`` records of each, one trip further; with ``trips``,
    a record that has made that many leaves the loop (tagged "out")."""

    def __init__(self, copies: int, trips: int | None) -> None:
        self.copies = copies
        self.trips = trips

    def process(self, batch: list[Any]) -> list[Any]:
        out: list[Any] = []
        for key, trip, pad in batch:
            if self.trips is not None and trip >= self.trips:
                out.append(("out", key, trip, ""))
                continue
            for c in range(self.copies):
                out.append(("again", (key * self.copies + c) % 20_011, trip + 1, pad))
        return out


def again(r: Any) -> bool:
    return bool(r[0] == "again")


def untag(r: Any) -> Any:
    return (r[1], r[2], r[3])


def build(name: str, seeds: int, copies: int, trips: int | None, sink_dir: str, parallelism: int) -> Dataflow:
    """Seeds -> merge (with the loop's back-edge) -> key_by -> Trip -> back round. At
    parallelism 1 the exchange has one channel, so a batch of n records leaves as one frame
    of n (2n amplified): batches grow trip after trip unless the task cuts frames into
    batches; at 2 the exchange halves every batch, and the backlog grows in frames."""
    flow = Dataflow(name, parallelism=parallelism)
    loop = flow.feedback(name="loop")
    start = flow.source(TestingSource(range(seeds), batch_size=500), name="seeds").map(lambda k: (k, 0, PAD),
                                                                                        name="pad")
    tripped = start.union(loop, name="merge").key_by(lambda r: r[0]).apply_keyed(Trip(copies, trips), name="trip")
    loop.connect(tripped.filter(again, name="again").map(untag, name="untag"))
    tripped.filter(lambda r: r[0] == "out", name="left").sink(CapturingSink(sink_dir), name="sink", parallelism=1)
    return flow


def children_peak_kib() -> int:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss


class MemoryGuard:
    """Chaos hook that kills nothing: on every turn of the driver's loop it reads each
    worker's VmHWM (its peak so far); ``tripped`` once one passes ``limit_kib``."""

    def __init__(self, limit_kib: int) -> None:
        self.limit_kib = limit_kib
        self.peak_kib = 0
        self.tripped = False

    def poll(self, elapsed: float, pids: dict[str, int]) -> None:
        for pid in pids.values():
            try:
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            self.peak_kib = max(self.peak_kib, int(line.split()[1]))
            except OSError:
                continue  # exited meanwhile
        self.tripped = self.tripped or self.peak_kib > self.limit_kib


def main(out_path: str, spill_dir: str, guard_mib: int, parallelism: int) -> None:
    work = os.path.dirname(os.path.abspath(out_path))
    build("loop-baseline", BASELINE_RECORDS, 1, BASELINE_TRIPS, os.path.join(work, "baseline-out"), parallelism).run(
        checkpoint_interval=0.2, channel_state_memory=CHANNEL_STATE_MEMORY, loop_memory=LOOP_MEMORY,
        loop_disk=LOOP_DISK, loop_spill_dir=spill_dir)
    baseline = children_peak_kib()
    guard = MemoryGuard(baseline + guard_mib * 1024)
    began = time.monotonic()
    report: dict[str, Any] = {"baseline_kib": baseline, "guard_kib": guard.limit_kib}
    try:
        res = build("loop-amplifying", 100, 2, None, os.path.join(work, "amplifying-out"), parallelism).run(
            checkpoint_interval=0.2, channel_state_memory=CHANNEL_STATE_MEMORY, loop_memory=LOOP_MEMORY,
            loop_disk=LOOP_DISK, loop_spill_dir=spill_dir, chaos=guard,
            stop_when=lambda r: guard.tripped or time.monotonic() - began > MAX_SECONDS)
        report["error"] = None
        report["stopped"] = ("memory guard" if guard.tripped else "time") if res.cancelled else "finished"
        report["restarts"] = res.restarts
    except JobFailed as e:
        report["error"] = str(e)
        report["operator"] = e.operator
    report["seconds"] = time.monotonic() - began
    report["peak_kib"] = children_peak_kib()
    report["sampled_peak_kib"] = guard.peak_kib
    report["spill_dir_after"] = sorted(os.listdir(spill_dir))
    with open(out_path, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
