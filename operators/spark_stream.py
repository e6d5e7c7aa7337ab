"""Unbounded input from Spark Structured Streaming.

The driver runs the streaming query with ``foreachBatch``. Each micro-batch is written to
a staging location as ``batch-<id>.arrow``, visible whole or not at all (a local directory:
temp file, fsync, rename, directory fsync; ``s3://`` and other object stores: one atomic
put; see abs_engine/fs.py), *before* the callback returns, i.e. before Spark commits the batch; so whatever Spark has
committed is durable for the engine. Spark re-delivers an uncommitted batch after a crash with the same
batch id: the file is simply written again, identical.

Source subtask i reads the batches whose id % parallelism == i. Its offset, in every
checkpoint, is (next batch id, rows of it consumed): a batch below that id is never read
again, however often Spark delivers it, so each batch counts exactly once. Staged files are
deleted once ``keep_checkpoints`` later checkpoints have completed past them (so a fallback
to an older checkpoint still finds them). With ``available_now=True`` the query processes
what is there and stops; the source then ends when every staged batch is consumed.

On the Spark executor the source's subtasks may run on other machines than the driver that
stages: give a staging location they all reach (an object store URI or a shared mount).
Every staged file is read bounded (MAX_BATCH_BYTES) like anything read back from storage.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from abs_engine import fs
from abs_engine.errors import InputError

from .base import OperatorContext, Source
from .progress import SourceProgress

IDLE_WAIT = 0.02  # seconds a subtask waits when no staged batch is ready (a polling source)
MAX_BATCH_BYTES = 4 << 30  #: a staged micro-batch larger than this is refused unread
END = "_end"


def _batch_name(batch_id: int) -> str:
    return f"batch-{batch_id:09d}.arrow"


def _batch_id(name: str) -> int | None:
    if name.startswith("batch-") and name.endswith(".arrow") and name[6:15].isdigit() and len(name) == 21:
        return int(name[6:15])
    return None


class SparkStreamSource(Source[Any]):
    """The records of a streaming DataFrame, ``stream_df`` (``spark.readStream...``; a batch
    DataFrame is an InputError: use SparkSource), with no end unless ``available_now``: see
    the module docstring. A record is the value of ``column`` (or of a one-column stream),
    else a tuple of every column.

    ``staging_dir``: where micro-batches are staged, a local directory or an object store URI
    that every source subtask reaches; the source's own. ``spark_checkpoint``: where Spark's
    streaming query keeps its progress (default ``<staging_dir>/_spark_checkpoint``; needed
    when staging on a URI, InputError without). ``available_now=True``: process what is
    there, then end (Spark's ``availableNow`` trigger); else a micro-batch every
    ``trigger_seconds``. ``keep_checkpoints``: the completed checkpoints whose staged
    batches are kept (older batches are deleted)."""

    #: Its streaming query runs Spark jobs while the dataflow runs: on the Spark executor that
    #: slot must stay free beside the workers' barrier stage.
    spark_slots = 1

    def __init__(self, stream_df: Any, staging_dir: str | os.PathLike[str], column: str | None = None,
                 available_now: bool = False, trigger_seconds: float = 0.5, keep_checkpoints: int = 3,
                 spark_checkpoint: str | None = None):
        if not getattr(stream_df, "isStreaming", False):
            raise InputError("SparkStreamSource needs a streaming DataFrame (spark.readStream...); "
                             "use SparkSource for a batch DataFrame")
        self._df = stream_df
        location = os.fspath(staging_dir)
        self.staging = location if fs.is_remote(location) else fs.local_path(location)
        if spark_checkpoint is None:
            if fs.is_remote(location):
                raise InputError(f"staging on {fs.redact(location)}: pass spark_checkpoint=<a location Spark's "
                                 "streaming query can write its progress to> (a directory on the driver, hdfs://, "
                                 "s3a://); the staging URI is read by pyarrow, not by Spark")
            spark_checkpoint = os.path.join(self.staging, "_spark_checkpoint")
        self.spark_checkpoint = spark_checkpoint
        self.column = column
        self.available_now = available_now
        self.trigger_seconds = trigger_seconds
        self.keep_checkpoints = keep_checkpoints
        self._query: Any = None
        self._dir: fs.Directory | None = None

    def _staged(self) -> fs.Directory:
        if self._dir is None:
            self._dir = fs.open_dir(self.staging, private=True)
        return self._dir

    def check(self) -> None:
        if self._df is not None and self.column is not None and self.column not in self._df.columns:
            raise InputError(f"column {self.column!r} is not in the stream (columns: {self._df.columns})")

    def stage(self, batch_df: Any, batch_id: int) -> None:
        """The foreachBatch callback: make the micro-batch durable under its batch id."""
        import pyarrow as pa

        df = batch_df.select(self.column) if self.column else batch_df
        table = df.toArrow()
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
        # Durable (and whole) before the callback returns and Spark commits the batch.
        self._staged().put((_batch_name(batch_id),), sink.getvalue().to_pybytes())
        self._last_staged = max(getattr(self, "_last_staged", -1), batch_id)

    def driver_start(self) -> None:
        staged = self._staged()
        staged.make_root()
        staged.delete_file(END)
        writer = self._df.writeStream.foreachBatch(self.stage).option("checkpointLocation", self.spark_checkpoint)
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
        # Stopped by driver_stop (the job was cancelled, stopped or crashed), not finished: the
        # stream has not ended, and an END written now (perhaps after the next run's
        # driver_start removed the old one) would end that run's sources early.
        if self._query is q and q.exception() is None:
            last = getattr(self, "_last_staged", -1)
            for n in self._staged().list():
                bid = _batch_id(n)
                if bid is not None:
                    last = max(last, bid)
            self._staged().put((END,), str(last).encode())

    def driver_stop(self) -> None:
        if self._query is not None:
            q, self._query = self._query, None  # first: its waiter must not take this stop for the end
            q.stop()

    def __getstate__(self) -> dict[str, Any]:
        return ({k: v for k, v in self.__dict__.items() if k not in ("_df", "_query", "_dir")}
                | {"_df": None, "_query": None, "_dir": None})

    # ---- worker side -----------------------------------------------------------------

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self.next_id = ctx.subtask_index  #: the next batch id this subtask reads
        self.rows = 0
        self._table: Any = None
        self._offsets: dict[int, int] = {}  #: checkpoint id -> next_id at its snapshot

    def _end_id(self) -> int | None:
        try:
            return int(self._staged().read((END,), 64))
        except FileNotFoundError:
            return None
        except (ValueError, fs.TooLarge) as e:
            raise InputError(f"{self._staged().show(END)} is not a batch id ({e}): the staging location "
                             "was written by something else; give the source a location of its own") from None

    def read_batch(self) -> list[Any] | None:
        import pyarrow as pa

        if self._table is None:
            staged = self._staged()
            name = _batch_name(self.next_id)
            try:
                data = staged.read((name,), MAX_BATCH_BYTES)
            except FileNotFoundError:
                end = self._end_id()
                if end is not None and self.next_id > end:
                    return None
                time.sleep(IDLE_WAIT)  # nothing staged yet: poll again shortly
                return []
            except fs.TooLarge as e:
                raise InputError(f"staged batch {staged.show(name)} holds {e}: refused unread") from None
            self._table = pa.ipc.open_file(pa.BufferReader(data)).read_all()
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

    def progress(self) -> SourceProgress:
        return SourceProgress(None, None, "batches", f"micro-batch {self.next_id}, row {self.rows:,}")

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        done = sorted(c for c in self._offsets if c <= checkpoint_id)
        if len(done) < self.keep_checkpoints:
            return
        horizon = self._offsets[done[-self.keep_checkpoints]]
        for c in done[: -self.keep_checkpoints]:
            del self._offsets[c]
        staged = self._staged()
        for name in staged.list():
            bid = _batch_id(name)
            if bid is not None and bid < horizon and bid % self.ctx.parallelism == self.ctx.subtask_index:
                staged.delete_file(name)
