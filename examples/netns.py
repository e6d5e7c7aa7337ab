"""Linux network namespaces for the example cluster (examples/netns_cluster.py): whether
this process may make them, and how to list, empty and remove them. Needs root."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time


class ClusterError(RuntimeError):
    """The cluster could not be set up (not root, no namespaces, Spark did not start)."""


def ip(*args: str) -> None:
    p = subprocess.run(["ip", *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise ClusterError(f"ip {' '.join(args)}: {p.stderr.strip()}")


def namespaces_allowed() -> str | None:
    """None if this process can make network namespaces, else why not."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth pairs, tc)"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs iproute2 (ip, tc)"
    if shutil.which("java") is None and "JAVA_HOME" not in os.environ:
        return "needs Java 17 for Spark"
    probe = f"abs-probe-{os.getpid()}"
    p = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if p.returncode != 0:
        return f"network namespaces are not allowed here: {p.stderr.strip()}"
    try:
        netem = subprocess.run(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root", "netem",
                                "delay", "1ms"], capture_output=True).returncode == 0
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    if not netem and shutil.which("nft") is None:
        return "this kernel has no tc netem, and nftables (the fallback for lossy links) is missing: " \
               "apt-get install nftables"
    return None


def list_namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def kill_all(netns: str) -> list[int]:
    """SIGKILL every process in namespace ``netns`` until none is left (or 50 rounds)."""
    killed: list[int] = []
    for _ in range(50):
        out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout.split()
        if not out:
            break
        for pid in map(int, out):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.05)  # children forked while we killed: look again
    return killed


def remove(namespaces: list[str]) -> None:
    """SIGKILL every process in ``namespaces`` and delete them."""
    for ns in namespaces:
        kill_all(ns)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
