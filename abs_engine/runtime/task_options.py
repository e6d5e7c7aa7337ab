"""How a task checkpoints and bounds its memory: the job's options, as its Deploy carries them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TaskOptions:
    """How a task checkpoints and bounds its memory (the job's options, from Deploy)."""

    #: How snapshots are encoded: "auto", "fork" or "inline" (runtime/snapshot_encoding.py).
    snapshot_encoding: str = "inline"
    incremental: bool = False
    #: Seconds an aligned checkpoint may spend aligning before it turns unaligned (None: never).
    aligned_timeout: float | None = None
    unaligned: bool = False
    channel_state_memory: int | None = None
    #: Back-edge input past ``loop_memory`` spills to disk, up to ``loop_disk`` (None:
    #: memory without bound, as a loop of bounded channels needs; runtime/overflow.py).
    loop_memory: int | None = None
    loop_disk: int | None = None
    loop_spill_dir: str | None = None
    #: State files are named <task>.<tag>.state: a stale attempt's writer can never create
    #: or clobber a file this attempt's metadata references.
    file_tag: str = ""
    #: Seconds between the latency markers a source task sends (runtime/latency.py; 0: none).
    latency_interval: float = 0.0
