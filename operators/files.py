"""File source (replayable by byte offset) and an exactly-once, two-phase-commit file sink."""

from __future__ import annotations

import hashlib
import os
from typing import Any, Callable

from abs_engine import fs
from abs_engine.errors import InputError

from .base import OperatorContext, Sink, Source, function_label
from .epoch_parts import EpochParts
from .progress import SourceProgress

FINGERPRINT_EDGE = 64 * 1024  #: bytes hashed at each end of the file for its fingerprint


class SourceChangedError(InputError):
    """The input file is not the one a checkpoint's offset points into (retrying cannot help)."""

    fatal = True


class OutputChangedError(InputError):
    """The output file is shorter than what a checkpoint says was committed to it: changed
    or removed outside the job (retrying cannot help)."""

    fatal = True


def file_fingerprint(f: Any) -> list[Any]:
    """[size, mtime_ns, sha256 of the first and last 64 KiB] of an open binary file."""
    st = os.fstat(f.fileno())
    h = hashlib.sha256()
    f.seek(0)
    h.update(f.read(FINGERPRINT_EDGE))
    f.seek(max(0, st.st_size - FINGERPRINT_EDGE))
    h.update(f.read(FINGERPRINT_EDGE))
    return [st.st_size, st.st_mtime_ns, h.hexdigest()]


class TextFileSource(Source[str]):
    """Lines of the UTF-8 text file ``path``, without their newline, about ``batch_bytes``
    (64 KiB) of them per batch. check() raises InputError if it is not a file.

    Subtask i of p reads the lines that *start* in byte range [size*i/p, size*(i+1)/p).
    Its offset is the byte position of the next line to read, with the end of its range
    (and any further ranges it was dealt on a rescale), so a restore rewinds exactly and
    never re-reads the ranges of other subtasks. A range's lines are those that start in
    it, so a range can be cut at any byte: rescaling pools every old subtask's unread
    ranges and gives new subtask i the i-th of ``parallelism`` equal shares of their bytes.

    Every snapshot carries the file's fingerprint (size, mtime in ns, sha256 of its first
    and last 64 KiB) with the offset; restoring into a file with another fingerprint (it was
    appended to, truncated, rewritten or touched) raises ``SourceChangedError``, which fails
    the job at once instead of resuming at an offset into other data.
    """

    def __init__(self, path: str | os.PathLike[str], batch_bytes: int = 1 << 16):
        # Absolute here, in the driver: a worker (on Spark, in an executor's directory) reads
        # the file the user named, not one relative to wherever it runs.
        self.path = os.path.abspath(os.fspath(path))
        self.batch_bytes = batch_bytes

    def check(self) -> None:
        if not os.path.isfile(self.path):
            raise InputError(
                f"input file {self.path!r} does not exist (or is not a file): "
                "pass the path of an existing text file"
            )

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self.check()
        self._f = open(self.path, "rb")
        self.fingerprint = file_fingerprint(self._f)
        size = self.fingerprint[0]
        i, p = ctx.subtask_index, ctx.parallelism
        self.start, self.end = size * i // p, size * (i + 1) // p
        self.pos = self._first_line_at_or_after(self.start)
        self.more: list[list[int]] = []  #: further byte ranges [start, end) to read, in order

    def _first_line_at_or_after(self, at: int) -> int:
        if at == 0:
            return 0
        self._f.seek(at - 1)
        if self._f.read(1) == b"\n":
            return at
        self._f.readline()
        return self._f.tell()

    def _next_chunk(self) -> bytes | None:
        """The next whole lines of this subtask's ranges, at most about ``batch_bytes``
        (one line longer than that comes whole), as bytes; None at the end. Advances the
        offset past them."""
        while self.pos >= self.end:
            if not self.more:
                return None
            start, self.end = self.more.pop(0)
            self.pos = self._first_line_at_or_after(start)
        f = self._f
        f.seek(self.pos)
        chunk = f.read(self.batch_bytes)
        if not chunk:
            return None
        # Lines that start before self.end belong to us: cut after the newline that ends
        # the line holding byte end-1, or after the last whole line in the chunk.
        limit = self.end - 1 - self.pos
        if limit < len(chunk):
            nl = chunk.find(b"\n", limit)
            if nl == -1:
                chunk += f.readline()
            else:
                chunk = chunk[: nl + 1]
        else:
            nl = chunk.rfind(b"\n")
            if nl == -1:
                chunk += f.readline()
            else:
                chunk = chunk[: nl + 1]
        self.pos += len(chunk)
        return chunk

    def read_batch(self) -> list[str] | None:
        chunk = self._next_chunk()
        if chunk is None:
            return None
        try:
            text = chunk.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"{self.path!r} is not valid UTF-8 near byte {self.pos - len(chunk) + e.start}") from e
        lines = text.split("\n")
        if lines[-1] == "":
            lines.pop()
        return lines

    def snapshot(self, checkpoint_id: int) -> Any:
        return {"offset": self.pos, "end": self.end, "more": [list(r) for r in self.more],
                "fingerprint": self.fingerprint}

    def rescale_state(self, old: list[Any], index: int, parallelism: int, owns: Any) -> Any:
        from abs_engine.errors import RescaleError, RescaleErrorReason

        ranges: list[tuple[int, int]] = []
        for state in old:
            if "end" not in state:
                raise RescaleError(RescaleErrorReason.OLD_FORMAT,
                                   f"source {self.ctx.operator!r}: the checkpoint was written by an older version "
                                   "that did not record its byte ranges; resume at its old parallelism once, then "
                                   "rescale from a newer checkpoint", self.ctx.operator)
            ranges += [(int(a), int(b)) for a, b in [[state["offset"], state["end"]], *state["more"]] if a < b]
        total = sum(b - a for a, b in ranges)
        lo, hi = total * index // parallelism, total * (index + 1) // parallelism
        mine: list[list[int]] = []
        at = 0  # bytes of the pooled ranges before the current one
        for a, b in ranges:
            cut_a, cut_b = max(a, a + lo - at), min(b, a + hi - at)
            if cut_a < cut_b:
                mine.append([cut_a, cut_b])
            at += b - a
        first = mine.pop(0) if mine else [0, 0]
        return {"offset": first[0], "end": first[1], "more": mine, "fingerprint": old[0]["fingerprint"]}

    def restore(self, state: Any) -> None:
        then = list(state["fingerprint"])
        if then != self.fingerprint:
            what = []
            if then[0] != self.fingerprint[0]:
                what.append(f"size {then[0]} -> {self.fingerprint[0]} bytes")
            if then[1] != self.fingerprint[1]:
                what.append("modification time")
            if then[2] != self.fingerprint[2]:
                what.append("content")
            raise SourceChangedError(
                f"input file {self.path!r} changed since the checkpoint was taken ({', '.join(what)}): "
                f"its offset (byte {state['offset']}) may point into other data. Restore the original file, "
                "or start the job afresh with an empty checkpoint directory"
            )
        # An offset is a line start, except where a rescale cut a range: start at the next line.
        self.pos = self._first_line_at_or_after(int(state["offset"]))
        if "end" in state:  # older checkpoints recorded the offset only; their end is this subtask's
            self.end = int(state["end"])
            self.more = [[int(a), int(b)] for a, b in state["more"]]

    def progress(self) -> SourceProgress:
        left = max(0, self.end - self.pos) + sum(b - a for a, b in self.more)
        return SourceProgress(left, int(self.fingerprint[0]), "bytes", f"byte {self.pos:,}")

    def close(self) -> None:
        self._f.close()


def _default_format(record: Any) -> str:
    if isinstance(record, str):
        return record
    if isinstance(record, (tuple, list)):
        return "\t".join(map(str, record))
    return str(record)


def _jsonl(record: Any) -> str:
    import json

    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


def _csv(record: Any) -> str:
    import csv
    import io

    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow(record if isinstance(record, (tuple, list)) else [record])
    return buf.getvalue()


#: FileSink's named formats: one line per record.
FORMATS: dict[str, Callable[[Any], str]] = {
    "tsv": _default_format,  #: a string as is; a tuple's fields joined by tabs ("key<TAB>value"); else str()
    "jsonl": _jsonl,  #: one JSON value per line (a tuple is an array)
    "csv": _csv,  #: one CSV row per line (RFC 4180 quoting; a scalar is a one-field row)
}


def _formatter(format: str | Callable[[Any], str] | None) -> Callable[[Any], str]:
    if format is None:
        return _default_format
    if callable(format):
        return format
    if format not in FORMATS:
        raise ValueError(f"FileSink format must be one of {sorted(FORMATS)} or a function record -> str, "
                         f"got {format!r}")
    return FORMATS[format]


class FileSink(Sink):
    """Writes one line per record, exactly once, by two-phase commit.

    Phase 1 (snapshot at barrier n): the lines received since barrier n-1 become epoch n,
    stored *in the checkpoint* (so a checkpoint is self-contained and checksummed).
    Phase 2 (checkpoint n completes): epochs <= n are appended to the output and fsynced.
    On restore from checkpoint n the output is truncated to the length it had when n was
    taken and the epochs n still held pending are published again: the output then holds
    exactly the epochs <= n, whatever was published before the crash.

    With parallelism 1, ``path`` is the output file; otherwise (or with ``directory=True``;
    None, the default, decides by parallelism) ``path`` is a directory of ``part-00000``,
    ``part-00001``, ... files.

    On an object store or remote file system (``s3://``, ``gs://``, ``abfs://``, ``hdfs://``:
    the URIs checkpoints take, abs_engine/fs.py) nothing can be appended to: ``path`` is a
    prefix under which each subtask's epoch n becomes one object ``part-<subtask>-<n>.txt``,
    put whole when checkpoint n completes (operators/epoch_parts.py). A restore from
    checkpoint n deletes this subtask's objects of later epochs and puts the pending ones
    again (the same names: idempotent).

    ``format``: ``"tsv"`` (the default: a string as is, a pair as ``key<TAB>value``, any
    tuple's fields joined by tabs), ``"jsonl"`` (one JSON value per line; a record that JSON
    cannot hold fails the task naming it), ``"csv"``, or a function record -> str. A line
    must not contain a newline of its own (tsv and functions: yours to ensure).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        format: str | Callable[[Any], str] | None = None,
        directory: bool | None = None,
    ):
        self.path = os.fspath(path)
        self.remote = fs.is_remote(self.path)
        if not self.remote:
            self.path = os.path.abspath(self.path)  # (the driver's directory, as TextFileSource)
        self.format = _formatter(format)
        self.directory = directory  #: None: a file at parallelism 1, a directory otherwise
        self.buffer: list[str] = []
        self.pending: list[tuple[int, bytes]] = []
        self.published = 0

    def check(self) -> None:
        if self.remote:
            try:
                fs.Store(self.path).make_root()
            except fs.StoreError as e:
                raise InputError(f"cannot write output: {e}") from None
            return
        parent = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(parent):
            raise InputError(f"cannot write output {self.path!r}: directory {parent!r} does not exist")

    def outputs(self) -> list[str]:
        return [self.path]

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        if self.remote:
            out = fs.open_dir(self.path)
            out.make_root()
            self.parts = EpochParts(out, ctx.subtask_index, ".txt")
            with ctx.guard():
                self.parts.start(ctx.restored, ctx.parallelism)
            return
        if not (self.directory or (self.directory is None and ctx.parallelism > 1)):
            self.out_path = self.path
        else:
            os.makedirs(self.path, exist_ok=True)
            self.out_path = os.path.join(self.path, f"part-{ctx.subtask_index:05d}")
        if not ctx.restored:
            with ctx.guard(), open(self.out_path, "wb") as f:
                os.fsync(f.fileno())

    def process(self, batch: list[Any]) -> list[Any]:
        try:
            lines = list(map(self.format, batch))
        except Exception:
            label = function_label("format", self.format)
            for record in batch:  # name the record the format cannot write
                try:
                    self.format(record)
                except Exception as e:
                    self.record_failed(record, label, e)  # a sink never skips: it raises
            raise
        self.buffer.extend(lines)
        return []

    def snapshot(self, checkpoint_id: int) -> Any:
        if self.buffer:
            data = ("\n".join(self.buffer) + "\n").encode("utf-8")
            self.pending.append((checkpoint_id, data))
            self.buffer = []
        return {"published": self.published, "pending": list(self.pending), "checkpoint": checkpoint_id}

    def restore(self, state: Any) -> None:
        self.published = state["published"]
        self.pending = [(int(e), bytes(d)) for e, d in state["pending"]]
        self.buffer = []
        if self.remote:
            with self.ctx.guard():  # later epochs' objects were published by the failed attempt
                self.parts.rollback(after=int(state["checkpoint"]))
                self._publish(upto=None)
            return
        with self.ctx.guard():  # fenced: a stale attempt must not race this truncate
            size = os.path.getsize(self.out_path) if os.path.exists(self.out_path) else -1
            if size < self.published:
                raise OutputChangedError(
                    f"output {self.out_path!r} is shorter ({size} bytes) than the {self.published} bytes "
                    "the checkpoint says were committed: it was changed outside the job; "
                    "restore it or start the job afresh"
                )
            # Everything pending in a completed checkpoint is committed (recover-and-commit).
            self._publish(upto=None)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        with self.ctx.guard():
            self._publish(upto=checkpoint_id)

    def _publish(self, upto: int | None) -> None:
        """Append the ready epochs after ``published`` (remote: put each as its object).
        Call under ``ctx.guard()``."""
        if self.remote:
            for e, d in self.pending:
                if upto is None or e <= upto:
                    self.parts.put(e, d)
            self.pending = [(e, d) for e, d in self.pending if not (upto is None or e <= upto)]
            return
        ready = [d for e, d in self.pending if upto is None or e <= upto]
        with open(self.out_path, "r+b") as f:
            # Truncating first drops anything a crash left half-written after `published`.
            f.truncate(self.published)
            f.seek(self.published)
            for data in ready:
                f.write(data)
                self.published += len(data)
            f.flush()
            os.fsync(f.fileno())
        self.pending = [(e, d) for e, d in self.pending if not (upto is None or e <= upto)]
