"""Typed identifiers shared by the plan, the runtime and the checkpoint layer.

All ids are plain strings or ints at run time (so they encode to msgpack as they are);
NewType only lets the type checker keep them apart.
"""

from __future__ import annotations

from typing import NewType

#: Name of a logical operator, unique within a dataflow ("source", "count", ...).
OperatorId = NewType("OperatorId", str)
#: One parallel instance of a chain of operators: "<head operator>#<index>".
TaskId = NewType("TaskId", str)
#: A FIFO channel between two tasks: "<producer task>-><consumer task>".
ChannelId = NewType("ChannelId", str)
#: Checkpoints are numbered 1, 2, 3, ... within a job; numbers are never reused.
CheckpointId = NewType("CheckpointId", int)


def task_id(head: str, index: int) -> TaskId:
    return TaskId(f"{head}#{index}")


def channel_id(producer: str, consumer: str) -> ChannelId:
    return ChannelId(f"{producer}->{consumer}")
