"""The part every table sink shares (Delta Lake, Iceberg): rows held per checkpoint epoch,
kept in the checkpoint, published when the checkpoint completes, and republished after a
restore, with the publishing itself (idempotent, one commit) left to the subclass.

Invariants:
- Nothing is published in ``process`` or ``snapshot``: only epochs of a completed
  checkpoint, in ``notify_checkpoint_complete`` and ``restore`` (docs/writing-connectors.md).
- The epochs are in every checkpoint until published, as rows of msgpack data.
- ``app_id`` names the job, the sink, its subtask and the run; a run started afresh gets a
  new run part, a restored one keeps its checkpoint's. A subclass records the checkpoint id
  it published under this ``app_id`` atomically with the rows, and skips epochs at or below
  the recorded one.
- Publishing runs under the engine's fence (``ctx.guard()``); a conflict with another
  subtask's commit (``conflicts()``) is retried, boundedly, with the table read again.
"""

from __future__ import annotations

import random
import secrets
import time
from typing import Any, Callable, Sequence

from abs_engine.arrow_ipc import is_record_batch
from abs_engine.errors import InputError

from .base import OperatorContext, Sink
from .record_errors import function_label

#: Tries of one commit that conflicts with other subtasks' (then the task fails and restarts).
COMMIT_ATTEMPTS = 20


class TableAheadError(InputError):
    """The table holds epochs of a newer checkpoint than the one restored (an older
    checkpoint or savepoint was restored): committing again would lose or repeat rows."""

    fatal = True


class EpochSink(Sink):
    """Rows as dicts of ``names`` (from dicts, tuples in ``names``' order, or ``to_row``), or
    whole ``pyarrow.RecordBatch`` records (the columnar path: held, checkpointed and written
    as Arrow, never row by row), held per epoch; subclasses implement ``publish(epochs)``
    and may override ``conflicts``."""

    def conflicts(self) -> tuple[type[BaseException], ...]:
        """Exceptions that mean another writer committed first: the commit is tried again.
        (Looked up when committing, in the worker: a library's classes are not shipped.)"""
        return ()

    def __init__(self, names: Sequence[str], to_row: Callable[[Any], Any] | None):
        self.names = list(names)
        self.to_row = to_row
        self.buffer: list[Any] = []  #: rows (dicts) and RecordBatches since the last barrier
        self.pending: list[tuple[int, list[Any]]] = []  #: (checkpoint id, its rows and batches) not yet published
        self.run = ""

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self.run = secrets.token_hex(6)  # a restore replaces it with its checkpoint's

    def app_id(self) -> str:
        return f"abs-engine:{self.ctx.job}:{self.ctx.operator}:{self.ctx.subtask_index}:{self.run}"

    def process(self, batch: list[Any]) -> list[Any]:
        names = self.names
        for record in batch:
            if is_record_batch(record) and self.to_row is None:
                missing = [n for n in names if n not in record.schema.names]
                if missing:
                    self.record_failed(record, f"sink {self.ctx.operator!r} (a batch must have the schema's fields)",
                                       ValueError(f"a RecordBatch without the column(s) {missing}"))
                    continue
                self.buffer.append(record)
                continue
            try:
                value = self.to_row(record) if self.to_row is not None else record
                row = value if isinstance(value, dict) else dict(zip(names, value, strict=True))
            except Exception as e:
                self.record_failed(record, function_label("to_row", self.to_row) if self.to_row is not None
                                   else f"sink {self.ctx.operator!r} (a record must be a row)", e)
                continue
            self.buffer.append(row)
        return []

    def snapshot(self, checkpoint_id: int) -> Any:
        if self.buffer:
            self.pending.append((checkpoint_id, self.buffer))
            self.buffer = []
        return {"run": self.run, "pending": [[cid, rows] for cid, rows in self.pending], "checkpoint": checkpoint_id}

    def restore(self, state: Any) -> None:
        self.run = str(state["run"])
        self.pending = [(int(cid), list(rows)) for cid, rows in state["pending"]]
        self.buffer = []
        if "checkpoint" in state:
            recorded, restored = self.recorded(), int(state["checkpoint"])
            if recorded > restored:
                raise TableAheadError(
                    f"sink {self.ctx.operator!r} subtask {self.ctx.subtask_index}: its table already holds checkpoint "
                    f"{recorded}, newer than the checkpoint restored ({restored}): restoring an older checkpoint or "
                    "savepoint into it would lose or repeat rows. Restore the newest checkpoint, or start the job "
                    "afresh into another table")
        self._commit(None)  # recover-and-commit: every epoch of a completed checkpoint

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._commit(checkpoint_id)

    def _commit(self, upto: int | None) -> None:
        ready = [(cid, rows) for cid, rows in self.pending if upto is None or cid <= upto]
        if not ready:
            return
        self._step("before")
        conflicts = self.conflicts()
        for attempt in range(COMMIT_ATTEMPTS):
            try:
                with self.ctx.guard():
                    self.publish(ready)
                break
            except conflicts:
                if attempt == COMMIT_ATTEMPTS - 1:
                    raise
                time.sleep(random.uniform(0.01, 0.05) * (attempt + 1))  # backoff between retries
        self._step("after")
        finished = {cid for cid, _ in ready}
        self.pending = [(cid, rows) for cid, rows in self.pending if cid not in finished]

    def recorded(self) -> int:
        """The newest checkpoint id the table records for ``app_id()`` (0: none)."""
        raise NotImplementedError

    def publish(self, epochs: list[tuple[int, list[Any]]]) -> None:
        """One commit of the ``epochs`` above the checkpoint id recorded for ``app_id()``,
        recording the newest one's id with them."""
        raise NotImplementedError

    @staticmethod
    def to_arrow(items: list[Any], schema: Any, key: Sequence[str] = ()) -> Any:
        """The rows and RecordBatches of ``items`` as one ``pyarrow.Table`` of ``schema``;
        with ``key``, only the last row of each key (a merge takes one source row per key)."""
        import pyarrow as pa

        if key:
            rows: list[dict[str, Any]] = []
            for item in items:
                rows.extend(item.to_pylist() if is_record_batch(item) else [item])
            return pa.Table.from_pylist(list({tuple(r[k] for k in key): r for r in rows}.values()), schema=schema)
        parts = [pa.Table.from_batches([b]).select(schema.names).cast(schema) for b in items if is_record_batch(b)]
        rows = [r for r in items if not is_record_batch(r)]
        if rows or not parts:
            parts.append(pa.Table.from_pylist(rows, schema=schema))
        return pa.concat_tables(parts)

    def _step(self, step: str) -> None:
        """A point of the commit (``before`` it, ``after`` it): a hook for tests that kill the
        worker there."""
