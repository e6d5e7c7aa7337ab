"""Unbounded input from Spark Structured Streaming.

The driver runs the streaming query with ``foreachBatch``. Each micro-batch is written to
a staging directory as ``batch-<id>.arrow`` (temp file, fsync, rename, directory fsync)
*before* the callback returns, i.e. before Spark commits the batch; so whatever Spark has
committed is durable for the engine. Spark re-delivers an uncommitted batch after a crash with the same
batch id: the file is simply written again, identical.

Source subtask i reads the batches whose id % parallelism == i. Its offset, in every
checkpoint, is (next batch id, rows of it consumed): a batch below that id is never read
again, however often Spark delivers it, so each batch counts exactly once. Staged files are
deleted once ``keep_checkpoints`` later checkpoints have completed past them (so a fallback
to an older checkpoint still finds them). With ``available_now=True`` the query processes
what is there and stops; the source then ends when every staged batch is consumed.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from abs_engine.errors import InputError

from .base import OperatorContext, Source

IDLE_WAIT = 0.02  # seconds a subtask waits when no staged batch is ready (a polling source)


def _batch_path(staging: str, batch_id: int) -> str:
    return os.path.join(staging, f"batch-{batch_id:09d}.arrow")


def _fsync_dir(path: str) -> None:
    """Make the renames done in directory ``path`` durable (they live in its entries)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SparkStreamSource(Source):
    #: Its streaming query runs Spark jobs while the dataflow runs: on the Spark executor that
    #: slot must stay free beside the workers' barrier stage.
    spark_slots = 1

    def __init__(self, stream_df: Any, staging_dir: str | os.PathLike[str], column: str | None = None,
                 available_now: bool = False, trigger_seconds: float = 0.5, keep_checkpoints: int = 3):
        if not getattr(stream_df, "isStreaming", False):
            raise InputError("SparkStreamSource needs a streaming DataFrame (spark.readStream...); "
                             "use SparkSource for a batch DataFrame")
        self._df = stream_df
        self.staging = os.path.abspath(os.fspath(staging_dir))
        self.column = column
        self.available_now = available_now
        self.trigger_seconds = trigger_seconds
        self.keep_checkpoints = keep_checkpoints
        self._query: Any = None

    # ---- driver side -----------------------------------------------------------------

    def check(self) -> None:
        if self._df is not None and self.column is not None and self.column not in self._df.columns:
            raise InputError(f"column {self.column!r} is not in the stream (columns: {self._df.columns})")

    def stage(self, batch_df: Any, batch_id: int) -> None:
        """The foreachBatch callback: make the micro-batch durable under its batch id."""
        import pyarrow as pa

        df = batch_df.select(self.column) if self.column else batch_df
        table = df.toArrow()
        path = _batch_path(self.staging, batch_id)
        tmp = path + ".tmp"
        with pa.OSFile(tmp, "wb") as f, pa.ipc.new_file(f, table.schema) as w:
            w.write_table(table)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(self.staging)  # durable before the callback returns and Spark commits the batch
        self._last_staged = max(getattr(self, "_last_staged", -1), batch_id)

    def driver_start(self) -> None:
        os.makedirs(self.staging, exist_ok=True)
        end = os.path.join(self.staging, "_end")
        if os.path.exists(end):
            os.remove(end)
        writer = self._df.writeStream.foreachBatch(self.stage).option(
            "checkpointLocation", os.path.join(self.staging, "_spark_checkpoint"))
        if self.available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{int(self.trigger_seconds * 1000)} milliseconds")
        self._query = writer.start()
        if self.available_now:
            threading.Thread(target=self._await_end, daemon=True).start()

    def _await_end(self) -> None:
        q = self._query
        q.awaitTermination()
        if q.exception() is None:
            last = getattr(self, "_last_staged", -1)
            for n in os.listdir(self.staging):
                if n.startswith("batch-") and n.endswith(".arrow"):
                    last = max(last, int(n[6:15]))
            tmp = os.path.join(self.staging, "_end.tmp")
            with open(tmp, "w") as f:
                f.write(str(last))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, os.path.join(self.staging, "_end"))
            _fsync_dir(self.staging)

    def driver_stop(self) -> None:
        if self._query is not None:
            self._query.stop()
            self._query = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_df", "_query")} | {"_df": None, "_query": None}

    # ---- worker side -----------------------------------------------------------------

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self.next_id = ctx.subtask_index  #: the next batch id this subtask reads
        self.rows = 0
        self._table: Any = None
        self._offsets: dict[int, int] = {}  #: checkpoint id -> next_id at its snapshot

    def _end_id(self) -> int | None:
        try:
            with open(os.path.join(self.staging, "_end")) as f:
                return int(f.read())
        except FileNotFoundError:
            return None

    def read_batch(self) -> list[Any] | None:
        import pyarrow as pa

        if self._table is None:
            path = _batch_path(self.staging, self.next_id)
            if not os.path.exists(path):
                end = self._end_id()
                if end is not None and self.next_id > end:
                    return None
                time.sleep(IDLE_WAIT)  # nothing staged yet: poll again shortly
                return []
            with pa.memory_map(path) as f:
                self._table = pa.ipc.open_file(f).read_all()
        table = self._table
        chunk = table.slice(self.rows, 8192)
        self.rows += chunk.num_rows
        if self.rows >= table.num_rows:
            self._table = None
            self.next_id += self.ctx.parallelism
            self.rows = 0
        if chunk.num_columns == 1:
            values: list[Any] = chunk.column(0).to_pylist()
            return values
        return list(zip(*(c.to_pylist() for c in chunk.columns)))

    def snapshot(self, checkpoint_id: int) -> Any:
        self._offsets[checkpoint_id] = self.next_id
        return {"next_id": self.next_id, "rows": self.rows}

    def restore(self, state: Any) -> None:
        self.next_id, self.rows = int(state["next_id"]), int(state["rows"])
        self._table = None

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        done = sorted(c for c in self._offsets if c <= checkpoint_id)
        if len(done) < self.keep_checkpoints:
            return
        horizon = self._offsets[done[-self.keep_checkpoints]]
        for c in done[: -self.keep_checkpoints]:
            del self._offsets[c]
        for name in os.listdir(self.staging):
            if name.startswith("batch-") and name.endswith(".arrow"):
                bid = int(name[6:15])
                if bid < horizon and bid % self.ctx.parallelism == self.ctx.subtask_index:
                    os.remove(os.path.join(self.staging, name))
