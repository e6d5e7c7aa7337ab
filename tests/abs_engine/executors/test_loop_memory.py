"""Loops bounded in memory, end to end with real worker processes (runtime/overflow.py).

1. **An amplifying loop** (every trip round makes two records of one) fails at once with
   LoopOverflow, after spilling loop_disk's worth, and its workers' peak RSS stays within
   baseline + loop_memory + the channel-state bound + a margin; at parallelism 1 (one
   frame becomes one batch becomes a frame twice as large, unless frames are cut into
   batches) and 2 (hash exchanges halve batches; the backlog grows in frames). Run in a
   subprocess (loop_memory_job.py) so that the peak is exact: ``getrusage(RUSAGE_CHILDREN)``
   there covers its workers only, every one waited for. The baseline is the peak of the
   same dataflow with a loop that does not amplify (records go round 30 times and leave).
   The bound, with loop_memory=8 MiB and channel_state_memory=4 MiB: baseline + 8 MiB (the
   back-edge's spill held in memory) + 4 x 4 MiB (a checkpoint's back-edge log: logged,
   handed to the writer, encoded, and read ahead; channel_state_memory bounds each) +
   16 MiB of margin (the back-edge reader's window of 1 MiB, a batch in and out, the
   spill's write buffer and a read chunk, the allocator's slack). Measured on 2 cores:
   baseline 53-55 MiB and peak 54-60 MiB at parallelism 1, 43-44 and 64-68 MiB at 2 (the
   bound: baseline + 40). Without this change the same jobs grew a worker past baseline +
   600 MiB in 13 s (parallelism 1) and 48 s (2) and nothing failed; here the job's memory
   guard (a chaos hook reading each worker's VmHWM on every turn of the driver's loop)
   stops it at the bound and the test fails.
2. **A loop whose backlog spills, then drains**, completes with output exactly equal to a
   batch oracle across a SIGKILL: Collatz step counts plus 300,000 "filler" records of
   400 bytes that circulate in the first attempt (a gate in the operator holds them in the
   loop) with loop_memory at its minimum of 1 MiB. 126 MB in flight is twice what the loop
   can hold anywhere else (kernel buffers of 8 connections, about 16 MiB; at most a batch
   of 8192 records in and one out in each of its 6 tasks, about 41 MB; the merge tasks'
   readers and spill memory, 4 MiB), so the backlog must spill: a matter of sizes, not of
   speed. The gate's operator runs in the task that owns the back-edge; once a checkpoint
   has completed while that process has a spill file open (it looks in /proc/self/fd for a
   file in loop_spill_dir), it SIGKILLs its own process at its next batch: a kill certain
   to fall while data is spilled, no wall clock involved. The attempt after the restore
   lets every record through (fillers leave the loop, numbers take their Collatz steps);
   each record must come out exactly once, and the restored checkpoint must hold records
   in flight round the loop (its back-edge logs). Without spilling the gate never opens:
   the job is stopped after GIVE_UP_S and the test fails (it normally takes 10-25 s).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from abs_engine import Dataflow
from abs_engine.checkpoint.storage import CheckpointStorage
from abs_engine.testing import CapturingSink, TestingSource
from examples import collatz
from operators import Operator
from tests.abs_engine.executors import loop_memory_job as job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

MIB = 1 << 20
MARGIN_MIB = 16
#: baseline + loop_memory + 4 x channel_state_memory + margin (see the module docstring).
BOUND_MIB = job.LOOP_MEMORY // MIB + 4 * job.CHANNEL_STATE_MEMORY // MIB + MARGIN_MIB


# ---- 1. an amplifying loop --------------------------------------------------------------


@pytest.mark.parametrize("parallelism", [1, 2])
def test_an_amplifying_loop_spills_then_fails_at_once_with_loop_overflow_within_its_memory_bound(tmp_path, parallelism):
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    out = tmp_path / "report.json"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    proc = subprocess.run([sys.executable, "-m", "tests.abs_engine.executors.loop_memory_job", str(out),
                           str(spill_dir), str(BOUND_MIB), str(parallelism)],
                          cwd=root, capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    peak_mib, baseline_mib = r["peak_kib"] / 1024, r["baseline_kib"] / 1024
    assert r["error"] is not None, (
        f"the amplifying loop did not fail: stopped by {r['stopped']} after {r['seconds']:.0f}s with a worker at "
        f"{r['sampled_peak_kib'] / 1024:.0f} MiB (baseline {baseline_mib:.0f} MiB, bound +{BOUND_MIB} MiB)")
    error = r["error"]
    # Fatal at once: "cannot be retried", not "failed 11 time(s), restart attempts exhausted".
    assert "cannot be retried" in error and "LoopOverflow" in error, error[:600]
    assert r["operator"] == "merge"
    for part in ("the loop into operator 'merge'", "again#", "->merge#", "loop_memory=8.0 MiB",
                 "loop_disk=64.0 MiB", "spilled to disk", "raise loop_disk", "consume faster than it produces"):
        assert part in error, (part, error[:600])
    # It spilled what loop_disk allows before it failed (the message says how much, in MiB
    # to one decimal: just past 64 MiB may read 64.0).
    spilled = float(error.split(" MiB spilled to disk")[0].rsplit(" ", 1)[1])
    assert spilled >= job.LOOP_DISK / MIB
    assert peak_mib <= baseline_mib + BOUND_MIB, (peak_mib, baseline_mib, BOUND_MIB)
    assert r["spill_dir_after"] == []  # unlinked files: nothing left behind


# ---- 2. a burst that spills, then drains, across a SIGKILL -------------------------------

FILLERS = 300_000
NUMBERS = 3_000
FILL_PAD = "f" * 400
GIVE_UP_S = 300.0


def has_spill_file(directory: str) -> bool:
    """Whether this process holds a spill file of ``directory`` open (created unlinked, so
    only /proc/self/fd shows it)."""
    prefix = os.path.join(directory, "")
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(prefix):
                return True
        except OSError:
            continue
    return False


class GatedCollatz(Operator):
    """One Collatz step per number, in the task that owns the loop's back-edge. In the first
    attempt nothing moves on: every record goes round again unchanged (the burst stays in
    the loop), until a checkpoint completes while this process has a spill file open; then
    the next batch SIGKILLs the process. Later attempts step numbers and let fillers out."""

    def __init__(self, spill_dir: str, marker_dir: str) -> None:
        self.spill_dir = spill_dir
        self.marker_dir = marker_dir
        self.kill = False

    def open(self, ctx: Any) -> None:
        super().open(ctx)
        self.hold = ctx.attempt == 0

    def process(self, batch: list[Any]) -> list[Any]:
        if self.kill:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.hold:
            return [("more", *r) for r in batch]
        out: list[Any] = []
        for kind, start, n, steps in batch:
            if kind == "fill":
                out.append(("done", "fill", start, 0))
            elif n == 1:
                out.append(("done", "n", start, steps))
            else:
                out.append(("more", "n", start, n // 2 if n % 2 == 0 else 3 * n + 1, steps + 1))
        return out

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        if self.hold and not self.kill and has_spill_file(self.spill_dir):
            with open(os.path.join(self.marker_dir, f"spilling-at-{checkpoint_id}.{os.getpid()}"), "w"):
                pass
            self.kill = True


def is_more(r: Any) -> bool:
    return bool(r[0] == "more")


def is_done(r: Any) -> bool:
    return bool(r[0] == "done")


def untag(r: Any) -> Any:
    return r[1:]


def seed(i: int) -> Any:
    return ("n", i, i, 0) if i <= NUMBERS else ("fill", i, FILL_PAD, 0)


def burst_flow(sink: CapturingSink, spill_dir: str, marker_dir: str) -> Dataflow:
    flow = Dataflow("loop-burst", parallelism=2)
    loop = flow.feedback(name="loop")
    seeds = flow.source(TestingSource(range(1, NUMBERS + FILLERS + 1), batch_size=2000), name="seeds") \
        .map(seed, name="seed")
    stepped = seeds.union(loop, name="merge").apply(GatedCollatz(spill_dir, marker_dir), name="step")
    loop.connect(stepped.filter(is_more, name="more").map(untag, name="again").key_by(lambda r: r[1]))
    stepped.filter(is_done, name="done").map(untag, name="out").sink(sink, name="sink", parallelism=1)
    return flow


def test_a_loop_whose_backlog_spills_then_drains_is_exactly_once_across_a_sigkill(tmp_path):
    spill_dir, marker_dir, ck = tmp_path / "spill", tmp_path / "markers", str(tmp_path / "ck")
    spill_dir.mkdir()
    marker_dir.mkdir()
    sink = CapturingSink(tmp_path / "out")
    began = time.monotonic()
    res = burst_flow(sink, str(spill_dir), str(marker_dir)).run(
        checkpoint_interval=0.1, checkpoint_dir=ck, retained_checkpoints=100, restart_delay=0,
        loop_memory=1 << 20, loop_spill_dir=str(spill_dir),
        # Not a race: the job takes 10-25 s; this only ends an engine that never spills (the
        # gate would hold the loop for ever) with a clear failure instead of pytest's timeout.
        stop_when=lambda r: time.monotonic() - began > GIVE_UP_S)
    assert not res.cancelled, f"no spill file in {GIVE_UP_S:.0f}s: the back-edges never spilled to loop_spill_dir"
    expected = sorted([("n", n, s) for n, s in collatz.oracle(NUMBERS).items()]
                      + [("fill", i, 0) for i in range(NUMBERS + 1, NUMBERS + FILLERS + 1)])
    assert sorted(tuple(r) for r in sink.records()) == expected
    markers = os.listdir(marker_dir)
    assert markers, "no checkpoint completed while a spill file was open: the kill did not happen"
    assert res.restarts == 1 and len(res.restored_from) == 1 and res.restored_from[0] > 0, (res.restarts,
                                                                                              res.restored_from)
    # The restored checkpoint held records in flight round the loop (its back-edge logs).
    storage = CheckpointStorage(ck)
    cid = res.restored_from[0]
    meta = storage.load_metadata(cid)
    logged = sum(len(v) for t in meta.tasks if t.startswith("merge#") for v in storage.read_logs(cid, t).values())
    assert logged > 0
    assert os.listdir(spill_dir) == []
