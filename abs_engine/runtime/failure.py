"""What a task's failure tells the driver: an exception raised while a task ran, as the
Failed message the driver classifies (operator, user traceback, fatal, the record and its
digest for the poison-record rule). One conversion for every executor: a worker process
sends it before it exits, the in-process executor hands it to the driver directly.
"""

from __future__ import annotations

import hashlib
import traceback
from typing import Any

from operators.base import RecordError

from .. import codec, messages
from ..messages import FailureCause as C
from ..errors import CheckpointError, FencedOut, LoopOverflow
from .chain import record_repr
from .channel import ChannelClosed
from .control import DriverGone
from .output import OperatorFailure
from .task import LoopNotQuiet


def type_name(e: BaseException) -> str:
    """``ValueError``, or ``module.Class`` for an exception not built in."""
    t = type(e)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def record_digest(record: Any) -> str:
    """Identifies a record (sha256 of its msgpack, or of its repr if it has none)."""
    try:
        blob = codec.pack(record)
    except Exception:  # noqa: BLE001 - not encodable: identify it by its repr
        blob = repr(record).encode("utf-8", "replace")
    return hashlib.sha256(blob).hexdigest()[:32]


def _trace(e: BaseException) -> str:
    return "".join(traceback.format_exception(e))


def failed_message(task: str, e: BaseException) -> messages.Failed | None:
    """The Failed message for ``e``, raised while task ``task`` ran; None when there is no
    one to tell (the driver is gone) or nothing to say (a newer attempt fenced this one out)."""
    if isinstance(e, (DriverGone, FencedOut)):
        return None
    if isinstance(e, OperatorFailure):
        cause = e.__cause__ or e
        fatal = e.fatal or bool(getattr(cause, "fatal", False))  # e.g. a source that changed under us
        record, digest = (record_repr(e.record), record_digest(e.record)) if e.has_record else ("", "")
        if isinstance(cause, OSError):
            digest = ""  # I/O, connection and timeout errors may pass on a retry: never a poison record
        return messages.Failed(task, C.OPERATOR, e.operator, _trace(cause), fatal, record, digest,
                               type_name(cause.__cause__ if isinstance(cause, RecordError) and cause.__cause__
                                         else cause))
    if isinstance(e, LoopNotQuiet):
        return messages.Failed(task, C.LOOP_NOT_QUIET, None, _trace(e), True, error_type=type_name(e))
    if isinstance(e, LoopOverflow):
        # Fatal: the same loop replayed from a checkpoint overflows the same way. Reported
        # with the operator the loop feeds; the driver fails the job with this message.
        return messages.Failed(task, C.OPERATOR, e.operator, _trace(e), True, error_type=type_name(e))
    if isinstance(e, ChannelClosed):
        # Collateral damage: the driver attributes the failure to the producer that died.
        return messages.Failed(task, C.UPSTREAM_LOST, None, str(e), False, peer=e.producer)
    if isinstance(e, (BrokenPipeError, ConnectionResetError)):
        return messages.Failed(task, C.DOWNSTREAM_LOST, None, str(e), False)
    if isinstance(e, CheckpointError):
        return messages.Failed(task, C.RESTORE, None, _trace(e), False, error_type=type_name(e))
    return messages.Failed(task, C.RUNTIME, None, _trace(e), False, error_type=type_name(e))
