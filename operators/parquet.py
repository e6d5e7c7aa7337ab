"""An exactly-once Parquet sink: the dataflow's output back to Spark (spark.read.parquet).

Two-phase commit like FileSink: rows received since barrier n-1 are staged *in checkpoint
n*; when n completes they are written as ``part-<subtask>-<epoch>.parquet``, visible whole
or not at all (locally: temp file, fsync, rename; on an object store such as ``s3://``:
one atomic put; on HDFS: temp name, rename; see abs_engine/fs.py). The file name carries
the epoch, so publishing is idempotent. On restore from checkpoint n, this subtask's files
of epochs after n are deleted (rolled back) and the epochs n held pending are written again.

Small files are compacted *before* they are published, as Flink's FileSink compacts: with
``min_file_rows``, the epochs of completed checkpoints are held (still in the checkpoint)
until together they reach that many rows, then written as one file named by the last of
them; the job's end publishes what is left. A reader never sees a row twice, nor a small
file that a compaction replaced: nothing is rewritten after it is published.

Invariants:
- Which epochs make one file, and how an epoch is split into ``max_file_rows`` pieces and
  ``partition_by`` directories, depends only on the rows held: a replay writes the same
  files under the same names.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from abs_engine import fs
from abs_engine.errors import InputError

from .base import OperatorContext, Sink
from .epoch_parts import EpochParts


COMPRESSIONS = ("snappy", "zstd", "gzip", "brotli", "lz4", "none")


class ParquetSink(Sink):
    """Records are tuples (or single values with one column) written under ``columns`` into
    the directory ``path`` (local, or a URI: ``s3://``, ``hdfs://``...).

    ``compression``: one of COMPRESSIONS (``"none"``: uncompressed; default snappy).
    ``row_group_size``: rows per row group (None: pyarrow's default). ``max_file_rows``: an
    epoch with more rows is split into files of at most that many. ``min_file_rows``:
    compaction before publishing (see the module docstring): output becomes visible once
    that many rows have gathered, or at the job's end. ``partition_by``: columns whose
    values name Hive-style directories (``country=DE/``), left out of the files as Spark and
    pyarrow expect. A bad value is a ValueError.
    """

    def __init__(self, path: str | os.PathLike[str], columns: Sequence[str], compression: str = "snappy",
                 row_group_size: int | None = None, max_file_rows: int | None = None,
                 min_file_rows: int | None = None, partition_by: Sequence[str] = ()):
        self.path = os.fspath(path)
        if not fs.is_uri(self.path):  # (the driver's directory, as FileSink: not the executor's)
            self.path = os.path.abspath(self.path)
        self.columns = list(columns)
        if not self.columns:
            raise ValueError("ParquetSink needs at least one column name")
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
        for what, n in (("row_group_size", row_group_size), ("max_file_rows", max_file_rows),
                        ("min_file_rows", min_file_rows)):
            if n is not None and (not isinstance(n, int) or n < 1):
                raise ValueError(f"{what} must be a positive number of rows, got {n!r}")
        missing = [c for c in partition_by if c not in self.columns]
        if missing or len(partition_by) >= len(self.columns):
            raise ValueError(f"partition_by {list(partition_by)} must name some, not all, of the columns "
                             f"{self.columns}" + (f" (not {missing})" if missing else ""))
        self.compression, self.row_group_size = compression, row_group_size
        self.max_file_rows, self.min_file_rows = max_file_rows, min_file_rows
        self.partition_by = list(partition_by)
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
        self.parts = EpochParts(self.out, ctx.subtask_index, ".parquet", depth=len(self.partition_by))
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

    def finish(self) -> list[Any]:
        self.ending = True  # the end: whatever is held goes out with the final checkpoint
        return []

    def _publish(self, upto: int | None) -> None:
        ready = [(e, rows) for e, rows in self.pending if upto is None or e <= upto]
        later = [(e, rows) for e, rows in self.pending if not (upto is None or e <= upto)]
        group: list[tuple[int, list[Any]]] = []
        for epoch, rows in ready:
            group.append((epoch, rows))
            if self.min_file_rows is None or sum(len(r) for _, r in group) >= self.min_file_rows:
                self._write(group[-1][0], [row for _, rs in group for row in rs])
                group = []
        if group and getattr(self, "ending", False):
            self._write(group[-1][0], [row for _, rs in group for row in rs])
            group = []
        self.pending = group + later  # (a group too small yet: kept, and checkpointed, until more come)

    def _write(self, epoch: int, rows: list[Any]) -> None:
        from . import parquet_write

        for where, piece, data in parquet_write.files(rows, self.columns, self.partition_by, self.compression,
                                                      self.row_group_size, self.max_file_rows):
            self.parts.put(epoch, data, where, piece)
