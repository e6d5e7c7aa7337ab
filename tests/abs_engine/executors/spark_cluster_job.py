"""Word count on a Spark ``local-cluster`` (separate executor JVMs) with the Spark executor,
under kills; run as its own driver process (one SparkContext per process):

    python -m tests.abs_engine.executors.spark_cluster_job CORPUS DIR KILL[,KILL...]

KILL is "workers" (SIGKILL engine workers inside the executors right after checkpoints 2
and 5) or "executor" (SIGKILL a whole executor JVM after checkpoint 2). One job per KILL,
in order, on the same cluster (its start-up is paid once), each writing DIR/KILL.tsv with
checkpoints in DIR/KILL-ck. Prints one JSON line: per KILL, kills, restarts,
restored_from, killed_after, seconds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from abs_engine import Dataflow
from abs_engine.spark_session import session_for
from abs_engine.testing import KillOnCheckpoints
from operators import FileSink, TextFileSource

MASTER = "local-cluster[2,1,1024]"


class KillExecutor(KillOnCheckpoints):
    """SIGKILL one of this driver's executor JVMs (not an engine worker) right after the
    given checkpoint completions."""

    def __init__(self, after: int, jvm_pid: int):
        super().__init__([after], seed=1)
        self.jvm_pid = jvm_pid

    def kill(self, pids: dict[str, int]) -> str | None:
        # Spark's Worker runs inside the driver JVM here; executors are its children.
        out = subprocess.run(["pgrep", "-P", str(self.jvm_pid), "-f", "CoarseGrainedExecutorBackend"],
                             capture_output=True, text=True).stdout.split()
        if not out:
            return None
        victim = int(self.rng.choice(sorted(out)))
        os.kill(victim, signal.SIGKILL)
        return f"executor {victim}"


def run(spark: Any, corpus: str, out: str, ckdir: str, kill: str) -> dict[str, Any]:
    chaos: Any
    if kill == "executor":
        chaos = KillExecutor(2, spark.sparkContext._gateway.proc.pid)
    else:
        chaos = KillOnCheckpoints([2, 5], seed=5)
    flow = Dataflow("wordcount", parallelism=2)
    flow.source(TextFileSource(corpus, batch_bytes=1 << 15)).flat_map(str.split).key_by().count_final() \
        .sink(FileSink(out), parallelism=1)
    t0 = time.monotonic()
    res = flow.run(executor="spark", spark=spark, checkpoint_interval=0.05, checkpoint_dir=ckdir, chaos=chaos,
                   restart_delay=0)
    return {"kills": res.kills, "restarts": res.restarts, "restored_from": res.restored_from,
            "killed_after": chaos.killed_after, "seconds": time.monotonic() - t0,
            "finals": [c.checkpoint_id for c in res.checkpoints if c.final]}


def main(corpus: str, where: str, kills: str) -> dict[str, dict[str, Any]]:
    spark = session_for(MASTER)
    return {kill: run(spark, corpus, os.path.join(where, f"{kill}.tsv"), os.path.join(where, f"{kill}-ck"), kill)
            for kill in kills.split(",")}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:4])), flush=True)
    os._exit(0)  # do not wait for the cluster's shutdown hooks
