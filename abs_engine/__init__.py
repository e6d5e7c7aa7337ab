"""abs-engine: a stream dataflow engine for Python with Asynchronous Barrier Snapshotting.

Build a Dataflow, then ``flow.run(...)``; see README.md and docs/.
"""

from .api import Dataflow, Feedback, KeyedStream, Stream
from .errors import (
    AbsEngineError,
    CheckpointError,
    GraphError,
    InputError,
    JobFailed,
    JobInterrupted,
    SerializationError,
)
from .executors.config import JobConfig, JobResult

__all__ = [
    "Dataflow",
    "Stream",
    "KeyedStream",
    "Feedback",
    "JobConfig",
    "JobResult",
    "AbsEngineError",
    "GraphError",
    "CheckpointError",
    "InputError",
    "JobFailed",
    "JobInterrupted",
    "SerializationError",
]
__version__ = "0.1.0"
