"""How the job master starts an attempt's workers: the launcher protocol.

The master (master.py) drives a job the same way whoever starts its workers: it listens
on one address, each attempt it asks its launcher for one worker process per task, told
the driver's address, the attempt's generation, its secret and, with ``tls`` on, its TLS
material (tls.Material; both never on a command line),
and from then on it talks to the workers only over their authenticated connections.
A launcher answers for the processes it started: whether they still run, how to stop them.

Invariant: ``stop()`` leaves no worker of the attempt running (or, where a launcher cannot
reach a process, one that will exit on its own: a worker's watchdog ends it when its
driver connection is gone).
"""

from __future__ import annotations

from typing import Mapping, Protocol

from ..tls import Material


class WorkerProcess(Protocol):
    """One worker process of an attempt, as far as its launcher can see it."""

    @property
    def pid(self) -> int | None:
        """Its process id, if it runs on this machine and is known."""

    def poll(self) -> int | None:
        """Its exit status once it has exited and the launcher knows; None otherwise."""

    def kill(self) -> None:
        """SIGKILL it (or as close as the launcher can get)."""

    def dump_stacks(self) -> None:
        """Ask it to write its Python stacks to its stderr (faulthandler), if reachable."""

    def describe_exit(self, code: int) -> str:
        """How it ended, for the error the user sees ("killed by signal 9", ...)."""


class Launcher(Protocol):
    """Starts and stops the worker processes of the attempts of one job."""

    #: The address the master listens on, reachable from every worker.
    host: str

    def start(self, tasks: list[str], driver: tuple[str, int], generation: int,
              secret: bytes, material: Material | None = None,
              env: Mapping[str, str] | None = None) -> Mapping[str, WorkerProcess]:
        """One worker per task id, each told to connect to ``driver`` and given ``secret``
        (and ``material``, the attempt's TLS key and certificate, if the job has TLS), with
        ``env`` added to its environment (the attempt's identity: checkpoint/fence.py)."""

    def stop(self, workers: Mapping[str, WorkerProcess], timeout: float) -> None:
        """Kill every worker still running and wait for them, all against one deadline."""

    def wait_exit(self, workers: Mapping[str, WorkerProcess], timeout: float) -> None:
        """The job committed: give the workers ``timeout`` to exit on their own, then stop them."""

    def close(self) -> None:
        """The job has ended: release what the launcher holds."""
