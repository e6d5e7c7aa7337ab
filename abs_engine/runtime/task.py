"""The run loop of one task: a chain of operators, its input and output channels.

Invariants:
- Records are processed a batch at a time; a batch crosses a process boundary as one
  msgpack frame.
- A snapshot for checkpoint n reflects exactly the records before barrier n on every
  regular input (aligned ABS): blocked inputs are not read, not even from our buffers.
- Order at a snapshot: operators snapshot -> state encoded (a consistent copy) -> barrier
  forwarded on every output -> the copy is written and fsynced off the task thread ->
  acknowledgement to the coordinator.
- A task that has finished (end of stream on every input) emits nothing more; the
  coordinator triggers its snapshots directly.
"""

from __future__ import annotations

import hashlib
import os
import queue
import selectors
import threading
import time
from collections import deque
from typing import Any, Callable

from operators.base import Operator, Source

from .. import codec, messages
from ..errors import SerializationError
from ..plan import OutputSpec, TaskSpec
from .alignment import BarrierAligner, Outcome
from .channel import InputChannel, OutputChannel
from .control import ControlLink

PROGRESS_EVERY = 0.5  # seconds between progress reports of a source


class OperatorFailure(Exception):
    """User code of ``operator`` raised (the cause holds the user's exception)."""

    def __init__(self, operator: str, fatal: bool = False):
        super().__init__(operator)
        self.operator = operator
        self.fatal = fatal


class Output:
    """One out-edge: partitions a batch over its channels and sends one frame per channel."""

    def __init__(self, spec: OutputSpec, channels: list[OutputChannel], key_fn: Callable[[Any], Any] | None, producer: str):
        self.channels = channels
        self.partition = spec.partition
        self.key_fn = key_fn
        self.producer = producer
        self.rr = 0

    def _frame(self, batch: list[Any]) -> bytes:
        try:
            return codec.records_frame(batch)
        except (TypeError, ValueError, OverflowError) as e:
            raise OperatorFailure(self.producer, fatal=True) from SerializationError("a record", self.producer, str(e))

    def emit(self, batch: list[Any]) -> None:
        chans = self.channels
        n = len(chans)
        if n == 1:
            chans[0].send(self._frame(batch))
        elif self.partition == "hash":
            parts: list[list[Any]] = [[] for _ in range(n)]
            appends = [p.append for p in parts]
            key_fn = self.key_fn
            try:
                if key_fn is None:
                    for r in batch:
                        appends[hash(r) % n](r)
                else:
                    for r in batch:
                        appends[hash(key_fn(r)) % n](r)
            except Exception as e:
                raise OperatorFailure(self.producer) from e
            for ch, part in zip(chans, parts):
                if part:
                    ch.send(self._frame(part))
        else:  # rebalance: round robin, a batch at a time
            chans[self.rr % n].send(self._frame(batch))
            self.rr += 1

    def broadcast(self, data: bytes) -> None:
        for ch in self.channels:
            ch.send(data)


class SnapshotWriter:
    """Writes snapshot files and sends the acknowledgements, off the task thread."""

    def __init__(self, control: ControlLink, task: str, on_error: Callable[[BaseException], None]):
        self.control = control
        self.task = task
        self.on_error = on_error
        self.jobs: queue.Queue[tuple[int, str, bytes, float] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="snapshot-writer", daemon=True)
        self.thread.start()

    def submit(self, checkpoint_id: int, path: str, blob: bytes, alignment_ms: float) -> None:
        self.jobs.put((checkpoint_id, path, blob, alignment_ms))

    def flush(self) -> None:
        """Wait until every submitted snapshot is written and acknowledged."""
        self.jobs.join()

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            try:
                if job is None:
                    return
                cid, path, blob, alignment_ms = job
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(blob)
                    f.flush()
                    os.fsync(f.fileno())
                digest = hashlib.sha256(blob).hexdigest()
                self.control.send(
                    messages.Ack(cid, self.task, os.path.basename(path), len(blob), digest, alignment_ms)
                )
            except BaseException as e:  # noqa: BLE001 - reported to the driver, then the worker dies
                self.on_error(e)
            finally:
                self.jobs.task_done()


class Task:
    def __init__(
        self,
        spec: TaskSpec,
        op_names: list[str],
        ops: list[Operator],
        source: Source | None,
        source_name: str | None,
        outputs: list[Output],
        inputs: dict[str, InputChannel],
        control: ControlLink,
        writer: SnapshotWriter,
        checkpoint_dir: str,
    ):
        self.spec = spec
        self.op_names = op_names
        self.ops = ops
        self.source = source
        self.source_name = source_name
        self.outputs = outputs
        self.inputs = inputs
        self.control = control
        self.writer = writer
        self.checkpoint_dir = checkpoint_dir
        self.aligner = BarrierAligner(c.id for c in inputs.values() if not c.back_edge)
        self.finished = False
        self.stop = False
        self.records_in = 0
        self.records_out = 0
        self.blocked_since: float | None = None
        self.last_snapshot = 0  #: a trigger for an id <= this is a duplicate (e.g. barrier then direct)

    # ---- the chain ------------------------------------------------------------------

    def _process(self, batch: list[Any], start: int = 0) -> list[Any]:
        i = start
        try:
            ops = self.ops
            for i in range(start, len(ops)):
                batch = ops[i].process(batch)
                if not batch:
                    return batch
            return batch
        except OperatorFailure:
            raise
        except Exception as e:
            raise OperatorFailure(self.op_names[i]) from e

    def _emit(self, batch: list[Any]) -> None:
        if batch:
            self.records_out += len(batch)
            for out in self.outputs:
                out.emit(batch)

    def _finish(self) -> None:
        """End of input: flush final results through the chain, then end of stream."""
        batch: list[Any] = []
        for i, op in enumerate(self.ops):
            try:
                if batch:
                    batch = op.process(batch)
                batch = list(batch) + op.finish()
            except Exception as e:
                raise OperatorFailure(self.op_names[i]) from e
        self._emit(batch)
        end = codec.frame(codec.FrameKind.END)
        for out in self.outputs:
            out.broadcast(end)
        self.finished = True
        self.control.send(messages.Finished(self.spec.id, self.records_in, self.records_out))

    # ---- checkpoints ------------------------------------------------------------------

    def _snapshot(self, checkpoint_id: int) -> None:
        self.last_snapshot = checkpoint_id
        states: dict[str, bytes] = {}
        for name, op in self._all_operators():
            try:
                state = op.snapshot(checkpoint_id)
            except Exception as e:
                raise OperatorFailure(name) from e
            try:
                states[name] = codec.pack(state)
            except (TypeError, ValueError, OverflowError) as e:
                raise OperatorFailure(name, fatal=True) from SerializationError("the state", name, str(e))
        blob = codec.pack({"task": self.spec.id, "checkpoint_id": checkpoint_id, "operators": states})
        if not self.finished:
            barrier = codec.frame(codec.FrameKind.BARRIER, codec.pack(checkpoint_id))
            for out in self.outputs:
                out.broadcast(barrier)
        alignment_ms = 0.0
        if self.blocked_since is not None:
            alignment_ms = (time.perf_counter() - self.blocked_since) * 1000
            self.blocked_since = None
        path = os.path.join(self.checkpoint_dir, f"chk-{checkpoint_id:06d}", f"{self.spec.id}.state")
        self.writer.submit(checkpoint_id, path, blob, alignment_ms)

    def _all_operators(self) -> list[tuple[str, Any]]:
        head = [(self.source_name, self.source)] if self.source is not None else []
        return head + list(zip(self.op_names, self.ops))

    def _notify_complete(self, checkpoint_id: int) -> None:
        for name, op in self._all_operators():
            try:
                op.notify_checkpoint_complete(checkpoint_id)
            except Exception as e:
                raise OperatorFailure(name) from e

    def on_control(self, msg: messages.Message) -> None:
        if isinstance(msg, messages.Trigger):
            # Sources are triggered by the coordinator; other tasks only once finished.
            if (self.source is not None or self.finished) and msg.checkpoint_id > self.last_snapshot:
                self._snapshot(msg.checkpoint_id)
        elif isinstance(msg, messages.NotifyComplete):
            self._notify_complete(msg.checkpoint_id)
            if msg.final:
                self.writer.flush()
                self.control.send(messages.Committed(self.spec.id))
                self.stop = True
        elif isinstance(msg, messages.Shutdown):
            self.stop = True

    # ---- run loops ----------------------------------------------------------------------

    def run(self) -> None:
        if self.source is not None:
            self._run_source()
        else:
            self._run_inputs()

    def _run_source(self) -> None:
        source, control = self.source, self.control
        assert source is not None
        last_progress = time.monotonic()
        while not self.stop:
            if self.finished:
                self.on_control(control.receive())
                continue
            for msg in control.poll():
                self.on_control(msg)
            if self.stop:
                break
            try:
                batch = source.read_batch()
            except Exception as e:
                raise OperatorFailure(self.source_name or "source") from e
            if batch is None:
                self._finish()
                continue
            if batch:
                self.records_in += len(batch)
                self._emit(self._process(batch, 0) if self.ops else batch)
            now = time.monotonic()
            if now - last_progress >= PROGRESS_EVERY:
                last_progress = now
                control.send(messages.Progress(self.spec.id, self.records_in, self.records_out))

    def _run_inputs(self) -> None:
        sel = selectors.DefaultSelector()
        control = self.control
        sel.register(control.sock, selectors.EVENT_READ, None)
        for ch in self.inputs.values():
            sel.register(ch.sock, selectors.EVENT_READ, ch)
        runnable: deque[InputChannel] = deque(ch for ch in self.inputs.values() if ch.reader.buffered())
        blocked: list[InputChannel] = []
        aligner = self.aligner

        while not self.stop:
            while runnable and not self.stop:
                ch = runnable.popleft()
                while not aligner.is_blocked(ch.id) and not ch.ended:
                    frame = ch.next_frame()
                    if frame is None:
                        break
                    kind, payload = frame
                    if kind == codec.FrameKind.RECORDS:
                        batch = codec.unpack(payload)
                        self.records_in += len(batch)
                        self._emit(self._process(list(batch), 0))
                    elif kind == codec.FrameKind.BARRIER:
                        d = aligner.on_barrier(ch.id, codec.unpack(payload))
                        if d.outcome in (Outcome.BLOCKED, Outcome.ABORTED_AND_BLOCKED):
                            if self.blocked_since is None:
                                self.blocked_since = time.perf_counter()
                            sel.unregister(ch.sock)
                            blocked.append(ch)
                        elif d.outcome is Outcome.TRIGGERED:
                            self._snapshot(d.checkpoint_id)  # type: ignore[arg-type]
                            for b in blocked:
                                sel.register(b.sock, selectors.EVENT_READ, b)
                                runnable.append(b)
                            blocked.clear()
                    elif kind == codec.FrameKind.END:
                        ch.ended = True
                        sel.unregister(ch.sock)
                        d = aligner.on_end_of_stream(ch.id)
                        if d.outcome is Outcome.TRIGGERED:
                            self._snapshot(d.checkpoint_id)  # type: ignore[arg-type]
                            for b in blocked:
                                sel.register(b.sock, selectors.EVENT_READ, b)
                                runnable.append(b)
                            blocked.clear()
                        if aligner.all_ended:
                            self._finish()
            if self.stop:
                break
            for key, _ in sel.select():
                if key.data is None:
                    control.fill()
                    for msg in control.poll():
                        self.on_control(msg)
                else:
                    ch = key.data
                    ch.fill()
                    runnable.append(ch)
        sel.close()
