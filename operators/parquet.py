"""An exactly-once Parquet sink: the dataflow's output back to Spark (spark.read.parquet).

Two-phase commit like FileSink: rows received since barrier n-1 are staged *in checkpoint
n*; when n completes they are written as ``part-<subtask>-<epoch>.parquet``, visible whole
or not at all (locally: temp file, fsync, rename; on an object store such as ``s3://``:
one atomic put; on HDFS: temp name, rename; see abs_engine/fs.py). The file name carries
the epoch, so publishing is idempotent. On restore from checkpoint n, this subtask's files
of epochs after n are deleted (rolled back) and the epochs n held pending are written again.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from abs_engine import fs
from abs_engine.errors import InputError

from .base import OperatorContext, Sink
from .epoch_parts import EpochParts


class ParquetSink(Sink):
    """Records are tuples (or single values with one column) written under ``columns``."""

    def __init__(self, path: str | os.PathLike[str], columns: Sequence[str]):
        self.path = os.fspath(path)
        if not fs.is_uri(self.path):  # (the driver's directory, as FileSink: not the executor's)
            self.path = os.path.abspath(self.path)
        self.columns = list(columns)
        if not self.columns:
            raise ValueError("ParquetSink needs at least one column name")
        self.buffer: list[Any] = []
        self.pending: list[tuple[int, list[Any]]] = []

    def check(self) -> None:
        if fs.is_remote(self.path):
            try:
                fs.Store(self.path)
            except fs.StoreError as e:
                raise InputError(f"cannot write Parquet output: {e}") from None
            return
        parent = os.path.dirname(fs.local_path(self.path))
        if not os.path.isdir(parent):
            raise InputError(f"cannot write Parquet output {self.path!r}: directory {parent!r} does not exist")

    def outputs(self) -> list[str]:
        return [self.path]

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self.out = fs.open_dir(self.path)
        self.out.make_root()
        self.parts = EpochParts(self.out, ctx.subtask_index, ".parquet")
        with ctx.guard():  # fenced: only the current attempt changes the output
            self.parts.start(ctx.restored, ctx.parallelism)

    def process(self, batch: list[Any]) -> list[Any]:
        self.buffer.extend(batch)
        return []

    def snapshot(self, checkpoint_id: int) -> Any:
        if self.buffer:
            self.pending.append((checkpoint_id, self.buffer))
            self.buffer = []
        return {"checkpoint": checkpoint_id, "pending": [[e, rows] for e, rows in self.pending]}

    def restore(self, state: Any) -> None:
        self.pending = [(int(e), list(rows)) for e, rows in state["pending"]]
        self.buffer = []
        with self.ctx.guard():
            # Epochs after the restored checkpoint were published by the failed attempt: roll back.
            self.parts.rollback(after=int(state["checkpoint"]))
            self._publish(upto=None)  # pending epochs of a completed checkpoint are committed

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        with self.ctx.guard():
            self._publish(upto=checkpoint_id)

    def _publish(self, upto: int | None) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        keep = []
        for epoch, rows in self.pending:
            if upto is not None and epoch > upto:
                keep.append((epoch, rows))
                continue
            if len(self.columns) == 1:
                cols = [list(rows)]
            else:
                cols = [list(c) for c in zip(*rows)] if rows else [[] for _ in self.columns]
            buf = pa.BufferOutputStream()
            pq.write_table(pa.table(dict(zip(self.columns, cols))), buf)
            self.parts.put(epoch, buf.getvalue().to_pybytes())
        self.pending = keep
