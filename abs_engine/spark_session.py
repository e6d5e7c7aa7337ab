"""The embedded, quiet, local SparkSession the engine starts when the user gives none.

Quiet: no UI, no console progress, logs at ERROR. Bound to loopback (on a standalone
cluster's master, to this machine's address towards it: ``driver_address``). Spark's Python
workers run this same interpreter. Partition sizing is pinned (maxPartitionBytes,
openCostInBytes, default parallelism) so a file-backed DataFrame splits the same way on
every run, which is what makes (partition, row) offsets replayable.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import threading
from typing import Any

from .errors import InputError

#: Spark driver logging for the embedded session: errors only, no start-up notices.
LOG4J2_CONF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spark_log4j2.properties")

#: Pinned so file splits do not depend on the machine's core count.
PINNED_CONF = {
    "spark.sql.files.maxPartitionBytes": str(16 << 20),
    "spark.sql.files.openCostInBytes": str(1 << 20),
    "spark.default.parallelism": "8",
}

#: The Spark executor's barrier stages fail fast when they cannot get their slots (Spark
#: reads these when its scheduler starts, so they are set here, at the session's creation).
BARRIER_CONF = {
    "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "1",
    "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s",
}

_lock = threading.Lock()
_embedded: Any = None
_set_local_ip: str | None = None  #: the SPARK_LOCAL_IP the engine set (None: none, or the user's)
#: Set while ``abs-engine plan`` loads a file: it only prints the plan, so the sources that
#: would start the embedded session to read their input (``SparkSource.csv``...) do not.
planning_only = False


def embedded_session(master: str | None = None) -> Any:
    """The process's embedded SparkSession, started on first use: local (the default), or
    on ``master`` (a cluster URL; the examples' --spark-master). Every Spark user in the
    process (sources, the Spark executor) shares it."""
    global _embedded
    with _lock:
        if _embedded is not None and not _embedded.sparkContext._jsc.sc().isStopped():
            if master is None or _embedded.sparkContext.master == master:
                return _embedded
            _embedded.stop()
            _embedded = None
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        address = choose_address(master)
        if master and master.startswith("local-cluster") and "SPARK_HOME" not in os.environ:
            os.environ["SPARK_HOME"] = _local_cluster_home()
        try:
            from pyspark.sql import SparkSession

            builder = (
                # Slots are threads: the Spark executor's barrier tasks mostly wait on their
                # worker processes, and Spark sources need slots beside them for their reads.
                SparkSession.builder.master(master or f"local[{max(4, os.cpu_count() or 2)}]")
                .appName("abs-engine")
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .config("spark.sql.shuffle.partitions", "8")
                # The driver JVM holds a partition's Arrow batches while serving it (and
                # toArrow() holds a whole DataFrame): Spark's 1g default is too small.
                .config("spark.driver.memory", os.environ.get("ABS_ENGINE_SPARK_MEMORY", "4g"))
                # Errors only, from the start: no start-up notices (the JVM's own "Using
                # incubator modules" line comes before any logging and stays).
                .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{LOG4J2_CONF}")
            )
            if address is not None:
                builder = builder.config("spark.driver.host", address).config("spark.driver.bindAddress", address)
            for k, v in {**PINNED_CONF, **BARRIER_CONF}.items():
                builder = builder.config(k, v)
            spark = builder.getOrCreate()
        except Exception as e:  # noqa: BLE001 - a missing JVM shows up as many exception types
            raise InputError(
                f"Spark could not start ({type(e).__name__}: {str(e).strip().splitlines()[0] if str(e) else e}). "
                "abs-engine reads Spark DataFrames through PySpark, which needs Java 17: install it "
                "(e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME, or use --source file"
            ) from e
        spark.sparkContext.setLogLevel("ERROR")
        _embedded = spark
        return spark


def choose_address(master: str | None) -> str | None:
    """The driver's address for a session on ``master`` (driver_address), exported as
    SPARK_LOCAL_IP unless the user set that: bound to loopback on one machine; on a
    cluster, to the address the executors reach this machine at (they connect back to the
    driver and its engine servers). A SPARK_LOCAL_IP the engine set for an earlier session
    of this process is not the user's choice: a cluster session after a local one gets
    the cluster's address, not loopback."""
    global _set_local_ip
    user_ip = os.environ.get("SPARK_LOCAL_IP")
    user_ip = None if user_ip == _set_local_ip else user_ip
    address = driver_address(master, user_ip)
    if address is not None and user_ip is None:
        os.environ["SPARK_LOCAL_IP"] = _set_local_ip = address
    return address


def driver_address(master: str | None, local_ip: str | None = None) -> str | None:
    """The address the driver binds to and advertises: loopback for a local master; for a
    standalone cluster (``spark://host:port``) ``local_ip`` (the user's SPARK_LOCAL_IP) or
    else the address of this machine on its route to the master; None (Spark's own
    choice) for other masters."""
    if not master or master.startswith("local"):
        return "127.0.0.1"
    if local_ip:
        return local_ip
    m = re.match(r"^spark://\[?([^\],/]+?)\]?(?::(\d+))?(?:[,/]|$)", master)
    if not m:
        return None
    try:
        family = socket.AF_INET6 if ":" in m.group(1) else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((m.group(1), int(m.group(2) or 7077)))  # (UDP: nothing is sent)
            return str(s.getsockname()[0])
    except (OSError, OverflowError, ValueError):
        return None


def listen_host(sc: Any) -> str:
    """Where the engine's servers in the driver (the workers' control server, the Spark
    sources' partition server) listen for executors: loopback for a local master, else
    the address the driver advertises (``spark.driver.host``)."""
    if str(sc.master).startswith("local"):
        return "127.0.0.1"
    return str(sc.getConf().get("spark.driver.host", "127.0.0.1"))


def _local_cluster_home() -> str:
    """A SPARK_HOME for ``local-cluster[...]`` with the pip-installed pyspark: its executors'
    work directories go under SPARK_HOME/work, so it is a temporary directory of links to
    the pyspark package's bin, jars, python and sbin (never the package itself)."""
    import tempfile

    import pyspark

    pkg = os.path.dirname(os.path.abspath(pyspark.__file__))
    home = tempfile.mkdtemp(prefix="abs-engine-spark-home-")
    for name in ("bin", "jars", "python", "sbin", "conf"):
        if os.path.exists(os.path.join(pkg, name)):
            os.symlink(os.path.join(pkg, name), os.path.join(home, name))
    return home


def session_for(master: str) -> Any:
    """The embedded session on ``master`` (see embedded_session)."""
    return embedded_session(master)


def stop_embedded() -> None:
    global _embedded
    with _lock:
        if _embedded is not None:
            _embedded.stop()
            _embedded = None


def is_embedded(spark: Any) -> bool:
    return spark is not None and spark is _embedded
