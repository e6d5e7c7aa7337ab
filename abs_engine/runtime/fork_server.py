"""The fork server: one process per attempt that has imported the worker's modules and
forks the attempt's workers on request (the embedded launcher's way; executors/local.py).

A worker started on its own (``python -m abs_engine.runtime.worker``) spends about a quarter of a
second of CPU on the interpreter's start and the engine's imports before it does any work;
at parallelism 4 an attempt has a dozen of them, on two cores a second of wall time before
the job runs, at every restart. Forked from this process a worker starts in milliseconds.

Command line: ``python -m abs_engine.runtime.worker --fork-server EVENTS_FD HOST PORT
GENERATION``. It is started per attempt with that attempt's environment, so what
``/proc/PID/cmdline`` and ``/proc/PID/environ`` of every forked worker show (and the output
fence reads, checkpoint/fence.py) is the worker module and the attempt's identity, as for
a worker started on its own.

Protocol, all over pipes only the launcher holds (so nothing to authenticate):
- stdin: the attempt's secret and TLS material (the two lines a worker reads, runtime/
  worker.py), then ``fork TASK`` (fork a worker for task TASK) and ``ack PID`` (the
  launcher holds a pidfd on worker PID) lines. End of stdin: exit.
- EVENTS_FD: ``started PID TASK`` per fork, ``exit PID CODE`` per worker reaped
  (CODE as ``Popen.returncode``: negative for a signal).

Modules named in ``PRELOAD_ENV`` (comma-separated; the driver sets it from the operators'
``preload``, e.g. pyarrow for columnar operators) are imported once here, before the first
fork, so that no worker pays for importing them. A failed import is ignored here: the
worker that needs the module raises it.

Invariants: the server runs no *Python* thread (so forking it is safe; a preloaded library
may start native threads of its own, and is preloaded only if it is fork-safe: pyarrow
re-creates its thread pools in a forked child); it reaps only its own
children, and a child only once the launcher has acknowledged it (until then an exited
worker stays a zombie, so its pid cannot name another process before the launcher holds
it by pidfd); it reports each exactly once; a forked worker holds none of its pipes.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import traceback

from .worker_run import TLS_LINE_MAX, parse_secret, run_worker

LINE_MAX = TLS_LINE_MAX + 256


class _Lines:
    """Lines read from a file descriptor without a buffered reader (the stdin a forked
    worker inherits must not hold bytes read ahead)."""

    def __init__(self, fd: int):
        self.fd, self.buf, self.eof = fd, b"", False

    def fill(self) -> None:
        data = os.read(self.fd, 65536)
        if not data:
            self.eof = True
        self.buf += data
        if b"\n" not in self.buf and len(self.buf) > LINE_MAX:
            raise SystemExit("abs-engine fork server: a line on stdin is too long")

    def take(self) -> list[str]:
        *lines, self.buf = self.buf.split(b"\n")
        return [ln.decode("utf-8", "replace") for ln in lines]

    def first_two(self) -> tuple[str, str]:
        """The first two whole lines ("" for each missing at the end of input); what
        follows them (requests that came with the secret) stays for ``take``."""
        while self.buf.count(b"\n") < 2 and not self.eof:
            self.fill()
        *lines, self.buf = self.buf.split(b"\n", 2)
        first, second = ([ln.decode("utf-8", "replace") for ln in lines] + ["", ""])[:2]
        return first, second


def _name_process(task: str) -> None:
    """Name the worker after its task in ``/proc/PID/comm`` (what ``top`` and ``ps -o comm``
    show): its command line is the server's, without the task. Best effort."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, f"abs {task}".encode()[:15], 0, 0, 0)  # PR_SET_NAME: at most 15 bytes
    except (OSError, AttributeError):
        pass


#: Modules the fork server imports before it forks (set by the driver: executors/master.py).
PRELOAD_ENV = "ABS_ENGINE_PRELOAD"


def _preload() -> None:
    import importlib

    for name in filter(None, os.environ.get(PRELOAD_ENV, "").split(",")):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001, S112 - the worker that needs it raises it, with its task's name
            continue


def serve(args: list[str]) -> int:
    events_fd, host, port, generation = int(args[0]), args[1], int(args[2]), int(args[3])
    # The terminal's Ctrl-C reaches the process group; the driver decides what it means.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stdin = _Lines(0)
    secret, material = parse_secret(*stdin.first_two())
    _preload()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # its wake-up byte is what matters
    events = os.fdopen(events_fd, "wb", buffering=0)
    own = (events_fd, wake_r, wake_w)

    def fork(task: str) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for fd in own:
                    os.close(fd)
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.close(null)
                _name_process(task)
                code = run_worker(host, port, task, generation, host, secret, material)
            except BaseException:  # noqa: BLE001 - this is the worker's last word
                traceback.print_exc()
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        children.add(pid)
        events.write(f"started {pid} {task}\n".encode())

    def handle(line: str) -> None:
        command, _, arg = line.partition(" ")
        if command == "fork" and arg:
            fork(arg)
        elif command == "ack" and arg.isdigit():
            acked.add(int(arg))

    def reap() -> None:
        for pid in sorted(children & acked):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # (cannot be: an unreaped child of ours)
                children.discard(pid)
                continue
            if done:
                children.discard(pid)
                acked.discard(pid)
                events.write(f"exit {pid} {os.waitstatus_to_exitcode(status)}\n".encode())

    children: set[int] = set()
    acked: set[int] = set()
    for line in stdin.take():
        handle(line)
    try:
        while not stdin.eof:
            ready, _, _ = select.select([0, wake_r], [], [])
            if wake_r in ready:
                while True:
                    try:
                        if not os.read(wake_r, 512):
                            break
                    except BlockingIOError:
                        break
            if 0 in ready:
                stdin.fill()
                for line in stdin.take():
                    handle(line)
            reap()
    except BrokenPipeError:
        return 0  # the launcher is gone: its workers run on until their driver connection ends
    return 0
