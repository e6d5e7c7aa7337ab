"""A multi-host Spark cluster on one Linux machine: every host a network namespace.

    python3 examples/netns_cluster.py demo            # word count on the cluster, one host lost
    python3 examples/netns_cluster.py run -- 'CMD'    # CMD runs on the driver host
    python3 examples/netns_cluster.py down --prefix P # what a killed run left behind

The hosts are Linux network namespaces joined by veth pairs to a bridge (the "switch", in a
namespace of its own) on a private subnet: a Spark standalone master, ``--workers`` worker
hosts (each its own address and working directory: Spark's work dir, local dirs and
temporary files never shared), an S3-compatible store (moto's server) that holds the
checkpoints and the output, and the driver. Namespaces isolate the network, not the file
system: the hosts' directories are apart, and a job shares nothing through the disk when
its checkpoints and output are on the store and its input is generated or read through
Spark. Nothing outside the namespaces changes: the machine's own network is never
touched, so any subnet works, and the end of ``run``/``demo`` (Ctrl-C and SIGTERM too)
kills every process of every host and deletes the namespaces; ``down`` removes what a
killed run left (its namespaces are named ``<prefix>-<host>``).

What a real cluster does to a job, this one does too: ``kill_host`` SIGKILLs every process
of a host (Spark's worker daemon, its executor JVM, the engine's workers: a lost machine),
``partition``/``heal`` take a host's link down and up, ``netem`` delays and drops its
packets (``tc netem``). Needs root (namespaces, veth, tc) and Java 17 for Spark.

``run`` gives CMD these variables: ``SPARK_MASTER_URL``, ``S3_ENDPOINT`` (host:port),
``CHECKPOINT_URI`` (an ``s3://`` URI on the store, credentials in the environment), and
``ABS_CLUSTER`` (the cluster's description, which ``NetnsCluster.attach`` reads back).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Mapping

try:
    from .netns import ClusterError, ip, kill_all, list_namespaces, namespaces_allowed, remove
except ImportError:  # run as a script
    from netns import (ClusterError, ip, kill_all, list_namespaces,  # type: ignore[no-redef,import-not-found]
                       namespaces_allowed, remove)

#: Dummy credentials for the store (moto accepts any).
S3_ENV = {"AWS_ACCESS_KEY_ID": "cluster", "AWS_SECRET_ACCESS_KEY": "cluster", "AWS_DEFAULT_REGION": "us-east-1"}
BUCKET = "abs-cluster"
S3_PORT = 5000
MASTER_PORT = 7077
#: The master declares a silent worker lost after this many seconds (Spark's default is 60).
WORKER_TIMEOUT = 10


@dataclass(frozen=True)
class Host:
    name: str  #: "master", "worker1", ..., "s3", "driver"
    netns: str  #: the namespace's name (``ip netns``)
    address: str  #: its address on the cluster's subnet
    workdir: str  #: its own directory: Spark work and local dirs, logs, TMPDIR, HOME


def spark_home() -> str:
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))


class NetnsCluster:
    """The cluster; ``start()`` builds it, ``stop()`` removes every trace of it."""

    def __init__(self, workers: int = 3, cores: int = 1, memory: str = "1g", root: str | None = None,
                 prefix: str | None = None, subnet: str = "10.231.7"):
        self.prefix = prefix or f"abs{os.getpid() % 100000}"
        self.root = root or tempfile.mkdtemp(prefix="abs-cluster-")
        self.cores, self.memory, self.subnet = cores, memory, subnet
        names = ["master", *[f"worker{i + 1}" for i in range(workers)], "s3", "driver"]
        octets = {"master": 2, "s3": 3, "driver": 4, **{f"worker{i + 1}": 11 + i for i in range(workers)}}
        self.hosts = {n: Host(n, f"{self.prefix}-{n}", f"{subnet}.{octets[n]}", os.path.join(self.root, n))
                      for n in names}
        self.switch = f"{self.prefix}-switch"
        self.procs: dict[str, list[subprocess.Popen[bytes]]] = {}
        self.created: list[str] = []  #: the namespaces this object made (stop deletes those only)

    # -- what processes on the cluster are told ---------------------------------------------

    @property
    def master_url(self) -> str:
        return f"spark://{self.hosts['master'].address}:{MASTER_PORT}"

    @property
    def s3_endpoint(self) -> str:
        return f"{self.hosts['s3'].address}:{S3_PORT}"

    def s3_uri(self, prefix: str) -> str:
        return f"s3://{BUCKET}/{prefix}?endpoint_override={self.s3_endpoint}&scheme=http&region=us-east-1"

    @property
    def workers(self) -> list[Host]:
        return [h for n, h in self.hosts.items() if n.startswith("worker")]

    def describe(self) -> str:
        """What ``attach`` needs (JSON)."""
        return json.dumps({"workers": len(self.workers), "cores": self.cores, "memory": self.memory,
                           "root": self.root, "prefix": self.prefix, "subnet": self.subnet})

    @classmethod
    def attach(cls, description: str) -> "NetnsCluster":
        """The cluster a process was started on (``ABS_CLUSTER``): it can inject faults
        and restart worker daemons; ``stop`` is its starter's."""
        return cls(**json.loads(description))

    def env(self) -> dict[str, str]:
        """The variables ``run`` gives its command."""
        return {"SPARK_MASTER_URL": self.master_url, "S3_ENDPOINT": self.s3_endpoint,
                "CHECKPOINT_URI": self.s3_uri("checkpoints"), **S3_ENV, "ABS_CLUSTER": self.describe()}

    # -- building it -------------------------------------------------------------------------

    def start(self, timeout: float = 90.0) -> "NetnsCluster":
        why = namespaces_allowed()
        if why:
            raise ClusterError(why)
        try:
            self._network()
            self._start_master()
            for w in self.workers:
                self.start_worker(w.name)
            self._start_s3()
            self.wait_for_workers(len(self.workers), timeout)
            self._wait_for_s3(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _network(self) -> None:
        taken = sorted(set(list_namespaces()) & {self.switch, *(h.netns for h in self.hosts.values())})
        if taken:
            raise ClusterError(f"namespaces {taken} exist already: another cluster with prefix {self.prefix!r}, or "
                               f"one a killed run left (remove it: netns_cluster.py down --prefix {self.prefix})")
        ip("netns", "add", self.switch)
        self.created.append(self.switch)
        ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        ip("-n", self.switch, "link", "set", "br0", "up")
        for h in self.hosts.values():
            os.makedirs(os.path.join(h.workdir, "tmp"), exist_ok=True)
            ip("netns", "add", h.netns)
            self.created.append(h.netns)
            ip("-n", self.switch, "link", "add", f"v-{h.name}", "type", "veth", "peer", "name", "eth0", "netns", h.netns)
            ip("-n", self.switch, "link", "set", f"v-{h.name}", "master", "br0", "up")
            ip("-n", h.netns, "addr", "add", f"{h.address}/24", "dev", "eth0")
            ip("-n", h.netns, "link", "set", "eth0", "up")
            ip("-n", h.netns, "link", "set", "lo", "up")

    def host_env(self, name: str) -> dict[str, str]:
        """The environment of a process on host ``name``: its own address and directories."""
        h = self.hosts[name]
        return {**os.environ, **S3_ENV, "SPARK_HOME": spark_home(), "SPARK_LOCAL_IP": h.address,
                "SPARK_LOCAL_HOSTNAME": h.address, "SPARK_LOCAL_DIRS": os.path.join(h.workdir, "local"),
                "SPARK_LOG_DIR": os.path.join(h.workdir, "logs"), "TMPDIR": os.path.join(h.workdir, "tmp"),
                "HOME": h.workdir, "PYSPARK_PYTHON": sys.executable}

    def popen(self, name: str, argv: list[str], log: str | None = None,
              env: Mapping[str, str] | None = None, output: Any = subprocess.DEVNULL,
              cwd: str | None = None) -> subprocess.Popen[bytes]:
        """Start ``argv`` on host ``name``: its output (stdout and stderr) to ``log`` in the
        host's directory, or to ``output`` (a file, ``subprocess.PIPE``, None: this process's)."""
        h = self.hosts[name]
        out: Any = open(os.path.join(h.workdir, log), "ab") if log else output
        p = subprocess.Popen(["ip", "netns", "exec", h.netns, *argv], env={**self.host_env(name), **(env or {})},
                             stdout=out, stderr=subprocess.STDOUT if log or out is subprocess.PIPE else out,
                             cwd=cwd or h.workdir, start_new_session=True)
        if log:
            out.close()
        self.procs.setdefault(name, []).append(p)
        return p

    def _spark_class(self, *args: str) -> list[str]:
        return [os.path.join(spark_home(), "bin", "spark-class"), *args]

    def _start_master(self) -> None:
        m = self.hosts["master"]
        self.popen("master", self._spark_class("org.apache.spark.deploy.master.Master", "--host", m.address,
                                               "--port", str(MASTER_PORT), "--webui-port", "8080"),
                   log="master.log", env={"SPARK_MASTER_OPTS": f"-Dspark.worker.timeout={WORKER_TIMEOUT}"})

    def start_worker(self, name: str) -> None:
        """Start (or restart, after ``kill_host``) host ``name``'s Spark worker daemon."""
        h = self.hosts[name]
        self.popen(name, self._spark_class("org.apache.spark.deploy.worker.Worker", self.master_url,
                                           "--host", h.address, "--cores", str(self.cores), "--memory",
                                           self.memory, "--work-dir", os.path.join(h.workdir, "work")),
                   # (the worker heartbeats every quarter of its own copy of the timeout)
                   log="worker.log", env={"SPARK_WORKER_OPTS": f"-Dspark.worker.timeout={WORKER_TIMEOUT}"})

    def _start_s3(self) -> None:
        s = self.hosts["s3"]
        self.popen("s3", [sys.executable, "-m", "moto.server", "-H", s.address, "-p", str(S3_PORT)], log="s3.log")

    def registered_workers(self) -> int:
        """Workers the master has registered (from its log; each registration is one line)."""
        try:
            with open(os.path.join(self.hosts["master"].workdir, "master.log"), errors="replace") as f:
                text = f.read()
        except FileNotFoundError:
            return 0
        return text.count("Registering worker ")

    def wait_for_workers(self, count: int, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while self.registered_workers() < count:
            for name, ps in self.procs.items():
                if any(p.poll() is not None for p in ps) and name in ("master",):
                    raise ClusterError(f"the Spark master exited: see {self.hosts[name].workdir}/master.log")
            if time.monotonic() > deadline:
                raise ClusterError(f"only {self.registered_workers()} of {count} Spark workers registered within "
                                   f"{timeout:.0f} s: see the logs under {self.root}")
            time.sleep(0.2)  # polling a log file for a line another process writes

    def _wait_for_s3(self, timeout: float) -> None:
        """Wait (from the driver host, in one process: no interpreter per try) until the
        store accepts connections, then make the bucket."""
        s3 = self.hosts["s3"]
        code = ("import socket, sys, time\n"
                f"deadline = time.monotonic() + {timeout}\n"
                "while True:\n"
                "    try:\n"
                f"        socket.create_connection(('{s3.address}', {S3_PORT}), timeout=1).close()\n"
                "        break\n"
                "    except OSError:\n"
                "        if time.monotonic() > deadline: sys.exit(1)\n"
                "        time.sleep(0.1)  # the store is starting: poll until it listens\n"
                "import pyarrow.fs as f\n"
                f"s = f.S3FileSystem(endpoint_override='{self.s3_endpoint}', scheme='http', region='us-east-1', "
                "allow_bucket_creation=True, connect_timeout=1, request_timeout=5)\n"
                f"s.create_dir('{BUCKET}')\n")
        if self.popen("driver", [sys.executable, "-c", code]).wait() != 0:
            raise ClusterError(f"the S3 store did not start within {timeout:.0f} s: see {s3.workdir}/s3.log")

    # -- faults ------------------------------------------------------------------------------

    def pids(self, name: str) -> list[int]:
        """Every process on host ``name`` now."""
        out = subprocess.run(["ip", "netns", "pids", self.hosts[name].netns], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def host_of(self, pid: int) -> str | None:
        """The host a process runs on (None: none of this cluster's)."""
        out = subprocess.run(["ip", "netns", "identify", str(pid)], capture_output=True, text=True).stdout.split()
        by_ns = {h.netns: n for n, h in self.hosts.items()}
        return next((by_ns[ns] for ns in out if ns in by_ns), None)

    def kill_host(self, name: str) -> list[int]:
        """SIGKILL every process of host ``name`` (a lost machine), until none is left."""
        killed = kill_all(self.hosts[name].netns)
        if self.pids(name):
            raise ClusterError(f"processes of {name} survive SIGKILL: {self.pids(name)}")
        return killed

    def partition(self, name: str) -> None:
        """Cut host ``name`` off the network (its link to the switch goes down)."""
        ip("-n", self.switch, "link", "set", f"v-{name}", "down")

    def heal(self, name: str) -> None:
        ip("-n", self.switch, "link", "set", f"v-{name}", "up")

    def degrade(self, name: str, delay_ms: int = 20, loss_percent: float = 2.0) -> str:
        """Delay and drop packets on host ``name``'s link; returns what was applied.
        ``tc netem`` (delay ``delay_ms`` +- half, ``loss_percent`` loss) where the kernel
        has it; where it has not (sch_netem is a module some kernels lack), loss is an
        nftables rule dropping that share of packets in both directions and delay is a
        ``tbf`` shaper (8 Mbit/s) whose queue holds up to ``delay_ms`` of packets: queueing
        delay under load, and tail drops past it."""
        run = ["ip", "netns", "exec", self.hosts[name].netns]
        spec = ["delay", f"{delay_ms}ms", f"{delay_ms // 2}ms", "loss", f"{loss_percent}%"]
        p = subprocess.run([*run, "tc", "qdisc", "replace", "dev", "eth0", "root", "netem", *spec],
                           capture_output=True, text=True)
        if p.returncode == 0:
            return "tc netem " + " ".join(spec)
        if shutil.which("nft") is None:
            raise ClusterError(f"this kernel has no tc netem ({p.stderr.strip()}) and nftables (nft), the "
                               "fallback for packet loss, is not installed: apt-get install nftables")
        share = max(1, round(loss_percent * 10))  # per mille
        rules = ["add table inet chaos",  # (the link only: loopback inside the host is not the network)
                 "add chain inet chaos out { type filter hook output priority 0 ; }",
                 "add chain inet chaos in { type filter hook input priority 0 ; }",
                 f"add rule inet chaos out oifname eth0 numgen random mod 1000 < {share} drop",
                 f"add rule inet chaos in iifname eth0 numgen random mod 1000 < {share} drop"]
        for rule in rules:
            q = subprocess.run([*run, "nft", *rule.split()], capture_output=True, text=True)
            if q.returncode != 0:
                raise ClusterError(f"nft {rule}: {q.stderr.strip()}")
        q = subprocess.run([*run, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", "8mbit",
                            "burst", "32kb", "latency", f"{delay_ms}ms"], capture_output=True, text=True)
        if q.returncode != 0:
            raise ClusterError(f"tc tbf: {q.stderr.strip()}")
        return f"nftables: {loss_percent}% of packets dropped each way; tbf 8mbit with up to {delay_ms} ms of queue"

    def restore_link(self, name: str) -> None:
        """Undo ``degrade``."""
        run = ["ip", "netns", "exec", self.hosts[name].netns]
        subprocess.run([*run, "tc", "qdisc", "del", "dev", "eth0", "root"], capture_output=True)
        subprocess.run([*run, "nft", "delete", "table", "inet", "chaos"], capture_output=True)

    # -- tearing it down ---------------------------------------------------------------------

    def stop(self) -> None:
        """Kill every process of the hosts this object made and delete their namespaces
        (idempotent)."""
        remove(self.created)
        self.created = []
        for ps in self.procs.values():
            for p in ps:
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass

    def __enter__(self) -> "NetnsCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _exit_on(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through stop(): no host left behind


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=3, help="worker hosts (default %(default)s)")
    ap.add_argument("--cores", type=int, default=1, help="task slots per worker host (default %(default)s)")
    ap.add_argument("--keep", action="store_true", help="keep the hosts' directories (logs) afterwards")
    sub = ap.add_subparsers(dest="what", required=True)
    sub.add_parser("demo", help="word count on the cluster with checkpoints on the store; one host is lost")
    run = sub.add_parser("run", help="run CMD on the driver host (sh -c), with the cluster's variables")
    run.add_argument("cmd", nargs=argparse.REMAINDER)
    down = sub.add_parser("down", help="remove the namespaces (and their processes) of a cluster a killed run left")
    down.add_argument("--prefix", required=True, help="its prefix: the part of its namespaces' names before '-'")
    args = ap.parse_args(argv)
    if args.what == "down":
        left = [ns for ns in list_namespaces() if ns.startswith(f"{args.prefix}-")]
        remove(left)
        print(f"removed {len(left)} namespaces: {' '.join(left) or '-'}", file=sys.stderr)
        return 0
    why = namespaces_allowed()
    if why:
        print(f"netns_cluster: {why}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _exit_on)
    signal.signal(signal.SIGHUP, _exit_on)
    cluster = NetnsCluster(workers=args.workers, cores=args.cores)
    print(f"starting {args.workers} worker hosts, a master, a store and a driver under {cluster.root} ...",
          file=sys.stderr)
    try:
        cluster.start()
        print(f"cluster up: master {cluster.master_url}, store {cluster.s3_endpoint} (prefix {cluster.prefix})",
              file=sys.stderr)
        if args.what == "demo":
            here = os.path.dirname(os.path.abspath(__file__))
            cmd = [sys.executable, os.path.join(here, "cluster_wordcount.py"), "--fault", "host"]
        else:
            words = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
            cmd = ["sh", "-c", " ".join(words)]  # one shell word each: quote what the driver's shell expands
        return cluster.popen("driver", cmd, env=cluster.env(), output=None, cwd=os.getcwd()).wait()
    finally:
        cluster.stop()
        if not args.keep:
            shutil.rmtree(cluster.root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
