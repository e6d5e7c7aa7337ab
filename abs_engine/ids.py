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


def producer_of(channel: str) -> TaskId:
    """The producer task of channel "<producer>-><consumer>"."""
    return TaskId(channel.split("->", 1)[0])


def consumer_of(channel: str) -> TaskId:
    """The consumer task of channel "<producer>-><consumer>"."""
    return TaskId(channel.split("->", 1)[1])


def head_of(task: str) -> OperatorId:
    """The head operator of task "<head>#<index>"."""
    return OperatorId(task.rsplit("#", 1)[0])


def index_of(task: str) -> int:
    """The subtask index of task "<head>#<index>"."""
    return int(task.rsplit("#", 1)[1])
