"""Corrupt the newest completed checkpoint on disk, then SIGKILL a worker: recovery must
detect the damage before using anything, fall back to the checkpoint before it, and the
output must still be exact."""

from __future__ import annotations

import os
import random
import signal

import pytest

from abs_engine import Dataflow
from abs_engine.checkpoint.safe_io import METADATA
from abs_engine.checkpoint.storage import CheckpointStorage
from abs_engine.testing import CapturingSink
from operators import FileSink, Source, TextFileSource
from tests.abs_engine.executors.test_recovery import as_counts, output_lines
from tests.conftest import batch_word_count

pytestmark = pytest.mark.slow


class CorruptThenKill:
    """Driver-side chaos: once ``after`` checkpoints are complete, damage the newest one
    (``how``), then SIGKILL a random worker."""

    def __init__(self, ckdir: str, how: str, after: int = 2, seed: int = 0):
        self.storage = CheckpointStorage(ckdir)
        self.how = how
        self.after = after
        self.rng = random.Random(seed)
        self.done = False
        self.damaged: int | None = None

    def poll(self, elapsed: float, pids: dict[str, int]) -> str | None:
        if self.done or not pids:
            return None
        done = self.storage.completed_ids()
        if len(done) < self.after:
            return None
        cid = done[-1]
        d = self.storage.dir_of(cid)
        meta = self.storage.load_metadata(cid)
        victim_file = os.path.join(d, sorted(meta.tasks.values(), key=lambda e: e.file)[0].file)
        if self.how == "truncate":
            os.truncate(victim_file, os.path.getsize(victim_file) // 2)
        elif self.how == "bitflip":
            with open(victim_file, "r+b") as f:
                data = bytearray(f.read())
                data[self.rng.randrange(len(data))] ^= 0x10
                f.seek(0)
                f.write(data)
        elif self.how == "delete":
            os.remove(victim_file)
        elif self.how == "metadata":
            with open(os.path.join(d, METADATA), "r+b") as f:
                f.seek(-3, os.SEEK_END)
                f.write(b"\xff\xff\xff")
        self.damaged = cid
        self.done = True
        task = self.rng.choice(sorted(pids))
        os.kill(pids[task], signal.SIGKILL)
        return task


@pytest.mark.parametrize("how", ["truncate", "bitflip", "delete", "metadata"])
def test_corrupt_latest_checkpoint_falls_back(medium_corpus, tmp_path, how):
    out, ck = str(tmp_path / "out.tsv"), str(tmp_path / "ckpt")
    chaos = CorruptThenKill(ck, how, seed=len(how))
    flow = Dataflow("wc", parallelism=2)
    words = flow.source(TextFileSource(medium_corpus, batch_bytes=1 << 14)).flat_map(str.split)
    words.key_by().count_final().sink(FileSink(out), parallelism=1)
    res = flow.run(checkpoint_interval=0.03, checkpoint_dir=ck, chaos=chaos, restart_delay=0, retained_checkpoints=3)
    assert chaos.damaged is not None, "the job ended before two checkpoints completed"
    assert res.restarts == 1
    assert any(f"checkpoint {chaos.damaged}" in s for s in res.skipped_checkpoints), res.skipped_checkpoints
    assert res.restored_from and res.restored_from[0] < chaos.damaged
    assert as_counts(output_lines(out)) == batch_word_count(medium_corpus)


class Ticks(Source):
    """0, 1, 2, ... without end (a job stopped by stop_when)."""

    def open(self, ctx):
        super().open(ctx)
        self.n = 0

    def read_batch(self):
        batch = list(range(self.n, self.n + 100))
        self.n += 100
        return batch

    def snapshot(self, checkpoint_id):
        return self.n

    def restore(self, state):
        self.n = int(state)


def test_a_checkpoint_a_worker_cannot_read_back_is_skipped_not_retried(tmp_path, monkeypatch):
    """The newest checkpoint changes after the driver verified it (simulated by a driver
    whose verification only reads metadata): the worker's own check fails the restore, and
    the next attempt falls back to the checkpoint before it instead of retrying the same."""
    ck = str(tmp_path / "ck")

    def flow() -> Dataflow:
        f = Dataflow("ticks")
        f.source(Ticks(), name="ticks").sink(CapturingSink(tmp_path / "out"))
        return f

    flow().run(checkpoint_interval=0.05, checkpoint_dir=ck, stop_when=lambda r: r.checkpoints_completed >= 3)
    storage = CheckpointStorage(ck)
    newest = storage.completed_ids()[-1]
    meta = storage.verify(newest)
    path = os.path.join(storage.dir_of(newest), meta.tasks["ticks#0"].file)
    with open(path, "r+b") as f:
        f.seek(0)
        f.write(b"\x00\x01")
    monkeypatch.setattr(CheckpointStorage, "verify", CheckpointStorage.load_metadata)
    res = flow().run(checkpoint_interval=0.05, checkpoint_dir=ck, resume=True, restart_delay=0,
                     stop_when=lambda r: r.checkpoints_completed >= 1)
    assert res.restored_from[0] == newest and res.restored_from[1] < newest, res.restored_from
    assert res.restarts == 1
    assert any(f"checkpoint {newest} could not be restored" in s for s in res.skipped_checkpoints)
