"""What the example jobs share: their job flags and how they run and report a job."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from abs_engine import AbsEngineError, Dataflow, JobResult
from abs_engine.checkpoint import spill
from abs_engine.executors.config import EXECUTORS, MODES


def add_job_flags(ap: argparse.ArgumentParser, interval: float) -> None:
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--checkpoint-interval", type=float, default=interval, help="seconds between checkpoints")
    ap.add_argument("--checkpoint-dir", help="where checkpoints go (default: a temporary directory)")
    ap.add_argument("--mode", choices=list(MODES), default="aligned",
                    help="aligned (ABS), unaligned (Chandy-Lamport: in-flight records persisted), "
                         "stop-the-world, or none")
    ap.add_argument("--aligned-timeout", type=float, metavar="S",
                    help="with --mode aligned: a checkpoint still pending S seconds after its trigger turns "
                         "unaligned")
    ap.add_argument("--channel-state-memory", type=int, metavar="BYTES", default=spill.DEFAULT_MEMORY,
                    help="bytes of in-flight records a task holds in memory: a checkpoint's log past it spills to "
                         "files in the checkpoint, and reading inputs ahead stops at it (default %(default)s)")
    ap.add_argument("--executor", choices=list(EXECUTORS), default="local",
                    help="who runs the tasks: local processes (default), a Spark barrier stage, or this thread "
                         "(inprocess: for debugging)")
    ap.add_argument("--spark-master", help="Spark master URL for --executor spark and Spark sources "
                                           "(default: the embedded local session)")
    ap.add_argument("--tls", action="store_true",
                    help="encrypt every connection between engine processes (mutual TLS, a per-job certificate)")
    ap.add_argument("--incremental", action="store_true",
                    help="incremental checkpoints: write only the keys changed since an earlier checkpoint")
    ap.add_argument("--allow-non-restored-state", action="store_true",
                    help="resume a checkpoint or savepoint of a changed dataflow: operators matched by name, "
                         "state of removed ones dropped, added ones starting empty")
    ap.add_argument("--restore-from", help="a savepoint to start from (at any parallelism); Ctrl-C or SIGTERM "
                                           "takes one and stops the job")
    ap.add_argument("--dashboard", type=int, metavar="PORT",
                    help="serve a live dashboard (job graph, throughput, backpressure, checkpoints, restarts), its "
                         "JSON API and Prometheus /metrics on PORT while the job runs (0: any free port)")
    ap.add_argument("--dashboard-host", default="127.0.0.1",
                    help="address the dashboard binds to (default %(default)s; every request needs the job's token, "
                         "which the address printed at start carries)")


def executor_options(args: argparse.Namespace) -> dict[str, Any]:
    """flow.run() options for --executor / --spark-master / --tls / --restore-from / --incremental /
    --allow-non-restored-state / --aligned-timeout / --channel-state-memory / --dashboard."""
    opts: dict[str, Any] = {"executor": args.executor, "tls": args.tls, "restore_from": args.restore_from,
                            "incremental_checkpoints": args.incremental,
                            "allow_non_restored_state": args.allow_non_restored_state,
                            "aligned_timeout": args.aligned_timeout,
                            "channel_state_memory": args.channel_state_memory,
                            "dashboard": args.dashboard, "dashboard_host": args.dashboard_host}
    if args.spark_master:
        import atexit

        from abs_engine.spark_session import session_for, stop_embedded

        opts["spark"] = session_for(args.spark_master)
        atexit.register(stop_embedded)  # a clean stop: a cluster otherwise logs the app as FAILED
    return opts


def run_job(name: str, flow: Dataflow, args: argparse.Namespace, **extra: Any) -> JobResult | None:
    """Run with the job flags and a progress line; None (after saying why) if it failed."""
    print(flow.explain(), file=sys.stderr)
    try:
        res = flow.run(mode=args.mode, checkpoint_interval=args.checkpoint_interval,
                       checkpoint_dir=args.checkpoint_dir, progress=True, **executor_options(args), **extra)
    except (AbsEngineError, ValueError) as e:
        print(f"{name}: FAILED: {e}", file=sys.stderr)
        return None
    if res.stopped_with_savepoint:
        print(f"{name}: stopped with savepoint {res.savepoint} (its sinks committed); continue with "
              f"--restore-from {res.savepoint} and an empty --checkpoint-dir, at any --parallelism")
        sys.exit(0)
    return res


def verdict(name: str, exact: bool, what: str = "a plain batch computation") -> int:
    print(f"{name}: output equals {what}: {'YES' if exact else 'NO'}")
    return 0 if exact else 1


def read_int_pairs(path: str, what: str) -> dict[int, int]:
    """An output of ``key<TAB>value`` integer lines; a key seen twice is a duplicate (an error)."""
    out: dict[int, int] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            a, b = line.split("\t")
            if int(a) in out:
                raise ValueError(f"{what} {a} appears twice in the output")
            out[int(a)] = int(b)
    return out
