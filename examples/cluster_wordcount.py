"""Word count on a multi-host Spark cluster, under a fault, checked against a batch count.

    python3 examples/netns_cluster.py demo                          # runs this with --fault host
    python3 examples/netns_cluster.py run -- python3 examples/cluster_wordcount.py --fault partition

Runs on the cluster ``examples/netns_cluster.py`` makes (it reads ``SPARK_MASTER_URL``,
``CHECKPOINT_URI`` and ``ABS_CLUSTER`` from the environment): the Spark executor, checkpoints
and the Parquet output on the S3 store, no shared disk. Words come from a deterministic
generator (``RangeSource``: word i is a function of i), are counted per word (a shuffle)
and every 100th count of each word goes to the output, so the output proves exactly-once
at every commit, not only at the end: it must equal, row for row, what a plain batch count
gives. ``--fault`` takes several, comma-separated: one job each, in order, in one Spark
application (a partitioned host heals while a following ``netem`` or ``none`` job runs; a
``host`` or ``partition`` job waits for it). The sources hold half-way (a gate object on
the store, ``abs_engine.testing.GatedSource``) until the job's ``--after``-th checkpoint;
right after it comes the fault, and then the gate opens. So the fault always hits a job
with work left, however fast it runs:

* ``host``: every process of a worker host running one of the job's tasks is SIGKILLed
  (Spark's worker daemon, its executor, the engine's workers): a lost machine;
* ``partition``: that host's link goes down for ``--partition-seconds`` and comes back;
* ``netem``: from the start, every worker host's link delays and drops packets
  (``--netem``), and the fault is a SIGKILL of one engine worker on top;
* ``none``.

Prints one JSON line, a list with a report per job (restarts, restored_from, the fault and
the checkpoint it followed, seconds until the failure was seen and until the job ran again,
``exact``, and for a partition when the cut-off workers exited and what changed on the store
after the heal), and exits 0 only when every output is exact, restored from the checkpoint
the fault followed, and no old worker wrote anything.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import sys
import threading
import time
from typing import Any

from abs_engine import Dataflow, fs
from abs_engine.testing import GatedSource
from operators import RangeSource
from operators.parquet import ParquetSink

try:
    from .netns_cluster import NetnsCluster
except ImportError:  # run as a script
    from netns_cluster import NetnsCluster  # type: ignore[no-redef,import-not-found]

VOCABULARY = 997
EVERY = 100


def word(i: int) -> str:
    """Word ``i`` of the stream (skewed: small words are frequent)."""
    return f"w{(i * 7919) % VOCABULARY % (1 + i % 37)}"


def every_hundredth(kv: tuple[str, int]) -> bool:
    return kv[1] % EVERY == 0


def oracle(words: int) -> collections.Counter[tuple[str, int]]:
    """The exact output: (word, n) for every multiple n of 100 up to the word's count."""
    counts = collections.Counter(word(i) for i in range(words))
    return collections.Counter((w, n) for w, c in counts.items() for n in range(EVERY, c + 1, EVERY))


def build_flow(words: int, output: str, parallelism: int, gate: str) -> Dataflow:
    """``gate``: the URI of the object whose existence lets the sources read their second half."""
    flow = Dataflow("cluster-wordcount", parallelism=parallelism)
    ids = GatedSource(RangeSource(words, batch_size=2000), gate, after=words // (2 * parallelism))
    counts = flow.source(ids, name="ids").map(word, name="word").key_by().count(name="count")
    counts.filter(every_hundredth, name="hundredths").sink(ParquetSink(output, columns=["word", "count"]),
                                                        name="write")
    return flow


def engine_workers(cluster: NetnsCluster, host: str) -> list[int]:
    """The engine worker processes on ``host`` now."""
    out = []
    for pid in cluster.pids(host):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"abs_engine.runtime.worker" in f.read():
                    out.append(pid)
        except OSError:
            pass
    return out


class ClusterFault:
    """The ``chaos`` hook: the fault, right after the ``after``-th checkpoint completion,
    then the sources' gate (``gate``, a URI) opened."""

    def __init__(self, cluster: NetnsCluster, fault: str, after: int, partition_seconds: float, gate: str):
        self.cluster, self.fault, self.after, self.seconds = cluster, fault, after, partition_seconds
        self.gate = gate
        self.seen = 0
        self.host: str | None = None  #: the host the fault hit
        self.checkpoint: int | None = None  #: the checkpoint it followed
        self.at: float | None = None  #: when (wall time: recoveries are stamped so)
        self.healed = threading.Event()
        #: Seconds from the partition until the cut-off host had no engine worker left.
        self.workers_gone_after: float | None = None

    def poll(self, elapsed: float, pids: dict[str, int]) -> None:
        return None

    def on_checkpoint(self, checkpoint_id: int, pids: dict[str, int]) -> str | None:
        self.seen += 1
        if self.seen != self.after:
            return None
        try:
            return self._strike(checkpoint_id, pids)
        finally:
            self._open_gate()  # the rest of the input: the job has had work left till now

    def _open_gate(self) -> None:
        """Put the gate object; a store that fails a put is asked again (bounded): a gate
        never opened would hold the job for ever."""
        head, name = fs.split(self.gate)
        for attempt in range(10):
            try:
                fs.Store(head).put((name,), b"open")
                return
            except fs.StoreError as e:
                print(f"opening the gate failed ({e}); again", file=sys.stderr, flush=True)
                time.sleep(0.5 * (attempt + 1))  # backing off a store that failed
        raise RuntimeError(f"could not open the gate {fs.redact(self.gate)}: the job would hold for ever")

    def _strike(self, checkpoint_id: int, pids: dict[str, int]) -> str | None:
        if self.fault == "none":
            return None
        hosts = sorted({h for pid in pids.values() if (h := self.cluster.host_of(pid)) and h.startswith("worker")})
        if not hosts:
            return None
        self.host, self.at, self.checkpoint = hosts[0], time.time(), checkpoint_id
        if self.fault == "host":
            self.cluster.kill_host(self.host)
            return f"every process of host {self.host}"
        if self.fault == "partition":
            self.cluster.partition(self.host)

            def heal() -> None:
                assert self.host is not None
                try:
                    self.cluster.heal(self.host)
                finally:
                    self.healed.set()  # (a heal that failed is reported by what follows, never waited for)

            threading.Timer(self.seconds, heal).start()
            threading.Thread(target=self._watch, args=(self.host, time.monotonic()), daemon=True).start()
            return f"the link of host {self.host} (down for {self.seconds:g} s)"
        victim = sorted(pids)[0]  # netem: a worker killed while the links delay and drop
        os.kill(pids[victim], signal.SIGKILL)
        return victim


    def _watch(self, host: str, since: float) -> None:
        """When do the cut-off host's workers exit (they cannot hear from their driver)?"""
        while not self.healed.is_set():
            if not engine_workers(self.cluster, host):
                self.workers_gone_after = round(time.monotonic() - since, 2)
                return
            time.sleep(0.1)  # sampling another host's processes: the resolution of the measurement


def listing(uri: str) -> dict[str, tuple[int, float]]:
    """Every object under ``uri`` (a directory on the store): path -> (size, mtime)."""
    from abs_engine import fs

    store: Any = fs.Store(uri)
    infos = store.fs.get_file_info(fs_selector(store.path()))
    return {i.path: (i.size, i.mtime.timestamp() if i.mtime else 0.0) for i in infos if i.type.name == "File"}


def fs_selector(path: str) -> Any:
    from pyarrow import fs as pafs

    return pafs.FileSelector(path, recursive=True, allow_not_found=True)


def read_output(uri: str) -> collections.Counter[tuple[str, int]]:
    import pyarrow.dataset as ds

    from abs_engine import fs

    store: Any = fs.Store(uri)
    table = ds.dataset(store.path(), filesystem=store.fs, format="parquet").to_table()
    return collections.Counter(zip(table.column("word").to_pylist(), table.column("count").to_pylist()))


def run_one(cluster: NetnsCluster, spark: Any, fault_name: str, name: str, args: argparse.Namespace) -> \
        tuple[dict[str, Any], "ClusterFault"]:
    """One job under one fault, under ``name`` on the store; its report (a partition's heal
    is checked by ``after_heal``)."""
    output, checkpoints = cluster.s3_uri(f"{name}/output"), cluster.s3_uri(f"{name}/checkpoints")
    degraded = ""
    if fault_name == "netem":
        for w in cluster.workers:
            degraded = cluster.degrade(w.name, args.delay_ms, args.loss)
    gate = cluster.s3_uri(f"{name}/gate")
    head, gate_name = fs.split(gate)
    fs.Store(head).delete_file(gate_name)  # one left by an earlier run of this name would not hold the sources
    fault = ClusterFault(cluster, fault_name, args.after, args.partition_seconds, gate)
    t0 = time.monotonic()
    try:
        res = build_flow(args.words, output, args.parallelism, gate).run(
            executor="spark", spark=spark, checkpoint_dir=checkpoints, checkpoint_interval=0.5, chaos=fault,
            restart_delay=0, heartbeat_timeout=args.heartbeat_timeout, progress=args.progress)
    finally:
        if degraded:
            for w in cluster.workers:
                cluster.restore_link(w.name)
    report: dict[str, Any] = {"fault": fault_name, "host": fault.host, "restarts": res.restarts,
                              "restored_from": res.restored_from, "seconds": round(time.monotonic() - t0, 2),
                              "kills": res.kills, "fault_after_checkpoint": fault.checkpoint,
                              **({"links": degraded} if degraded else {})}
    if fault.at is not None and res.recoveries:
        # The first failover after the fault: when the engine saw it; and when the job ran
        # again, which may take more than one failover (a restarted attempt may meet another
        # worker of the cut-off host before that one is known lost): every one is listed.
        ev = res.recoveries[0]
        report["failure_seen_after_s"] = round(ev.time - fault.at, 2)
        report["failure"] = f"{ev.failed_task}: {ev.reason}"[:400]
        report["recoveries"] = [f"{r.time - fault.at:.2f} s: {r.failed_task}: {r.reason}"[:300]
                                + ("" if r.running_after_s is None else f" (running after {r.running_after_s:.2f} s)")
                                for r in res.recoveries]
        ran = [r.time - fault.at + r.running_after_s for r in res.recoveries if r.running_after_s is not None]
        if ran:
            report["running_again_after_s"] = round(ran[0], 2)
    got, want = read_output(output), oracle(args.words)
    report["exact"] = got == want
    if got != want:
        report["missing"] = sum((want - got).values())
        report["duplicated"] = sum((got - want).values())
    report["name"] = name
    report["ok"] = report["exact"] and (fault_name == "none" or bool(res.restored_from)
                                        and res.restored_from[0] == fault.checkpoint)
    if fault_name == "partition":
        report["store_at_end"] = listing(cluster.s3_uri(name))
    return report, fault


def after_heal(cluster: NetnsCluster, report: dict[str, Any], fault: ClusterFault) -> None:
    """A partitioned host is back: its workers of the old attempt must be gone (they fenced
    themselves) and must not have written anything to the store since the job ended."""
    before = report.pop("store_at_end")
    if fault.host is None:
        report["ok"] = False
        return
    if not fault.healed.wait(fault.seconds + 60):
        raise RuntimeError(f"host {fault.host} was never healed")
    healed = time.monotonic()
    while engine_workers(cluster, fault.host) and time.monotonic() - healed < 30:
        time.sleep(0.2)  # polling another host's processes for their exit, bounded
    report["old_workers_left_after_heal"] = engine_workers(cluster, fault.host)
    report["old_workers_gone_after_s"] = fault.workers_gone_after
    now = listing(cluster.s3_uri(report["name"]))
    report["written_after_heal"] = sorted({k for k, v in now.items() if before.get(k) != v} | (set(before) - set(now)))
    report["ok"] = (report["ok"] and not report["written_after_heal"]
                    and not report["old_workers_left_after_heal"])


def every_slot(cluster: NetnsCluster, spark: Any, timeout: float = 90.0) -> float:
    """Wait until every worker host's executor has registered (a fresh application's
    executors start seconds after it does, later on a busy machine); the seconds waited."""
    from abs_engine.executors.spark import available_slots

    t0 = time.monotonic()
    while (slots := available_slots(spark.sparkContext)) < len(cluster.workers) * cluster.cores:
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"only {slots} of {len(cluster.workers) * cluster.cores} Spark slots registered "
                               f"within {timeout:.0f} s: see the hosts' logs under {cluster.root}")
        time.sleep(0.2)  # polling the cluster's registered executors, bounded
    return time.monotonic() - t0


def return_host(cluster: NetnsCluster, spark: Any, host: str) -> float:
    """Start a lost host's Spark worker again; seconds until the job's slots are back."""
    cluster.start_worker(host)
    return every_slot(cluster, spark)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fault", default="host",
                    help="none, host, partition, netem, or several comma-separated: one job each, in order, on "
                         "one Spark application (a partitioned host heals while the next job runs)")
    ap.add_argument("--words", type=int, default=3_000_000)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--after", type=int, default=2, help="the fault follows this checkpoint completion")
    ap.add_argument("--partition-seconds", type=float, default=30.0)
    ap.add_argument("--delay-ms", type=int, default=20, help="--fault netem: packet delay (see netns_cluster.degrade)")
    ap.add_argument("--loss", type=float, default=2.0, help="--fault netem: percent of packets dropped")
    ap.add_argument("--heartbeat-timeout", type=float, default=6.0)
    ap.add_argument("--name", default="wordcount", help="this run's prefix on the store")
    ap.add_argument("--progress", action="store_true", help="the jobs' progress lines")
    args = ap.parse_args(argv)
    faults = args.fault.split(",")
    unknown = set(faults) - {"none", "host", "partition", "netem"}
    if unknown:
        ap.error(f"unknown fault(s) {sorted(unknown)}")
    cluster = NetnsCluster.attach(os.environ["ABS_CLUSTER"])
    from abs_engine.spark_session import session_for

    spark = session_for(os.environ.get("SPARK_MASTER_URL", cluster.master_url))
    every_slot(cluster, spark)
    reports: list[dict[str, Any]] = []
    healing: list[tuple[dict[str, Any], ClusterFault]] = []
    for i, f in enumerate(faults):
        if f in ("host", "partition"):  # these need every host: a partitioned one must be back
            for report, fault in healing:
                after_heal(cluster, report, fault)
            healing = []
        report, fault = run_one(cluster, spark, f, f"{args.name}-{i}-{f}", args)
        reports.append(report)
        print(f"{f}: exact={report['exact']} restarts={report['restarts']} "
              f"running again after {report.get('running_again_after_s')} s", file=sys.stderr, flush=True)
        if f == "host" and fault.host is not None:
            report["host_back_after_s"] = round(return_host(cluster, spark, fault.host), 2)
        if f == "partition":
            healing.append((report, fault))
    for report, fault in healing:
        after_heal(cluster, report, fault)
    print(json.dumps(reports), flush=True)
    return 0 if all(r["ok"] for r in reports) else 1


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    os._exit(code)  # a cluster that lost a host can make Spark's shutdown hooks wait
