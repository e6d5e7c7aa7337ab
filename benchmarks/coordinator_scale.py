"""The checkpoint coordinator's cost against the number of tasks (issue 9: how the engine
grows to N machines). Sans-IO, so it is measured alone: trigger a checkpoint, feed one
acknowledgement per task, complete it (metadata written: in memory, or durably to a
directory with fsync), notify every task. Reports microseconds per checkpoint and per
acknowledgement, and the bytes of the metadata, at each size.

    python3 benchmarks/coordinator_scale.py [--tasks 16 64 256 1024] [--checkpoints 200]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from abs_engine import codec, messages  # noqa: E402
from abs_engine.checkpoint.coordinator import CheckpointCoordinator  # noqa: E402
from abs_engine.checkpoint.storage import CheckpointStorage  # noqa: E402
from abs_engine.simulation.storage import MemoryStore  # noqa: E402


def one_size(n: int, checkpoints: int, storage: CheckpointStorage) -> dict[str, float]:
    tasks = [f"op{i % 8}#{i // 8}" for i in range(n)]
    sources = tasks[: max(1, n // 8)]
    now = [0.0]
    coord = CheckpointCoordinator("scale", "f" * 16, tasks, sources, storage, interval=1.0, timeout=1e9,
                                  clock=lambda: now[0])
    coord.start()
    sha = hashlib.sha256(b"x").hexdigest()
    per_ckpt = []
    meta_bytes = 0
    for _ in range(checkpoints):
        now[0] += 1.0
        t0 = time.perf_counter()
        sent = coord.poll()
        cid = next(m.checkpoint_id for _, m in sent if isinstance(m, messages.Trigger))
        meta = None
        for t in tasks:
            _, meta = coord.on_ack(messages.Ack(cid, t, f"{t}.abc.state", 1, sha, 0.0, 0, False))
        assert meta is not None
        notes = coord.notifications(meta)
        per_ckpt.append(time.perf_counter() - t0)
        assert len(notes) == n
        meta_bytes = len(codec.pack(meta.to_dict()))
    med = statistics.median(per_ckpt)
    return {"tasks": n, "ms_per_checkpoint": med * 1e3, "us_per_ack": med / n * 1e6, "metadata_bytes": meta_bytes}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, nargs="+", default=[16, 64, 256, 1024])
    ap.add_argument("--checkpoints", type=int, default=200)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "coordinator_scale.md"))
    args = ap.parse_args()
    rows = []
    for n in args.tasks:
        mem = one_size(n, args.checkpoints, CheckpointStorage(MemoryStore(), 3))
        with tempfile.TemporaryDirectory() as d:
            disk = one_size(n, max(20, args.checkpoints // 10), CheckpointStorage(d, 3))
        rows.append((mem, disk))
        print(f"{n:5d} tasks: {mem['ms_per_checkpoint']:.2f} ms/checkpoint in memory "
              f"({mem['us_per_ack']:.1f} us/ack), {disk['ms_per_checkpoint']:.2f} ms with durable metadata, "
              f"metadata {mem['metadata_bytes']:,} bytes", file=sys.stderr)
    lines = [
        "# Checkpoint coordinator cost against the number of tasks",
        "",
        f"`python3 benchmarks/coordinator_scale.py --tasks {' '.join(map(str, args.tasks))} "
        f"--checkpoints {args.checkpoints}` (median per checkpoint: trigger, one ack per task, "
        "metadata, notify every task; the driver's share of a checkpoint)",
        "",
        "| tasks | ms / checkpoint (metadata in memory) | us / ack | ms / checkpoint (durable metadata, fsync) "
        "| metadata bytes |",
        "|---|---|---|---|---|",
    ]
    for mem, disk in rows:
        lines.append(f"| {mem['tasks']} | {mem['ms_per_checkpoint']:.2f} | {mem['us_per_ack']:.1f} | "
                     f"{disk['ms_per_checkpoint']:.2f} | {mem['metadata_bytes']:,} |")
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
