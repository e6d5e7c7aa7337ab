"""Columnar sources: record batches read without a Python object per row.

- ``ArrowTextSource(path)``: a UTF-8 text file as batches of one string column (``line``),
  split on newlines by Arrow's kernels. Offsets, splits, rescaling and the changed-file check
  are ``TextFileSource``'s (byte ranges of whole lines), so a batch is a run of whole lines
  and a restore re-reads from the first line after the checkpoint.
- ``ParquetSource(path)``: a Parquet file, or a directory of them, as the record batches of
  its row groups. Its splits are the row groups (file, group), dealt round robin to the
  subtasks; its offset is each unread split with the rows of it already emitted, so a
  restore resumes at the row and a rescale pools the unread splits and deals them out.
  Every snapshot carries the files' sizes and modification times: restoring into changed
  files raises ``SourceChangedError`` instead of resuming at an offset into other data.

Spark DataFrames hand their Arrow batches on too: ``SparkSource(df, batches=True)``.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from abs_engine.errors import InputError

from .base import OperatorContext, Source
from .files import SourceChangedError, TextFileSource
from .progress import SourceProgress


class ArrowTextSource(TextFileSource):
    """Lines of the UTF-8 text file ``path`` as RecordBatches of one string column,
    ``column`` (newlines removed), about ``batch_bytes`` of text each (as TextFileSource)."""

    preload = ("pyarrow", "pyarrow.compute")

    def __init__(self, path: str | os.PathLike[str], batch_bytes: int = 1 << 20, column: str = "line"):
        super().__init__(path, batch_bytes)
        self.column = column

    def read_batch(self) -> list[Any] | None:
        chunk = self._next_chunk()
        if chunk is None:
            return None
        import pyarrow as pa
        import pyarrow.compute as pc

        offsets = pa.array([0, len(chunk)], pa.int32()).buffers()[1]
        text = pa.StringArray.from_buffers(1, offsets, pa.py_buffer(chunk))
        try:
            text.validate(full=True)  # UTF-8, as TextFileSource's decode checks
        except pa.ArrowInvalid:
            start = self.pos - len(chunk)
            try:
                chunk.decode("utf-8")
            except UnicodeDecodeError as e:
                start += e.start
            raise InputError(f"{self.path!r} is not valid UTF-8 near byte {start}") from None
        lines = pc.list_flatten(pc.split_pattern(text, "\n"))
        if chunk.endswith(b"\n"):
            lines = lines.slice(0, len(lines) - 1)  # (the empty string after the last newline)
        return [pa.record_batch([lines], names=[self.column])]


def _parquet_files(path: str) -> list[str]:
    if os.path.isdir(path):
        return sorted(os.path.join(path, n) for n in os.listdir(path)
                      if n.endswith(".parquet") and not n.startswith((".", "_")))
    return [path]


def _fingerprint(files: list[str]) -> list[list[Any]]:
    out = []
    for f in files:
        st = os.stat(f)
        out.append([os.path.basename(f), st.st_size, st.st_mtime_ns])
    return out


class ParquetSource(Source[Any]):
    """The rows of a Parquet file ``path``, or of every ``*.parquet`` file of that directory
    (in name order), as RecordBatches of at most ``batch_rows`` rows of ``columns`` (default:
    all). ValueError if ``batch_rows`` < 1; check() raises InputError for a missing input."""

    preload = ("pyarrow", "pyarrow.parquet")

    def __init__(self, path: str | os.PathLike[str], columns: Sequence[str] | None = None,
                 batch_rows: int = 1 << 16):
        self.path = os.path.abspath(os.fspath(path))
        self.columns = list(columns) if columns is not None else None
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be at least 1, got {batch_rows}")
        self.batch_rows = batch_rows

    def check(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not os.path.exists(self.path):
            raise InputError(f"Parquet input {self.path!r} does not exist: pass a Parquet file or a directory of them")
        files = _parquet_files(self.path)
        if not files:
            raise InputError(f"Parquet input {self.path!r} is a directory without *.parquet files")
        try:
            schema = pq.read_schema(files[0])
        except (pa.ArrowException, OSError) as e:
            raise InputError(f"cannot read Parquet file {files[0]!r}: {e}") from None
        missing = [c for c in self.columns or [] if c not in schema.names]
        if missing:
            raise InputError(f"Parquet input {self.path!r} has no column {missing[0]!r} (it has "
                             f"{', '.join(schema.names)}): fix ParquetSource(columns=...)")

    def open(self, ctx: OperatorContext) -> None:
        import pyarrow.parquet as pq

        super().open(ctx)
        self.check()
        self.files = _parquet_files(self.path)
        self.fingerprint = _fingerprint(self.files)
        #: every split (file index, row group), in file and row group order
        self.splits = [(f, g) for f, name in enumerate(self.files)
                       for g in range(pq.ParquetFile(name).metadata.num_row_groups)]
        #: this subtask's unread splits, each with the rows of it already emitted
        self.todo: list[list[int]] = [[s, 0] for s in range(ctx.subtask_index, len(self.splits), ctx.parallelism)]
        self._group: tuple[int, Any] | None = None  #: (split, its row group as a Table)

    def read_batch(self) -> list[Any] | None:
        if not self.todo:
            return None
        split, done = self.todo[0]
        if self._group is None or self._group[0] != split:
            import pyarrow.parquet as pq

            f, g = self.splits[split]
            self._group = (split, pq.ParquetFile(self.files[f]).read_row_group(g, columns=self.columns))
        table = self._group[1]
        part = table.slice(done, self.batch_rows).combine_chunks()
        if done + part.num_rows >= table.num_rows:
            self.todo.pop(0)
            self._group = None
        else:
            self.todo[0][1] = done + part.num_rows
        return [b for b in part.to_batches() if b.num_rows]

    def snapshot(self, checkpoint_id: int) -> Any:
        return {"files": self.fingerprint, "todo": [list(t) for t in self.todo]}

    def restore(self, state: Any) -> None:
        then = [list(f) for f in state["files"]]
        if then != self.fingerprint:
            changed = sorted({f[0] for f in then} ^ {f[0] for f in self.fingerprint}) or [
                a[0] for a, b in zip(then, self.fingerprint) if a != b]
            raise SourceChangedError(
                f"Parquet input {self.path!r} changed since the checkpoint was taken ({', '.join(changed[:3])}): its "
                "offsets may point into other rows. Restore the original files, or start the job afresh with an "
                "empty checkpoint directory")
        self.todo = [[int(s), int(r)] for s, r in state["todo"]]
        self._group = None

    def rescale_state(self, old: list[Any], index: int, parallelism: int, owns: Any) -> Any:
        pooled = sorted([int(s), int(r)] for st in old for s, r in st["todo"])
        return {"files": old[0]["files"], "todo": pooled[index::parallelism]}

    def progress(self) -> SourceProgress:
        todo = self.todo
        if not todo:
            return SourceProgress(0, len(self.splits), "row groups", "end")
        split, rows = todo[0]
        f, g = self.splits[split]
        where = f"{os.path.basename(self.files[f])} row group {g}, row {rows:,}"
        return SourceProgress(len(todo), len(self.splits), "row groups", where)
