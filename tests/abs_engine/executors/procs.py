"""The worker processes of a job, as /proc shows them (for tests that attack or count them).

A local job's workers are forked by one fork server per attempt (runtime/fork_server.py):
they are the server's children and show its command line. Workers started on their own
(the Spark executor's) show ``abs_engine.runtime.worker HOST PORT TASK GENERATION``. And
the two helpers the tests that attack them share: ``wait_for`` another process, and a job
``run_in_thread``."""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

WORKER = "abs_engine.runtime.worker"
SERVER = "--fork-server"


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return rest[0], int(rest[1])


def gone(pid: int) -> bool:
    st = proc_stat(pid)
    return st is None or st[0] in ("Z", "X")


def _engine_processes() -> dict[int, tuple[str, int, list[str]]]:
    """pid -> (state, parent, argv) of every process running the worker module."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = proc_stat(int(name))
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = [a.decode() for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        if st is not None and WORKER in argv:
            out[int(name)] = (st[0], st[1], argv)
    return out


def workers_of(parent: int | None, live: bool = False) -> dict[int, list[str]]:
    """pid -> argv of the abs-engine workers started by ``parent`` (None: by anyone), the
    fork servers not counted; ``live``: zombies not counted either."""
    procs = _engine_processes()
    servers = {pid for pid, (_, pp, argv) in procs.items()
               if SERVER in argv and (pp not in procs or SERVER not in procs[pp][2])}
    mine = {pid for pid in servers if parent is None or procs[pid][1] == parent}
    return {pid: argv for pid, (state, pp, argv) in procs.items()
            if pid not in servers and (not live or state not in ("Z", "X"))
            and (pp in mine or (SERVER not in argv and (parent is None or pp == parent)))}


def servers_of(parent: int) -> list[int]:
    """The live fork servers ``parent`` started."""
    return [pid for pid, (state, pp, argv) in _engine_processes().items()
            if SERVER in argv and pp == parent and state not in ("Z", "X")]


def address(argv: list[str]) -> tuple[str, int]:
    """The driver's address on a worker's command line."""
    i = argv.index(WORKER) + (3 if SERVER in argv else 1)
    return argv[i], int(argv[i + 1])


def wait_for(pred: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll a condition another process makes true (bounded; fails the test on timeout)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def run_in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """``fn()`` on a thread of its own: its result or its error lands in the box."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001
            box["error"] = e

    t = threading.Thread(target=target)
    t.start()
    return t, box
