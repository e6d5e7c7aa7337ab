"""Job configuration (``JobConfig``: every option of ``run()``, checked at once); the
result of a run is in result.py, re-exported here."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable

from ..checkpoint import spill
from ..errors import ConfigError
from ..monitor.model import (KEEP_CHECKPOINT_STATS, KEEP_SUBTASK_DETAILS, CheckpointStat, CheckpointStatus,
                             RecoveryEvent, SubtaskStat)
from ..runtime.channel import DEFAULT_BUFFER
from .result import JobResult

MODES = ("aligned", "unaligned", "none", "stop-the-world")
EXECUTORS = ("local", "spark", "inprocess")
RESUME = (False, True, "if-present")
FAILOVER = ("pipeline", "job")
TOKEN_RE = re.compile(r"^[A-Za-z0-9_-]+$")
#: Bytes of back-edge input a task holds in memory before it spills the rest to disk.
#: heartbeat_timeout's default (seconds; four heartbeat intervals if longer).
DEFAULT_HEARTBEAT_TIMEOUT = 30.0
DEFAULT_LOOP_MEMORY = 64 << 20
#: Bytes of back-edge input a task may spill to disk before the job fails (a loop that
#: makes records faster than it consumes them would otherwise fill the disk).
DEFAULT_LOOP_DISK = 4 << 30


@dataclass(frozen=True)
class JobConfig:
    """How to run a job: ``flow.run(**options)`` builds one from its keyword arguments.

    ``executor``
        who starts the workers: "local" (the default: one OS process per task on this
        machine), "spark" (the workers run inside a Spark barrier stage on the cluster of
        ``spark``, a SparkSession, or of the embedded local session; see executors/spark.py),
        or "inprocess" (every task in the calling thread, over in-memory channels: for unit
        tests and for debugging with breakpoints, as Bytewax's ``run_main``; checkpoints,
        recovery and exactly-once output as with the others, on one core, and no
        ``task_timeout`` watchdog or chaos: see executors/inprocess.py).
    ``spark``
        the SparkSession of executor="spark" (None: the embedded local session).
    ``mode``
        "aligned" (ABS checkpoints every ``checkpoint_interval`` seconds), "unaligned"
        (Chandy-Lamport: every task snapshots at once at the coordinator's trigger or the
        first barrier, and persists the records in flight on its inputs as channel state, so
        a checkpoint does not wait for backpressured data to be processed), "stop-the-world"
        (every interval: pause the sources, wait until counts prove nothing is in flight,
        snapshot every task, resume; the baseline ABS is measured against), or "none" (no
        periodic checkpoints: a failure restarts from scratch; the final commit still happens).
    ``checkpoint_interval``
        seconds between checkpoints (their triggers; default 1.0).
    ``checkpoint_timeout``
        seconds a checkpoint may take before it expires (default 120); see
        ``tolerable_failed_checkpoints``.
    ``max_concurrent_checkpoints``
        checkpoints that may be in progress at once (default 1: the next is triggered when
        the previous one has completed or expired).
    ``retained_checkpoints``
        completed checkpoints kept in ``checkpoint_dir`` (default 3; older ones are deleted,
        except files an incremental checkpoint still uses).
    ``checkpoint_dir``
        where checkpoints go: a local directory, ``file:///shared/mount/...``, or a
        remote URI that pyarrow.fs opens (``s3://bucket/prefix``, ``gs://``, ``hdfs://host/path``;
        S3 endpoint and region may go in the query: ``?endpoint_override=host:port&scheme=http``,
        credentials in the environment). A temporary directory (deleted after success) if None.
    ``resume``
        True: continue from the newest valid checkpoint already in ``checkpoint_dir`` (a
        directory without one is an error: CheckpointError(NOT_FOUND), so a mistyped path
        never quietly starts from scratch); "if-present": continue from it if there is
        one, else start afresh (for a job script that is re-run after a crash); False (the
        default): a directory that holds checkpoints is refused (it belongs to another run).
    ``restart_attempts``, ``restart_delay``
        fixed-delay restart strategy; a job that fails more than
        ``restart_attempts`` times fails with the last error.
    ``supervise``, ``driver_restarts``
        run the driver in a process of its own under a supervisor (this process) that
        restarts it when it crashes (killed, out of memory), at most ``driver_restarts``
        times (default 3), each time from the newest checkpoint; the supervisor holds the
        checkpoint directory's lock meanwhile (executors/supervisor.py). Needs a
        ``checkpoint_dir`` and checkpoints.
    ``failover``
        what a failure restarts. ``"pipeline"`` (default): only the failed task's pipeline
        (operators connected upstream and downstream, loops included); a job of several
        pipelines runs each as a job of its own (its own coordinator, checkpoint ids,
        checkpoints in ``checkpoint_dir/pipeline-<first operator>/`` and restarts:
        executors/pipelined.py) and the others run on; inside a pipeline without a
        shuffle, only the failed task's parallel lane (executors/regions.py). ``"job"``:
        every task (global
        failover, one checkpoint for the whole job). The same for a job of one pipeline,
        and under the in-process executor (the whole job in one thread).
    ``progress``
        print a progress line to stderr about once a second.
    ``chaos``
        failure injection for tests (abs_engine.testing.KillOnCheckpoints, RandomKills).
    ``stop_when``
        called with the running JobResult about every 0.1 s; when it returns True the
        job is cancelled (workers killed) and run() returns with ``cancelled=True``. For jobs
        that never end on their own (unbounded sources, loops that never drain).
    ``task_timeout``
        a single call of operator code (a user function on a batch, a source read,
        a snapshot, a publish) that runs longer fails its task, naming the operator and showing
        its Python stack; a local worker silent for this long (stopped, or holding the GIL)
        fails too. 0 disables.
    ``heartbeat_interval``
        seconds between a worker's heartbeats; a worker whose driver is gone
        exits within about one interval.
    ``heartbeat_timeout``
        for workers that may run on other machines (the Spark executor): one the driver
        has heard nothing from for this long (its machine lost or cut off by the network,
        the process stopped) fails its attempt, as Flink's ``heartbeat.timeout`` (whose
        default is 50 s). The worker fences itself: its control connection gives up after
        half of it without the driver acknowledging anything (``TCP_USER_TIMEOUT``) and it
        exits, so a worker cut off from its driver is gone before the driver replaces it;
        a partition longer than that half fails over. None (the default): 30 s, or four
        heartbeat intervals if longer; 0 disables (task_timeout then bounds the silence).
        Local workers share the driver's machine: there task_timeout bounds the silence.
    ``tolerable_failed_checkpoints``
        consecutive checkpoints that may expire (``checkpoint_timeout``)
        before the job fails over (Flink's setting); None: never fail over for that.
    ``host``
        the address the driver's control server and the workers' data servers bind to
        (default 127.0.0.1: one machine; the Spark executor on a cluster picks reachable ones).
    ``startup_timeout``
        seconds for an attempt's workers to connect, restore and be running.
    ``tls``
        encrypt every connection between engine processes (worker -> driver control,
        worker -> worker data, Spark source -> the driver's partition server) with mutual
        TLS 1.3. The driver makes a fresh key and self-signed certificate for each attempt
        (abs_engine/tls.py; it needs the ``cryptography`` package) and hands them to the
        workers like the attempt's secret: on stdin, never on a command line, never into a
        checkpoint. The secret's handshake still runs, inside TLS. Off by default: on one
        machine, or a trusted network, it only costs time.
    ``snapshot_encoding``
        how a task encodes its snapshot. ``"fork"``: the task thread forks
        and the child encodes the copy-on-write image of the state, so the task thread's
        share does not grow with the state (as Redis's BGSAVE); ``"inline"``: the task thread
        encodes it (cheapest in CPU: a fork costs about three times as much in all);
        ``"auto"`` (default): fork for states of 100k entries or more when the machine has a
        core to spare, else inline (runtime/snapshot_encoding.py).
    ``incremental_checkpoints``
        write keyed state (count, reduce, aggregate, stateful_map, their
        final variants, KeyedProcess) incrementally: each checkpoint holds only the keys
        changed since an earlier completed one and references that one's files (shared, kept
        by retention while referenced); a full file is written after 8 deltas, after a
        restore, and for a state whose changes exceed half of it (an eighth when only keys
        are tracked) (checkpoint/incremental.py, runtime/increments.py). Checkpoint bytes then follow the changes, not
        the size of the state; a restore reads the chain.
    ``allow_non_restored_state``
        restore a checkpoint or savepoint of a *changed* dataflow (as
        Flink's flag): operators are matched by name; the state of operators the dataflow no
        longer has is dropped, added operators start empty, an operator whose kind changed
        is refused (RescaleError). Off: a changed dataflow is refused (PLAN_MISMATCH).
    ``restore_from``
        a savepoint (a directory abs-engine wrote, or its URI) to start from when
        the checkpoint directory holds no checkpoint of the job yet; at another parallelism
        it is rescaled. A corrupt or foreign savepoint is a CheckpointError, never a fresh
        start.
    ``savepoint_dir``
        where savepoints go (``<checkpoint_dir>/savepoints`` by default for a
        local checkpoint directory, else ``./savepoints``).
    ``aligned_timeout``
        with mode="aligned": a checkpoint still pending this many seconds after its trigger
        turns unaligned (Flink's aligned-checkpoint-timeout): the coordinator triggers every
        task that has not snapshotted it, unaligned; a task whose own alignment lasts this
        long switches too. None (default): never.
    ``channel_state_memory``
        bytes of channel state (records in flight logged for one checkpoint: back-edges
        round a loop, every input when unaligned) a task holds in memory; past that it spills
        them to files beside its state file in the checkpoint (checkpoint/spill.py) and
        frees them; past it too, a task stops reading its inputs ahead of processing (what
        it read ahead waits to be processed: reading on would move the backlog from the
        kernel's buffers into the task's memory, checkpoint after checkpoint). Default
        32 MiB; None: no bound.
    ``channel_buffer``
        bytes of kernel buffer per direction of each data channel (default 512 KiB; the
        kernel doubles it). The bytes in flight on a channel are what an aligned barrier
        queues behind and what an unaligned checkpoint persists: bounded, as Flink bounds
        them with its network buffers. None: the kernel's autotuning (up to tens of MB a
        channel on Linux).
    ``stop_with_savepoint_on_signal``
        while run() runs in the main thread, SIGTERM or Ctrl-C
        takes a savepoint, commits the sinks and returns (``JobResult.savepoint``,
        ``stopped_with_savepoint``); a second signal stops at once.
    ``dashboard``
        serve a live dashboard of the job on this port while it runs (0: any free port; the
        address is printed to stderr and kept in ``JobResult.dashboard_url``): the job graph,
        records per second and backpressure per task, checkpoint history and timelines,
        restarts; a JSON API under ``/api/`` and Prometheus metrics at ``/metrics``
        (monitor/dashboard.py). None (default): no server.
    ``dashboard_host``
        the address the dashboard binds to (default 127.0.0.1: this machine only).
    ``dashboard_token``
        the token every request to the dashboard must carry (a ``?token=`` link, the cookie
        that link sets, or ``Authorization: Bearer``); None (default): a random one, in the
        address printed at start (``JobResult.dashboard_url``).
    ``loop_memory``
        bytes of back-edge input (records coming round a loop) a task holds in memory;
        past that it spills them to a private temporary file and reads them back in order,
        so a loop stays deadlock-free without growing in memory (default 64 MiB; None: no
        bound).
    ``loop_disk``
        bytes of back-edge input a task may spill (default 4 GiB; None: no bound); a loop
        that needs more fails the job with a LoopOverflow error naming the loop and the
        sizes (a loop that makes records faster than it consumes them).
    ``latency_interval``
        seconds between the latency markers each source subtask sends (default 0.2; 0:
        none). A marker travels behind the records the source emitted before it, through
        every queue and operator, to one sink subtask, which reports its age: the job's
        source-to-sink latency (p50, p99, max) in ``JobResult.latency``, on the dashboard and
        in ``/metrics`` (runtime/latency.py; Flink's latency markers). It measures the
        dataflow, not how long a record waited outside before the source read it.
    ``loop_spill_dir``
        where back-edge input spills (default: the system's temporary directory; the file
        is unlinked at once and private to the worker).
    """

    mode: str = "aligned"
    executor: str = "local"
    spark: Any = None
    checkpoint_interval: float = 1.0
    checkpoint_dir: str | None = None
    checkpoint_timeout: float = 120.0
    max_concurrent_checkpoints: int = 1
    retained_checkpoints: int = 3
    restart_attempts: int = 10
    restart_delay: float = 0.2
    resume: bool | str = False
    progress: bool = False
    chaos: Any = None
    stop_when: Callable[["JobResult"], bool] | None = None
    host: str = "127.0.0.1"
    startup_timeout: float = 60.0
    task_timeout: float = 300.0
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float | None = None
    tolerable_failed_checkpoints: int | None = 3
    tls: bool = False
    snapshot_encoding: str = "auto"
    incremental_checkpoints: bool = False
    allow_non_restored_state: bool = False
    restore_from: str | None = None
    savepoint_dir: str | None = None
    stop_with_savepoint_on_signal: bool = True
    aligned_timeout: float | None = None
    channel_state_memory: int | None = spill.DEFAULT_MEMORY
    channel_buffer: int | None = DEFAULT_BUFFER
    dashboard: int | None = None
    dashboard_host: str = "127.0.0.1"
    dashboard_token: str | None = None
    loop_memory: int | None = DEFAULT_LOOP_MEMORY
    loop_disk: int | None = DEFAULT_LOOP_DISK
    loop_spill_dir: str | None = None
    latency_interval: float = 0.2
    supervise: bool = False
    driver_restarts: int = 3
    failover: str = "pipeline"

    def __post_init__(self) -> None:
        _check_config(self)

    def heartbeat_bound(self) -> float:
        """Seconds a worker that may be on another machine may send nothing before it
        counts as lost (0: no such bound): the Spark executor's workers only."""
        if self.executor != "spark" or self.heartbeat_timeout == 0:
            return 0.0
        if self.heartbeat_timeout is None:
            return max(DEFAULT_HEARTBEAT_TIMEOUT, 4 * self.heartbeat_interval)
        return float(self.heartbeat_timeout)


def _seconds(option: str, value: Any, *, zero: bool = False, none: bool = False, extra: str = "") -> None:
    """``value`` is a finite number of seconds, > 0 (>= 0 with ``zero``; or None with ``none``)."""
    if value is None and none:
        return
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or not (value >= 0 if zero else value > 0)):
        bound = ">= 0" if zero else "> 0"
        raise ConfigError(option, f"{option} must be a finite number of seconds {bound}"
                                  f"{' or None' if none else ''}, got {value!r}{extra}")


def _count(option: str, value: Any, least: int, *, none: bool = False, what: str = "an int") -> None:
    if value is None and none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(option, f"{option} must be {what} >= {least}{' or None' if none else ''}, got {value!r}")


def _check_config(c: "JobConfig") -> None:
    """Every option's type and range, at once (run() calls this before anything starts):
    a ConfigError naming the option and what it accepts."""
    if c.executor not in EXECUTORS:
        raise ConfigError("executor", f"executor must be one of {EXECUTORS}, got {c.executor!r}")
    if c.failover not in FAILOVER:
        raise ConfigError("failover", f"failover must be one of {FAILOVER}, got {c.failover!r}")
    if c.mode not in MODES:
        raise ConfigError("mode", f"mode must be one of {MODES}, got {c.mode!r}")
    if c.mode != "none":
        _seconds("checkpoint_interval", c.checkpoint_interval,
                 extra=" (to run without checkpoints, pass mode='none')" if c.checkpoint_interval is None else "")
    _seconds("checkpoint_timeout", c.checkpoint_timeout)
    _seconds("restart_delay", c.restart_delay, zero=True)
    _seconds("startup_timeout", c.startup_timeout)
    _seconds("heartbeat_interval", c.heartbeat_interval)
    _seconds("heartbeat_timeout", c.heartbeat_timeout, zero=True, none=True, extra=" (0 disables it)")
    _seconds("task_timeout", c.task_timeout, zero=True, extra=" (0 disables it)")
    _seconds("latency_interval", c.latency_interval, zero=True, extra=" (0: no latency markers)")
    _count("restart_attempts", c.restart_attempts, 0)
    _count("driver_restarts", c.driver_restarts, 0)
    if c.supervise not in (True, False):
        raise ConfigError("supervise", f"supervise must be a bool, got {c.supervise!r}")
    if c.supervise and (c.checkpoint_dir is None or c.mode == "none"):
        raise ConfigError("supervise", "supervise=True restarts a crashed driver from the job's latest checkpoint: "
                                       "give it a checkpoint_dir, and checkpoints (a mode other than 'none')")
    _count("max_concurrent_checkpoints", c.max_concurrent_checkpoints, 1)
    _count("retained_checkpoints", c.retained_checkpoints, 1)
    _count("tolerable_failed_checkpoints", c.tolerable_failed_checkpoints, 0, none=True)
    if c.resume not in RESUME:
        raise ConfigError("resume", f"resume must be True, False or 'if-present', got {c.resume!r}")
    if c.aligned_timeout is not None:
        if c.mode != "aligned":
            raise ConfigError("aligned_timeout", f"aligned_timeout applies to mode='aligned' (got mode={c.mode!r}): "
                                                 "it turns an aligned checkpoint unaligned when its alignment takes "
                                                 "longer")
        _seconds("aligned_timeout", c.aligned_timeout, zero=True)
    _count("channel_state_memory", c.channel_state_memory, 0, none=True, what="a number of bytes")
    if c.channel_buffer is not None and (isinstance(c.channel_buffer, bool) or not isinstance(c.channel_buffer, int)
                                         or c.channel_buffer < 4096):
        raise ConfigError("channel_buffer", f"channel_buffer must be a number of bytes >= 4096 or None (the "
                                            f"kernel's), got {c.channel_buffer!r}")
    _count("loop_memory", c.loop_memory, 1 << 20, none=True, what="a number of bytes")
    _count("loop_disk", c.loop_disk, 0, none=True, what="a number of bytes")
    if c.mode == "unaligned" and c.max_concurrent_checkpoints != 1:
        raise ConfigError("max_concurrent_checkpoints", "mode='unaligned' takes one checkpoint at a time "
                                                        "(max_concurrent_checkpoints=1), as Flink does: each one "
                                                        "persists the data in flight")
    if c.dashboard is not None and (isinstance(c.dashboard, bool) or not isinstance(c.dashboard, int)
                                    or not 0 <= c.dashboard <= 65535):
        raise ConfigError("dashboard", f"dashboard must be a TCP port (0-65535; 0: any free one) or None, got "
                                       f"{c.dashboard!r}")
    if c.dashboard_token is not None and (not isinstance(c.dashboard_token, str) or len(c.dashboard_token) < 16
                                          or not TOKEN_RE.match(c.dashboard_token)):
        raise ConfigError("dashboard_token", "dashboard_token must be at least 16 URL-safe characters "
                                             "(letters, digits, '-', '_'), or None for a random one")
    if c.task_timeout and c.task_timeout < 2 * c.heartbeat_interval:
        raise ConfigError("task_timeout", f"task_timeout ({c.task_timeout}s) must be at least twice "
                                          f"heartbeat_interval ({c.heartbeat_interval}s), or 0 to disable it")
    if c.heartbeat_timeout and c.heartbeat_timeout < 4 * c.heartbeat_interval:
        raise ConfigError("heartbeat_timeout", f"heartbeat_timeout ({c.heartbeat_timeout}s) must be at least four "
                                               f"times heartbeat_interval ({c.heartbeat_interval}s): the worker "
                                               "gives up after half of it, which must span heartbeats; or 0 to "
                                               "disable it")
    if c.snapshot_encoding not in ("auto", "fork", "inline"):
        raise ConfigError("snapshot_encoding", f"snapshot_encoding must be 'auto', 'fork' or 'inline', got "
                                               f"{c.snapshot_encoding!r}")
    for flag in ("tls", "progress", "incremental_checkpoints", "allow_non_restored_state",
                 "stop_with_savepoint_on_signal"):
        if not isinstance(getattr(c, flag), bool):
            raise ConfigError(flag, f"{flag} must be True or False, got {getattr(c, flag)!r}")
    for where in ("checkpoint_dir", "restore_from", "savepoint_dir", "loop_spill_dir"):
        value = getattr(c, where)
        if value is not None and (not isinstance(value, str) or not value or "\x00" in value):
            raise ConfigError(where, f"{where} must be a non-empty path or URI (str) without NUL, or None, got "
                                     f"{value!r}")
    if c.tls:
        try:
            import cryptography  # noqa: F401 - the driver makes each attempt's certificate with it
        except ImportError:
            raise ConfigError("tls", "tls=True needs the 'cryptography' package on the driver "
                                     "(pip install 'cryptography>=41')") from None




__all__ = ["JobConfig", "JobResult", "CheckpointStat", "CheckpointStatus", "SubtaskStat", "RecoveryEvent",
           "KEEP_CHECKPOINT_STATS",
           "KEEP_SUBTASK_DETAILS"]
