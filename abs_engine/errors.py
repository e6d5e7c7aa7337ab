"""Typed errors. Each names the problem and the fix; a reason enum makes them testable.

Expected protocol outcomes (a duplicate acknowledgement, a late barrier) are *values*
(see `checkpoint.pending.AckOutcome`, `runtime.alignment`); only real failures raise.
"""

from __future__ import annotations

import enum


class AbsEngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class GraphErrorReason(enum.Enum):
    """Which rule of a valid dataflow a GraphError is about."""

    NO_SOURCES = "no_sources"
    UNREACHABLE = "unreachable"
    CYCLE_WITHOUT_SOURCE = "cycle_without_source"
    SINK_WITH_OUTPUTS = "sink_with_outputs"
    SOURCE_WITH_INPUTS = "source_with_inputs"
    FORWARD_PARALLELISM = "forward_parallelism"
    BAD_PARALLELISM = "bad_parallelism"
    DUPLICATE_NAME = "duplicate_name"
    NO_SINK = "no_sink"
    FOREIGN_STREAM = "foreign_stream"
    BAD_ARGUMENT = "bad_argument"
    BAD_NAME = "bad_name"  #: a dataflow or operator name outside the safe character set (names.py)
    SHARED_OUTPUT = "shared_output"  #: two sinks write the same file, directory or URI (outputs.py)
    UNSHIPPABLE = "unshippable"  #: a user function or operator cannot be sent to the workers (codeship.py)


class GraphError(AbsEngineError):
    """The dataflow graph is not valid; the message names the operator and the fix.
    ``reason`` (a GraphErrorReason) says which rule, ``message`` what is wrong and how to
    fix it, ``operator`` the operator it is about (None: the whole dataflow)."""

    def __init__(self, reason: GraphErrorReason, message: str, operator: str | None = None):
        super().__init__(message)
        self.reason = reason
        self.operator = operator


class CheckpointErrorReason(enum.Enum):
    """Why a stored checkpoint (or its directory) cannot be used."""

    MISSING_METADATA = "missing_metadata"
    CORRUPT_METADATA = "corrupt_metadata"
    MISSING_FILE = "missing_file"
    CHECKSUM_MISMATCH = "checksum_mismatch"
    CORRUPT_STATE = "corrupt_state"
    PLAN_MISMATCH = "plan_mismatch"
    NOT_FOUND = "not_found"
    DIRECTORY_NOT_EMPTY = "directory_not_empty"
    LOCKED = "locked"  #: another job (or another --resume) holds the checkpoint directory
    FOREIGN_JOB = "foreign_job"  #: the checkpoint belongs to another job (job id differs)
    UNSAFE_PATH = "unsafe_path"  #: a name or file that escapes or is not a plain regular file
    TOO_LARGE = "too_large"  #: a file larger than its recorded (or the maximum) size
    UNREACHABLE = "unreachable"  #: the storage (an object store, HDFS) cannot be reached or refused
    #: the checkpoint directory cannot be used: a file, /, a home directory, read-only, another
    #: user's, writable by others, or holding files abs-engine did not write (checkpoint/directory.py)
    BAD_DIRECTORY = "bad_directory"


class CheckpointError(AbsEngineError):
    """A stored checkpoint cannot be used (corrupt, missing, or for another plan).
    ``reason`` is a CheckpointErrorReason, ``message`` says what and how to proceed,
    ``checkpoint_id`` the checkpoint (None: not one checkpoint's problem)."""

    def __init__(self, reason: CheckpointErrorReason, message: str, checkpoint_id: int | None = None):
        super().__init__(message)
        self.reason = reason
        self.checkpoint_id = checkpoint_id


class JobInterrupted(AbsEngineError):
    """The job was stopped at once (a second SIGTERM or Ctrl-C, or one with
    ``stop_with_savepoint_on_signal=False``): no savepoint, every worker stopped. The
    ``message`` says how to resume (``checkpoint_dir``: where its checkpoints are, or None
    if they were in a temporary directory, now removed)."""

    def __init__(self, message: str, checkpoint_dir: str | None):
        super().__init__(message)
        self.checkpoint_dir = checkpoint_dir


class SerializationError(AbsEngineError):
    """A record or a piece of state cannot be encoded with msgpack: ``what`` it was (e.g.
    "a record"), of operator ``operator``, and ``detail`` (msgpack's reason); the message
    says which types can be."""

    def __init__(self, what: str, operator: str, detail: str):
        super().__init__(
            f"{what} of operator {operator!r} cannot be serialised with msgpack: {detail}. "
            "Records and state must be built from None, bool, int, float, str, bytes, "
            "lists/tuples and dicts; convert other objects (e.g. to a dict or a tuple) first."
        )
        self.what = what
        self.operator = operator


class ConfigError(AbsEngineError, ValueError):
    """A ``run()`` option (JobConfig) has a value the engine cannot work with; ``option``
    names it and ``message`` says what is accepted. A ValueError too, so that code written
    against the plain ValueError the options raised before still catches it."""

    def __init__(self, option: str, message: str):
        super().__init__(message)
        self.option = option


class InputError(AbsEngineError):
    """An input the job needs does not exist or cannot be read."""


class JobFailed(AbsEngineError):
    """The job failed and the restart strategy gave up: ``message`` says why, ``operator``
    names the operator that failed (None: not one operator's failure) and
    ``user_traceback`` is the traceback of the user's code in the worker, appended to the
    message."""

    def __init__(self, message: str, operator: str | None = None, user_traceback: str | None = None):
        full = message
        if user_traceback:
            full += "\n\n--- traceback from the worker ---\n" + user_traceback.rstrip()
        super().__init__(full)
        self.operator = operator
        self.user_traceback = user_traceback


class ProtocolErrorReason(enum.Enum):
    """How a connection broke the wire protocol."""

    AUTH_FAILED = "auth_failed"  #: the peer does not know the job's secret
    HANDSHAKE_TIMEOUT = "handshake_timeout"  #: the handshake did not finish in time
    FRAME_TOO_LARGE = "frame_too_large"  #: a frame header announced more than the maximum
    MALFORMED = "malformed"  #: a frame that does not decode into a known message
    CLOSED = "closed"  #: the peer closed the connection during the handshake


class ProtocolError(AbsEngineError):
    """A connection broke the wire protocol (unauthenticated, oversized or malformed):
    ``reason`` is a ProtocolErrorReason, ``message`` names the peer and the problem."""

    def __init__(self, reason: ProtocolErrorReason, message: str):
        super().__init__(message)
        self.reason = reason


class FencedOut(AbsEngineError):
    """This process belongs to an attempt that a newer one has replaced: it must not
    change output or checkpoints any more."""


class RescaleErrorReason(enum.Enum):
    """Why a checkpoint's state cannot be restored at another parallelism."""

    STATEFUL_OPERATOR = "stateful_operator"  #: its state has no rule to split or merge it
    FINISHED = "finished"  #: the checkpoint was taken after the operator had finished
    #: Records in flight that cannot be re-routed. Not raised any more (channel state is
    #: re-routed by key group); kept so that code naming it still imports.
    IN_FLIGHT = "in_flight"
    OLD_FORMAT = "old_format"  #: the state was written before it could be rescaled
    REMOVED_OPERATOR = "removed_operator"  #: the checkpoint holds state of an operator the job lacks
    MAX_PARALLELISM = "max_parallelism"  #: more subtasks than key groups, or another key-group count
    CHANGED_OPERATOR = "changed_operator"  #: an operator of the same name is of another kind now


class RescaleError(AbsEngineError):
    """A checkpoint cannot be restored at the job's new parallelism: ``reason`` is a
    RescaleErrorReason, ``message`` names the operator and the fix, ``operator`` is its
    name (None: the whole job, e.g. another ``max_parallelism``)."""

    fatal = True  #: retrying cannot help: the checkpoint and the dataflow stay what they are

    def __init__(self, reason: RescaleErrorReason, message: str, operator: str | None = None):
        super().__init__(message)
        self.reason = reason
        self.operator = operator


class KeyTypeError(AbsEngineError, TypeError):
    """A key_by key whose type cannot be placed in a key group (keygroups.py)."""

    fatal = True  #: the same key fails the same way on every retry


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


class LoopOverflow(AbsEngineError):
    """A loop holds more records in flight than ``loop_memory`` plus ``loop_disk`` allow:
    its operators emit records into it faster than it consumes them (runtime/overflow.py).
    The message names the back-edge channels, the operator they feed, the sizes and the fix:
    ``task`` and ``operator`` that the loop feeds, its back-edge ``channels``, the bytes
    ``in_memory`` and ``on_disk``, and the limits ``memory_limit`` and ``disk_limit``."""

    fatal = True  #: a replay of the same loop overflows the same way

    def __init__(self, task: str, operator: str, channels: tuple[str, ...], in_memory: int, on_disk: int,
                 memory_limit: int, disk_limit: int):
        inputs = f"inputs {', '.join(channels)} hold" if len(channels) > 1 else f"input {channels[0]} holds"
        super().__init__(
            f"the loop into operator {operator!r} (task {task}) has more records in flight than it may hold: its "
            f"back-edge {inputs} {_mib(in_memory)} in memory (loop_memory={_mib(memory_limit)}) and "
            f"{_mib(on_disk)} spilled to disk (loop_disk={_mib(disk_limit)}). The loop makes records faster "
            "than it consumes them (a record that goes round produces more than one): make it consume faster "
            "than it produces (emit fewer records per trip, or let records leave the loop), or raise loop_disk "
            "(or loop_memory) if its backlog is bounded and only larger than that"
        )
        self.task = task
        self.operator = operator
        self.channels = channels
        self.in_memory = in_memory
        self.on_disk = on_disk
        self.memory_limit = memory_limit
        self.disk_limit = disk_limit
