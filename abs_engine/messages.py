"""Control messages between the driver (coordinator) and the workers.

Every message is a frozen dataclass; on the wire it is the msgpack array
``[TAG, field1, field2, ...]`` inside a CONTROL frame (see codec.py). Data-plane
messages (record batches, barriers, end of stream) are frame kinds, not classes,
so the hot path never builds an object per batch.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

from . import codec
from .errors import ProtocolError, ProtocolErrorReason


@dataclass(frozen=True)
class Message:
    TAG: ClassVar[str] = ""


# ---- driver -> worker -------------------------------------------------------------


@dataclass(frozen=True)
class Deploy(Message):
    """Everything a worker needs to build and start its task."""

    TAG: ClassVar[str] = "deploy"
    plan: dict[str, Any]  #: the plan as pure data (plan.Plan.to_dict())
    code: bytes  #: cloudpickled {operator id: operator factory}: user code, never data
    peers: dict[str, tuple[str, int]]  #: task id -> data address of its worker
    restore: dict[str, Any] | None  #: what the task restores (checkpoint/restore_spec.py: to_data), or None
    restore_final: bool  #: the restored checkpoint is the job's final one: commit and exit
    checkpoint_dir: str
    fence: str = ""  #: this attempt's fence token: sinks publish only while it is current
    heartbeat_interval: float = 1.0  #: seconds between the worker's heartbeats
    task_timeout: float = 0.0  #: a user function busy longer than this fails the task (0: never)
    connect_timeout: float = 60.0  #: for peers to connect and answer (they restore first)
    fence_dir: str = ""  #: the directory of the fence file ("": checkpoint_dir, which is local)
    snapshot_encoding: str = "auto"  #: "auto", "fork" or "inline" (runtime/snapshot_encoding.py)
    incremental: bool = False  #: write keyed state as deltas (checkpoint/incremental.py)
    #: Seconds an aligned checkpoint may align before it turns unaligned (None: never).
    aligned_timeout: float | None = None
    unaligned: bool = False  #: the job's checkpoints are unaligned (mode="unaligned")
    #: Bytes of channel state one checkpoint may hold in memory before it spills (None: never).
    channel_state_memory: int | None = None
    channel_buffer: int = 0  #: kernel buffer bytes per direction of a data channel (0: the kernel's)
    #: Bytes of back-edge input a task holds in memory before it spills (None: no bound).
    loop_memory: int | None = None
    loop_disk: int | None = None  #: bytes of back-edge input a task may spill before LoopOverflow (None: no bound)
    loop_spill_dir: str = ""  #: where back-edge input spills ("": the system's temporary directory)
    #: Seconds between the latency markers a source sends (runtime/latency.py; 0: none).
    latency_interval: float = 0.0
    #: How long the driver lets this worker be silent, when it may run on another machine:
    #: its control connection gives up after half of it without the driver acknowledging
    #: anything, and the worker exits (0: never; a worker on the driver's machine).
    heartbeat_timeout: float = 0.0


@dataclass(frozen=True)
class Trigger(Message):
    """Snapshot now. Sent to sources, and to tasks that have already finished; for an
    unaligned checkpoint to every task."""

    TAG: ClassVar[str] = "trigger"
    checkpoint_id: int
    unaligned: bool = False


@dataclass(frozen=True)
class Pause(Message):
    """Stop-the-world: a source stops reading until Resume."""

    TAG: ClassVar[str] = "pause"
    checkpoint_id: int


@dataclass(frozen=True)
class Resume(Message):
    TAG: ClassVar[str] = "resume"
    checkpoint_id: int


@dataclass(frozen=True)
class CountRequest(Message):
    """Stop-the-world: report your per-channel record counters (one wave of counting)."""

    TAG: ClassVar[str] = "count_request"
    wave: int


@dataclass(frozen=True)
class Snapshot(Message):
    """Stop-the-world: nothing is in flight; snapshot now and forward no barrier."""

    TAG: ClassVar[str] = "snapshot"
    checkpoint_id: int


@dataclass(frozen=True)
class NotifyComplete(Message):
    TAG: ClassVar[str] = "complete"
    checkpoint_id: int
    final: bool
    #: Stop with this savepoint: commit it, say Committed, then process nothing more and wait
    #: for Shutdown (exiting at once would break peers that have not committed yet).
    stop: bool = False


@dataclass(frozen=True)
class Shutdown(Message):
    TAG: ClassVar[str] = "shutdown"


# ---- worker -> driver -------------------------------------------------------------


@dataclass(frozen=True)
class Heartbeat(Message):
    """Sent by the worker's watchdog thread every heartbeat interval, even while the task
    thread is inside a user function: the driver learns the process is alive."""

    TAG: ClassVar[str] = "heartbeat"
    task: str
    #: The task's counters so far in this attempt, for the dashboard and metrics (None: not
    #: known yet): records processed (read, for a source), records emitted, and seconds
    #: spent sending on data channels (blocked by backpressure, mostly).
    records_in: int | None = None
    records_out: int | None = None
    send_s: float = 0.0
    #: Its health (runtime/task_health.py): the watermark (None: no event time), the
    #: process's CPU seconds and resident bytes, the keys and timers its operators hold (-1:
    #: not known) and the late records its windows met this attempt, by operator name.
    watermark: float | None = None
    cpu_s: float = 0.0
    rss: int = 0
    keys: int = -1
    timers: int = -1
    late: dict[str, int] = field(default_factory=dict)
    #: A source task's progress (operators/progress.py): units left to read and in the
    #: whole input (-1: unbounded or not known), the unit ("": the source does not say)
    #: and its offset as a person reads it.
    left: int = -1
    total: int = -1
    unit: str = ""
    position: str = ""


@dataclass(frozen=True)
class Hello(Message):
    TAG: ClassVar[str] = "hello"
    task: str
    generation: int
    host: str
    port: int
    pid: int


@dataclass(frozen=True)
class Running(Message):
    TAG: ClassVar[str] = "running"
    task: str


@dataclass(frozen=True)
class Ack(Message):
    """The task's snapshot for ``checkpoint_id`` is durably written."""

    TAG: ClassVar[str] = "ack"
    checkpoint_id: int
    task: str
    file: str
    size: int
    sha256: str
    alignment_ms: float
    logged: int  #: records logged on back-edges (in flight round a loop at the cut)
    finished: bool  #: the task had finished (sent end of stream) when it snapshotted
    sync_ms: float = 0.0  #: the task thread's share: operators' snapshot() and the copy (a fork, or inline)
    async_ms: float = 0.0  #: from then to the acknowledgement: encoding (if forked) and the write
    #: Incremental checkpoints (checkpoint/incremental.py): the checkpoint whose file of this
    #: task the deltas in this one apply to (None: a full file), and the newest completed
    #: checkpoint the task had been told of (what it may build on from now; None: it
    #: writes no deltas and was told of none).
    base: int | None = None
    known: int | None = None
    unaligned: bool = False  #: the task's snapshot was unaligned (logged every input's state)
    inflight_bytes: int = 0  #: bytes of the records ``logged`` (channel state)
    channel_state: int = 0  #: of ``logged``, records in flight on regular inputs (unaligned)
    #: Wall time (time.time()) the checkpoint's first barrier, or its trigger, reached the
    #: task: the driver subtracts its trigger time for the start delay (0: not known).
    first_seen: float = 0.0


@dataclass(frozen=True)
class Finished(Message):
    """The task has seen end of stream on every input (a source: read all its input)."""

    TAG: ClassVar[str] = "finished"
    task: str
    records_in: int
    records_out: int
    #: A source's progress now that it has read all, and the late records by operator (as
    #: Heartbeat's): what a job that ends before the next heartbeat keeps in its statistics.
    left: int = -1
    total: int = -1
    unit: str = ""
    position: str = ""
    late: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class InputsEnded(Message):
    """Every regular input ended but back-edges are live: trigger this task directly."""

    TAG: ClassVar[str] = "inputs_ended"
    task: str


@dataclass(frozen=True)
class EndLoop(Message):
    """A completed checkpoint proved the loops drained: treat back-edge inputs as ended."""

    TAG: ClassVar[str] = "end_loop"
    checkpoint_id: int


@dataclass(frozen=True)
class Progress(Message):
    """Periodic counters from a source task, for the driver's progress line."""

    TAG: ClassVar[str] = "progress"
    task: str
    records_in: int
    records_out: int


@dataclass(frozen=True)
class Latency(Message):
    """A latency marker reached this terminal task (runtime/latency.py): milliseconds since
    a source sent it, on the workers' clocks."""

    TAG: ClassVar[str] = "latency"
    task: str
    ms: float


@dataclass(frozen=True)
class Counts(Message):
    """Records sent on each output channel and processed from each input channel so far."""

    TAG: ClassVar[str] = "counts"
    task: str
    wave: int
    sent: dict[str, int]
    received: dict[str, int]


@dataclass(frozen=True)
class Committed(Message):
    """The task has run notify-complete for the job's final checkpoint; it exits next."""

    TAG: ClassVar[str] = "committed"
    task: str


class FailureCause(enum.Enum):
    """Why a task failed, as the driver classifies it."""

    OPERATOR = "operator"  #: user code of ``operator`` raised (on ``record``, when known)
    STUCK = "stuck"  #: ``operator`` was inside one call longer than task_timeout
    LOOP_NOT_QUIET = "loop-not-quiet"  #: records came round a loop proven drained
    UPSTREAM_LOST = "upstream-lost"  #: an input's producer (``peer``) went away: collateral damage
    DOWNSTREAM_LOST = "downstream-lost"  #: a consumer went away while this task sent to it
    RESTORE = "restore"  #: the task could not read back its checkpoint
    WRITER = "writer"  #: the snapshot writer failed (not user code)
    SETUP = "setup"  #: the worker cannot run at all (its environment)
    RUNTIME = "runtime"  #: anything else in the engine


@dataclass(frozen=True)
class Failed(Message):
    TAG: ClassVar[str] = "failed"
    task: str
    cause: FailureCause
    operator: str | None  #: the operator whose code failed or got stuck (None: not an operator's)
    traceback: str
    fatal: bool  #: retrying cannot help (e.g. state that msgpack cannot encode)
    record: str = ""  #: a truncated repr of the record the operator failed on, if known
    digest: str = ""  #: identifies that record (sha256 of its msgpack), to spot a poison record
    #: The type of the exception the user's code raised ("ValueError"), with no message: what
    #: the dashboard may show of it ("" if unknown: the driver reads it off the traceback).
    error_type: str = ""
    peer: str | None = None  #: UPSTREAM_LOST: the producer task that went away, if known

    @property
    def collateral(self) -> bool:
        """Lost a peer: the real failure is elsewhere (the driver looks for it)."""
        return self.cause in (FailureCause.UPSTREAM_LOST, FailureCause.DOWNSTREAM_LOST)


@dataclass(frozen=True)
class Skipped(Message):
    """An operator with on_error="skip" dropped a record its function raised on."""

    TAG: ClassVar[str] = "skipped"
    task: str
    operator: str
    record: str  #: truncated repr
    error: str  #: the exception, one line


_REGISTRY: dict[str, type[Message]] = {
    cls.TAG: cls
    for cls in (Deploy, Trigger, NotifyComplete, Shutdown, Hello, Running, Ack, Finished, Progress, Committed,
                Failed, InputsEnded, EndLoop, Pause, Resume, CountRequest, Snapshot, Counts, Heartbeat, Skipped,
                Latency)
}


def encode(msg: Message) -> bytes:
    fields = [_wire_value(getattr(msg, f.name)) for f in dataclasses.fields(msg)]
    return codec.frame(codec.FrameKind.CONTROL, codec.pack([msg.TAG, *fields]))


def _wire_value(v: Any) -> Any:
    return v.value if isinstance(v, enum.Enum) else v


def _wire_types(cls: type[Message]) -> list[tuple[str, tuple[type, ...]]]:
    """Per field, the Python types msgpack may decode its annotation into (a float field
    also takes an int: msgpack keeps 1.0 and 1 apart, senders need not)."""
    out = []
    for f, hint in typing.get_type_hints(cls).items():
        if f == "TAG":
            continue
        args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        allowed: list[type] = []
        for a in args:
            base = typing.get_origin(a) or a
            allowed += {float: [float, int], type(None): [type(None)]}.get(base, [base])
        out.append((f, tuple(allowed)))
    return out


#: Per message tag, the fields that travel as an enum's value: field -> the enum.
_ENUMS: dict[str, dict[str, type[enum.Enum]]] = {
    cls.TAG: {f: h for f, h in typing.get_type_hints(cls).items() if isinstance(h, type) and issubclass(h, enum.Enum)}
    for cls in _REGISTRY.values()}


_TYPES = {tag: _wire_types(cls) for tag, cls in _REGISTRY.items()}


def decode(payload: bytes) -> Message:
    """A message from its frame payload, every field of its declared type;
    ProtocolError(MALFORMED) for anything else, so a bad frame fails the connection it came
    on, never the reader."""
    try:
        doc = codec.unpack(payload)
        if not isinstance(doc, tuple) or not doc or not isinstance(doc[0], str):
            raise ValueError("not a [tag, fields...] array")
        tag, *fields = doc
        cls = _REGISTRY.get(tag)
        if cls is None:
            raise ValueError(f"unknown message tag {tag[:40]!r}")
        enums = _ENUMS[tag]
        if enums:
            names = [f.name for f in dataclasses.fields(cls)]
            fields = [enums[n](v) if n in enums else v for n, v in zip(names, fields)]
        msg = cls(*fields)
        for name, allowed in _TYPES[tag]:
            if not isinstance(getattr(msg, name), allowed):
                raise ValueError(f"field {name!r} of {tag!r} is a {type(getattr(msg, name)).__name__}")
        return msg
    except Exception as e:  # noqa: BLE001 - any decoding failure is the sender's fault
        raise ProtocolError(ProtocolErrorReason.MALFORMED, f"malformed control message: {e}") from None
