"""Spark DataFrames as replayable sources.

``SparkSource(df)`` deals the DataFrame's partitions to the source subtasks (partition p to
subtask p % parallelism). A subtask's offset, in every checkpoint, is (its current partition,
rows consumed in it): after a failure it asks the driver for that partition from that row
(earlier ones are not read again). Rows travel as Arrow record batches (abs_engine.spark_server)
over connections that prove they know the partition server's secret (with ``tls`` on, in mutual
TLS under its own material), which the source carries over the job's authenticated control link.

Determinism: a (partition, row) offset means something only if the DataFrame yields the same
rows in the same partitions in the same order every time it is computed. File-backed DataFrames
(text, CSV, Parquet) without shuffles do, given the same files and partition sizing (the
embedded session pins it). A DataFrame with a shuffle, ``orderBy`` without a total order,
``sample`` or non-deterministic columns is not replayable: sort it by a unique key, or write it
to files first. Every offset carries a fingerprint (partition count, input files with sizes and
modification times, schema): a restore into a DataFrame whose fingerprint differs is refused.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from typing import Any

from abs_engine import codec
from abs_engine.errors import AbsEngineError, InputError
from abs_engine.tls import Material

from .base import OperatorContext, Source
from .spark_partitions import PartitionStream as _PartitionStream
from .spark_partitions import SparkReadError as SparkReadError
from .progress import SourceProgress


class SourceChangedError(AbsEngineError):
    """A restored offset does not match the DataFrame any more (retrying cannot help)."""

    fatal = True


def dataframe_fingerprint(df: Any) -> tuple[str, int]:
    """(fingerprint, partition count) of DataFrame ``df``, from its plan's inputs, not its data."""
    n = df.rdd.getNumPartitions()
    files = []
    for f in sorted(df.inputFiles()):
        path = f[len("file:"):] if f.startswith("file:") else f
        path = path.replace("///", "/") if path.startswith("///") else path
        try:
            st = os.stat(path)
            files.append([f, st.st_size, int(st.st_mtime_ns)])
        except OSError:
            files.append([f, -1, -1])
    doc = [n, files, df.schema.json()]
    return hashlib.sha256(codec.pack(doc)).hexdigest()[:16], n


def _read_with(spark: Any, what: str, path: str, reader: Any) -> Any:
    try:
        return reader(spark.read, path)
    except Exception as e:  # noqa: BLE001 - AnalysisException, SparkException, Py4JJavaError
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"Spark cannot read {what} input {path!r}: {first}") from e


#: Seconds the end of a job waits for partition reads in flight before it stops its session.
STOP_WAIT = 30.0


class SparkSource(Source[Any]):
    """Rows of the Spark DataFrame ``df``: a record is the value of ``column`` (or of a one-column
    DataFrame), else a tuple of all columns; with ``batches=True``, a ``pyarrow.RecordBatch`` Spark
    sends (of those columns), whole, with no Python object per row (operators/arrow.py).

    Before the job starts (InputError): ``column`` must exist; ``expect=str`` (what ``text``
    passes; the only type checked) needs a string column; an empty DataFrame needs
    ``allow_empty=True``. ``owns_session=True``: stop the process's embedded SparkSession when
    the job ends (what the readers below pass when given no ``spark``; not for a session you keep)."""

    #: Its partitions are read by Spark jobs while the dataflow runs: on the Spark executor
    #: that slot must stay free beside the workers' barrier stage.
    spark_slots = 1

    def __init__(self, df: Any, column: str | None = None, expect: type | None = None,
                 allow_empty: bool = False, owns_session: bool = False, batches: bool = False):
        self._df = df
        self.column = column
        self.batches = batches
        self.expect = expect
        self.allow_empty = allow_empty
        self._owns_session = owns_session
        self.source_id = uuid.uuid4().hex[:12]
        self.address: tuple[str, int] | None = None
        self.secret: bytes | None = None  #: the partition server's; travels only inside this object
        self.tls_address: tuple[str, int] | None = None
        self.tls: Material | None = None  #: the partition server's TLS material, likewise
        self.fingerprint = ""
        self.num_partitions = 0
        #: How ``text``/``csv``/``parquet`` read their input with the embedded session: (what,
        #: path, reader); None for a DataFrame given. Read in the driver when the job checks
        #: its inputs (``check``), not where the source is made: a supervised driver, a
        #: process of its own, reads it there, and its caller starts no Spark.
        self._recipe: tuple[str, str, Any] | None = None

    # ---- helpers ---------------------------------------------------------------------

    @classmethod
    def _read(cls, what: str, path: str, spark: Any, reader: Any, **kw: Any) -> "SparkSource":
        if not os.path.exists(path):
            raise InputError(f"{what} input {path!r} does not exist: pass an existing file or directory")
        src = cls(None, owns_session=spark is None, **kw)
        if spark is None:
            src._recipe = (what, path, reader)  # read by the driver, at check()
        else:
            src._df = _read_with(spark, what, path, reader)
        return src

    def _load(self) -> Any:
        """The DataFrame ``text``/``csv``/``parquet`` were asked for, read in this process (the
        driver) with the embedded session."""
        from abs_engine import spark_session

        if self._recipe is None:
            raise InputError(
                "this SparkSource's DataFrame stayed in the process that made it: a supervised driver "
                "(supervise=True) runs in a process of its own and cannot be handed a DataFrame or a session. "
                "Read the input with SparkSource.text/csv/parquet and no spark= (the driver reads it with its "
                "own embedded session), or run without supervise")
        what, path, reader = self._recipe
        return _read_with(spark_session.embedded_session(), what, path, reader)

    @classmethod
    def text(cls, path: str | os.PathLike[str], spark: Any = None, **kw: Any) -> "SparkSource":
        """Lines of the text files at ``path`` (a file or a directory) as str records, read with
        ``spark`` (None: the embedded session, started by the driver when the job checks its
        inputs, or by ``check()``, and stopped when the job ends); other keywords go to the
        constructor. InputError if ``path`` is missing (at once) or Spark cannot read it."""
        return cls._read("text", os.fspath(path), spark, lambda r, p: r.text(p), column="value", expect=str, **kw)

    @classmethod
    def csv(cls, path: str | os.PathLike[str], spark: Any = None, column: str | None = None,
            header: bool = True, **kw: Any) -> "SparkSource":
        """Rows of the CSV files at ``path``, every value a string; with ``header`` (default) the
        first line names the columns (else ``_c0``, ``_c1``...). ``spark`` as in ``text``, ``column``
        as in the constructor."""
        return cls._read("CSV", os.fspath(path), spark, lambda r, p: r.csv(p, header=header), column=column, **kw)

    @classmethod
    def parquet(cls, path: str | os.PathLike[str], spark: Any = None, column: str | None = None,
                **kw: Any) -> "SparkSource":
        """Rows of the Parquet files at ``path``, typed; ``spark`` and ``column`` as in ``csv``."""
        return cls._read("Parquet", os.fspath(path), spark, lambda r, p: r.parquet(p), column=column, **kw)

    # ---- driver side -----------------------------------------------------------------

    def check(self) -> None:
        from pyspark.sql.types import StringType

        from abs_engine import spark_session

        if self._df is None:
            if spark_session.planning_only:
                return
            self._df = self._load()  # (read here, in the driver; a given DataFrame cannot be missing)
        cols = self._df.columns
        if self.column is not None and self.column not in cols:
            raise InputError(f"column {self.column!r} is not in the DataFrame (columns: {cols})")
        if self.expect is str:
            name = self.column or (cols[0] if len(cols) == 1 else None)
            if name is None:
                raise InputError(f"a text source needs one column; pass column= (columns: {cols})")
            dtype = self._df.schema[name].dataType
            if not isinstance(dtype, StringType):
                raise InputError(
                    f"column {name!r} has type {dtype.simpleString()}, not string: this job needs text; "
                    f"cast it (df.withColumn({name!r}, col({name!r}).cast('string'))) or choose another column"
                )

    def driver_start(self) -> None:
        """Called in the driver before the job starts: register with the partition server."""
        from pyspark.sql.pandas.types import to_arrow_schema

        from abs_engine.spark_server import partition_server

        if self._df is None:
            self._df = self._load()
        df = self._df
        if df.sparkSession.sparkContext._jsc.sc().isStopped():
            raise InputError("the source's DataFrame was made on a SparkSession that has been stopped since (a "
                             "session on another master started in between stops the embedded one): make the "
                             "DataFrame, or SparkSource.text(...), after the session the job runs on, or pass it spark=")
        if self.column is not None:
            df = df.select(self.column)
        elif len(df.columns) == 1:
            self.column = df.columns[0]
        self._served = df
        try:
            self.fingerprint, self.num_partitions = dataframe_fingerprint(df)
            empty = self.num_partitions == 0 or df.isEmpty()
        except Exception as e:  # noqa: BLE001 - Py4JJavaError wrapping a SparkException
            text = str(e)
            first = next((ln for ln in text.splitlines() if "Exception" in ln or "[" in ln), text[:300])
            raise InputError(f"Spark cannot read the source's input: {first.strip()}") from e
        if not self.allow_empty and empty:
            raise InputError("the DataFrame is empty: there is nothing to read (pass allow_empty=True to accept)")
        conf = df.sparkSession.conf
        schema = to_arrow_schema(
            df.schema, timezone=conf.get("spark.sql.session.timeZone"),
            prefers_large_types=conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false") == "true",
        )
        # Where the executors that run the source's subtasks reach the driver.
        from abs_engine.spark_session import listen_host

        self._server_host = listen_host(df.sparkSession.sparkContext)
        server = partition_server(self._server_host)
        server.register(self.source_id, df, self.fingerprint, schema)
        self.address = server.address
        self.secret = server.secret
        self.tls_address = server.tls_address
        self.tls = server.material

    def driver_stop(self) -> None:
        from abs_engine.spark_server import partition_server

        server = partition_server(self._server_host)
        if self.source_id in server.sources:
            reg = server.stats(self.source_id)
            self._delivered = reg.delivered
            if reg.first_request is not None and reg.last_end is not None:
                self._delivery_seconds = reg.last_end - reg.first_request
        server.unregister(self.source_id)
        if self._owns_session:
            from abs_engine.spark_session import stop_embedded

            # Reads still in flight (a prefetch, a subtask gone at a cancel or failure) end
            # first: each is one partition's job. Past the bound, they are cancelled.
            if not server.wait_idle(STOP_WAIT) and self._df is not None:
                self._df.sparkSession.sparkContext.cancelAllJobs()
                server.wait_idle(STOP_WAIT)
            stop_embedded()

    def delivered_rows(self) -> int:
        """Rows the driver has sent to subtasks (driver side; counted across restarts)."""
        from abs_engine.spark_server import partition_server

        host = getattr(self, "_server_host", None)
        if host is None:  # never registered (driver_start did not run here)
            return getattr(self, "_delivered", 0)
        server = partition_server(host)
        if self.source_id in server.sources:
            return server.stats(self.source_id).delivered
        return getattr(self, "_delivered", 0)

    def delivery_seconds(self) -> float | None:
        """After a job: seconds from the first partition requested to the last one sent."""
        return getattr(self, "_delivery_seconds", None)

    def __getstate__(self) -> dict[str, Any]:
        # Only plain data goes to the workers: never the DataFrame or the session. The
        # partition server's secret goes with it (over the job's control connection only).
        return {k: v for k, v in self.__dict__.items() if k not in ("_df", "_served")} | {"_df": None}

    # ---- worker side -----------------------------------------------------------------

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self.mine = [p for p in range(self.num_partitions) if p % ctx.parallelism == ctx.subtask_index]
        self.next = 0  #: index into self.mine
        self.rows = 0  #: rows of self.mine[self.next] already emitted
        #: Partitions of self.mine that start past their first row (dealt out part-read by a
        #: rescale): partition -> rows already emitted before it came here.
        self.first_rows: dict[int, int] = {}
        self._streams: dict[int, _PartitionStream] = {}

    def _stream(self, i: int) -> "_PartitionStream":
        s = self._streams.get(i)
        if s is None:
            assert self.address is not None and self.secret is not None
            start = self.rows if i == self.next else self.first_rows.get(self.mine[i], 0)
            request = [self.source_id, self.fingerprint, self.mine[i], start]
            if self.ctx.tls:  # the job encrypts its connections: this one too
                assert self.tls_address is not None and self.tls is not None
                s = _PartitionStream(self.tls_address, self.secret, request, self.tls)
            else:
                s = _PartitionStream(self.address, self.secret, request)
            self._streams[i] = s
        return s

    def read_batch(self) -> list[Any] | None:
        if self.next >= len(self.mine):
            return None
        current = self._stream(self.next)
        if self.next + 1 < len(self.mine):
            self._stream(self.next + 1)  # prefetch: Spark computes the next partition meanwhile
        batch = current.next_batch()
        if batch is None:
            current.close()
            del self._streams[self.next]
            self.next += 1
            self.rows = self.first_rows.get(self.mine[self.next], 0) if self.next < len(self.mine) else 0
            return []
        self.rows += batch.num_rows
        if self.batches:
            return [batch] if batch.num_rows else []
        if self.column is not None:
            values: list[Any] = batch.column(0).to_pylist()
            return values
        return list(zip(*(c.to_pylist() for c in batch.columns)))

    def _close(self) -> None:
        for s in self._streams.values():
            s.close()
        self._streams = {}

    def snapshot(self, checkpoint_id: int) -> Any:
        # "todo": the partitions left, each with the rows of it already emitted (what a
        # restore resumes and a rescale deals out); "next"/"rows" for `checkpoints show`.
        todo = [[p, self.rows if i == self.next else self.first_rows.get(p, 0)]
                for i, p in enumerate(self.mine) if i >= self.next]
        return {"fingerprint": self.fingerprint, "partitions": self.num_partitions,
                "next": self.next, "rows": self.rows, "todo": todo}

    def rescale_state(self, old: list[Any], index: int, parallelism: int, owns: Any) -> Any:
        """The partitions (and rows of them) every old subtask had left, pooled and dealt
        out round robin: each goes to exactly one new subtask, from the row it had reached."""
        from abs_engine.errors import RescaleError, RescaleErrorReason

        if any(not isinstance(s, dict) or "todo" not in s for s in old):
            raise RescaleError(RescaleErrorReason.OLD_FORMAT,
                               f"source {self.ctx.operator!r}: the checkpoint's offsets were written before Spark "
                               "sources could be rescaled: resume at the parallelism it ran with", self.ctx.operator)
        pooled = [list(t) for s in old for t in s["todo"]]
        return {"fingerprint": old[0]["fingerprint"], "partitions": old[0]["partitions"],
                "todo": pooled[index::parallelism]}

    def restore(self, state: Any) -> None:
        if state["fingerprint"] != self.fingerprint:
            why = (f"it had {state['partitions']} partitions, now {self.num_partitions}"
                   if state["partitions"] != self.num_partitions else "its input files or schema changed")
            raise SourceChangedError(
                f"the checkpoint's read position ({state.get('todo', [])[:3]!r}: partition, rows read) no longer matches "
                f"the DataFrame: {why}. Restore with the same input, or start afresh in an empty checkpoint dir"
            )
        self._close()
        if "todo" not in state:  # written before "todo" existed: this subtask's partitions as dealt at open()
            self.next, self.rows = int(state["next"]), int(state["rows"])
            return
        # The partitions left (a rescale's: those dealt here), each from the row it had reached.
        todo = [(int(p), int(r)) for p, r in state["todo"]]
        self.mine, self.next = [p for p, _ in todo], 0
        self.first_rows = {p: r for p, r in todo if r}
        self.rows = todo[0][1] if todo else 0

    def progress(self) -> SourceProgress:
        left = max(0, len(self.mine) - self.next)
        where = f"partition {self.mine[self.next]}, row {self.rows:,}" if left else "end"
        return SourceProgress(left, self.num_partitions, "partitions", where)

    def close(self) -> None:
        self._close()
