"""The tasks of one attempt, as the job master sees them, wherever they run.

The master (master.py) drives every attempt the same way: it starts the attempt's tasks
with their Deploy messages, receives their messages, sends them the coordinator's, and asks
whether they are alive. ``ProcessAttempt`` runs each task in a worker process a launcher
starts (local processes, Spark barrier tasks) and talks to it over an authenticated
connection; ``executors/inprocess.py`` runs them all in the driver's thread.

Invariants (ProcessAttempt): a connection is read only after it proved this attempt's
secret; a message that claims another task than its connection's is a protocol breach that
fails that task; a worker's death is reported with its own last words (its Failed
message) when it sent any, else with its exit status.
"""

from __future__ import annotations

import select
import selectors
import socket
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol

from .. import auth, codec, messages
from ..errors import ProtocolError, ProtocolErrorReason
from ..tls import Material
from ..wire import Wire
from ..runtime.worker_run import REGION_ATTEMPT_ENV
from .failures import WorkerFailure
from .launcher import Launcher, WorkerProcess

#: A task's Deploy, given the data addresses of every task (empty where none are needed).
DeployOf = Callable[[str, dict[str, tuple[str, int]]], messages.Deploy]


class Attempt(Protocol):
    """The running tasks of one attempt."""

    #: Tasks that committed the job's final checkpoint (or a stop's savepoint).
    committed: set[str]

    def start(self, deploy: DeployOf) -> dict[str, int | None]:
        """Start every task with its Deploy; the pid each runs in (None: unknown, or none)."""

    def receive(self, timeout: float) -> list[tuple[str, messages.Message]]:
        """Messages from the tasks, waiting up to ``timeout`` seconds for the first.
        Raises WorkerFailure for a task that is gone or broke the protocol."""

    def send(self, task: str, msg: messages.Message) -> None:
        """Raises WorkerFailure if ``task`` cannot be reached."""

    def check(self, now: float, silence: "Silence") -> None:
        """Raises WorkerFailure for a task that died, or went silent for ``silence``."""

    def root_cause(self, exclude: str, suspect: str | None) -> None:
        """A task lost a peer: raise the failure of the task that really died, if any."""

    def live_pids(self) -> dict[str, int]:
        """task -> pid of the workers still running that have a pid here (for chaos)."""

    def finish(self) -> None:
        """Every task committed: let them exit."""

    def close(self) -> None:
        """Stop whatever still runs (every path out of an attempt)."""


@dataclass
class Worker:
    task: str
    proc: WorkerProcess
    sock: socket.socket | None = None
    wire: Wire | None = None
    reader: codec.FrameReader = field(default_factory=lambda: codec.FrameReader(codec.MAX_CONTROL_FRAME))
    last_heard: float = field(default_factory=time.monotonic)
    hello_pid: int | None = None  #: the pid the worker announced (it may run elsewhere)
    peer_host: str = ""  #: the address the worker announced (its machine)


@dataclass(frozen=True)
class Silence:
    """How long a worker may send nothing before it counts as lost, and the setting that
    says so (for the error)."""

    seconds: float  #: 0: never
    setting: str

    @classmethod
    def of(cls, heartbeat_timeout: float, task_timeout: float) -> "Silence":
        """The shorter of the two that is set (``heartbeat_timeout``: JobConfig.heartbeat_bound,
        for lost machines; ``task_timeout``, for a user call holding the GIL)."""
        timeouts = [(t, n) for t, n in ((heartbeat_timeout, "heartbeat_timeout"), (task_timeout, "task_timeout"))
                    if t]
        return cls(*min(timeouts)) if timeouts else cls(0.0, "")


class ProcessAttempt:
    """An attempt's tasks in worker processes, each over its control connection."""

    def __init__(self, tasks: list[str], launcher: Launcher, listener: socket.socket, generation: int,
                 secret: bytes, material: Material | None, env: Mapping[str, str], startup_timeout: float,
                 on_wait: Callable[[], None], log: Callable[[str], None]):
        self.tasks, self.launcher, self.listener = tasks, launcher, listener
        self.generation, self.secret, self.material, self.env = generation, secret, material, env
        self.startup_timeout = startup_timeout
        self.on_wait = on_wait  #: called while waiting for the workers' hellos (chaos)
        self.log = log
        self.workers: dict[str, Worker] = {}
        self.committed: set[str] = set()
        self.sel: selectors.BaseSelector | None = None
        #: Messages read before a failure was raised (receive), handed out next time: a
        #: region restart (regions.py) goes on with the attempt, and they are the others'.
        self.backlog: list[tuple[str, messages.Message]] = []

    # ---- start ------------------------------------------------------------------------------

    def start(self, deploy: DeployOf) -> dict[str, int | None]:
        host, port = self.listener.getsockname()[:2]
        procs = self.launcher.start(self.tasks, (host, port), self.generation, self.secret, self.material,
                                    env=self.env)
        self.workers.update({t: Worker(t, p) for t, p in procs.items()})
        peers = self._accept_hellos(self.workers)
        for t in self.tasks:
            self.send(t, deploy(t, peers))
        self.sel = selectors.DefaultSelector()
        for w in self.workers.values():
            assert w.sock is not None
            self.sel.register(w.sock, selectors.EVENT_READ, w)
            w.last_heard = time.monotonic()
        return {t: w.hello_pid or w.proc.pid for t, w in self.workers.items()}

    def restart(self, tasks: list[str], deploy: DeployOf, number: int) -> dict[str, int | None]:
        """Stop ``tasks`` (a failover region: regions.py) and start them again in new
        workers deployed with ``deploy``, the others untouched. The old workers have exited
        before the new ones start. Their peers are each other: a region's channels stay
        inside it. ``number``: the failovers before this start (the workers' attempt
        number, as ``abs_engine.testing.fail_at`` reads it)."""
        assert self.sel is not None
        old = {t: self.workers.pop(t) for t in tasks}
        for w in old.values():
            if w.sock is not None:
                try:
                    self.sel.unregister(w.sock)
                except (KeyError, ValueError):
                    pass  # (its connection had closed: unregistered then)
                w.sock.close()
        self.launcher.stop({t: w.proc for t, w in old.items()}, timeout=10.0)
        alive = sorted(t for t, w in old.items() if w.proc.poll() is None)
        if alive:
            # Its new workers would share the old ones' fence token: a live old worker could
            # still publish after they restore. The attempt fails instead (a new attempt
            # advances the fence, which fences out or kills whatever of this one lives on;
            # close() tries to stop them again).
            self.workers.update(old)
            raise WorkerFailure(alive[0], None, f"the old workers of tasks {alive} did not exit when "
                                                "killed for their region's restart")
        self.committed -= set(tasks)
        self.backlog = [(t, m) for t, m in self.backlog if t not in old]  # the old workers' last words
        host, port = self.listener.getsockname()[:2]
        procs = self.launcher.start(tasks, (host, port), self.generation, self.secret, self.material,
                                    env={**self.env, REGION_ATTEMPT_ENV: str(number)})
        new = {t: Worker(t, p) for t, p in procs.items()}
        self.workers.update(new)
        peers = self._accept_hellos(new)
        for t in tasks:
            self.send(t, deploy(t, peers))
        for w in new.values():
            assert w.sock is not None
            self.sel.register(w.sock, selectors.EVENT_READ, w)
            w.last_heard = time.monotonic()
        return {t: w.hello_pid or w.proc.pid for t, w in new.items()}

    def _accept_hellos(self, workers: dict[str, Worker]) -> dict[str, tuple[str, int]]:
        """The Hello of each of ``workers``, over connections that proved this attempt's
        secret first. Strangers, stragglers of older attempts (another secret) and stalled
        handshakes are dropped without failing anything."""
        listener = self.listener
        deadline = time.monotonic() + self.startup_timeout
        peers: dict[str, tuple[str, int]] = {}
        pending: dict[socket.socket, auth.Incoming] = {}
        sel = selectors.DefaultSelector()
        sel.register(listener, selectors.EVENT_READ, None)

        def drop(sock: socket.socket) -> None:
            sel.unregister(sock)
            pending.pop(sock, None)
            sock.close()

        try:
            while len(peers) < len(workers):
                # Only those starting: a region restarting alone (restart) must not fail the
                # attempt for another lane's death, which the driver's loop restarts in turn.
                self._check_alive(workers)
                self.on_wait()
                now = time.monotonic()
                if now > deadline:
                    missing = sorted(set(workers) - set(peers))
                    raise WorkerFailure("*", None, f"workers {missing} did not connect within "
                                                   f"{self.startup_timeout}s")
                for sock in [s for s, h in pending.items() if h.hs.expired(now)]:
                    drop(sock)
                for key, _ in sel.select(timeout=0.05):
                    if key.data is None:
                        if (new := auth.admit(listener, self.secret, codec.MAX_CONTROL_FRAME, pending, drop,
                                              self.material)) is not None:
                            pending[new.sock] = new
                            sel.register(new.sock, selectors.EVENT_READ, new.sock)
                        continue
                    sock = key.data
                    conn = pending[sock]
                    try:
                        frame = conn.on_readable()
                        if frame is None:
                            continue
                        msg = messages.decode(frame[1])
                    except (OSError, ProtocolError) as e:
                        if conn.hs.done:
                            self.log(f"dropped a connection that broke the protocol after authenticating: {e}")
                        drop(sock)
                        continue
                    sel.unregister(sock)
                    del pending[sock]
                    if isinstance(msg, messages.Failed) and msg.task in workers:
                        raise WorkerFailure.of(msg, "failed at start-up")
                    if not isinstance(msg, messages.Hello) or msg.generation != self.generation \
                            or msg.task not in workers or msg.task in peers:
                        sock.close()
                        continue
                    w = workers[msg.task]
                    w.sock, w.wire, w.reader = sock, conn.wire, conn.reader
                    w.hello_pid, w.peer_host = msg.pid, msg.host
                    w.last_heard = time.monotonic()
                    peers[msg.task] = (msg.host, msg.port)
        finally:
            sel.close()
            for s in pending:
                s.close()
        return peers

    # ---- running ----------------------------------------------------------------------------

    def receive(self, timeout: float) -> list[tuple[str, messages.Message]]:
        if self.backlog:
            out, self.backlog = self.backlog, []
            return out
        out = []
        try:
            self._receive(timeout, out)
        except WorkerFailure:
            self.backlog = out  # read before the failure: the others' messages are not lost
            raise
        return out

    def _receive(self, timeout: float, out: list[tuple[str, messages.Message]]) -> None:
        assert self.sel is not None
        for key, _ in self.sel.select(timeout=timeout):
            w = key.data
            assert w.wire is not None
            try:
                data = w.wire.recv(1 << 20)
            except OSError:
                data = b""
            if data is None:
                continue  # part of a TLS record
            if not data:
                self.sel.unregister(w.sock)
                if w.task in self.committed:
                    continue
                _await_exit(w.proc, 5.0)
                self._check_alive({w.task: w})
                raise WorkerFailure(w.task, None, "worker closed its control connection")
            w.last_heard = time.monotonic()
            try:
                w.reader.feed(data)
                while (frame := w.reader.next_frame()) is not None:
                    msg = messages.decode(frame[1])
                    if getattr(msg, "task", w.task) != w.task:
                        raise ProtocolError(ProtocolErrorReason.MALFORMED,
                                            f"a message claims to come from task {msg.task!r}")  # type: ignore[attr-defined]
                    if isinstance(msg, messages.Committed):
                        self.committed.add(w.task)
                    out.append((w.task, msg))
            except ProtocolError as e:
                raise WorkerFailure(w.task, None, f"broke the control protocol ({e})") from None

    def send(self, task: str, msg: messages.Message) -> None:
        w = self.workers[task]
        assert w.wire is not None
        try:
            w.wire.sendall(messages.encode(msg))
        except OSError:
            self._check_alive({w.task: w})
            raise WorkerFailure(w.task, None, "control connection lost") from None

    def check(self, now: float, silence: "Silence") -> None:
        self._check_alive()
        if not silence.seconds:
            return
        for w in self.workers.values():
            if w.task in self.committed or now - w.last_heard <= silence.seconds:
                continue
            if w.sock is not None and select.select([w.sock], [], [], 0)[0]:
                # Its frames wait unread: the driver was busy (a long savepoint copy, a slow
                # store), not the worker silent. They are read on the next receive.
                w.last_heard = now
                continue
            w.proc.dump_stacks()
            where = f" on {w.peer_host}" if w.peer_host else ""
            raise WorkerFailure(w.task, None, f"worker {w.hello_pid or w.proc.pid or '?'}{where} sent nothing for "
                                              f"{now - w.last_heard:.1f}s ({silence.setting}={silence.seconds:g}s): "
                                              "its machine is lost or cut off from the driver, or it is stopped, "
                                              "or stuck without releasing the GIL (its Python stacks, if it is "
                                              "local, were dumped to stderr)")

    def _check_alive(self, workers: dict[str, Worker] | None = None) -> None:
        silent: list[WorkerFailure] = []
        lost_peer: list[tuple[WorkerFailure, messages.Failed]] = []
        for w in (workers or self.workers).values():
            code = w.proc.poll()
            # Status 0 is judged on the control connection (EOF before Committed fails); a worker
            # that committed the final checkpoint has done all its work.
            if code is None or code == 0 or w.task in self.committed:
                continue
            words = self._last_words(w)
            failure = self._failure_of(w, code, words)
            if words is None:
                silent.append(failure)
            elif words.collateral:
                lost_peer.append((failure, words))
            else:
                raise failure  # it said what went wrong (the poison-record rule needs it)
        if silent:
            raise silent[0]
        if lost_peer:
            # Died only for a lost peer: that peer's death (perhaps not seen yet) is the failure.
            failure, words = lost_peer[0]
            self.root_cause(exclude=failure.task, suspect=words.peer)
            raise failure

    def _failure_of(self, w: Worker, code: int, words: messages.Failed | None = None) -> WorkerFailure:
        """Why a dead worker died: its own Failed message (operator, user traceback, fatal)
        if it sent one about itself (``words``, else read now), else its exit status."""
        words = words or self._last_words(w)
        if words is not None and not words.collateral:
            return WorkerFailure.of(words)
        return WorkerFailure(w.task, None, f"worker process {w.proc.pid or '?'} {w.proc.describe_exit(code)}")

    def _last_words(self, w: Worker) -> messages.Failed | None:
        """The Failed message a dead worker sent about itself, if it is still unread."""
        try:
            while w.wire is not None and (data := w.wire.recv(1 << 20, socket.MSG_DONTWAIT)) != b"":
                if data is not None:
                    w.reader.feed(data)
        except OSError:
            pass
        try:
            while (frame := w.reader.next_frame()) is not None:
                m = messages.decode(frame[1])
                if isinstance(m, messages.Failed) and m.task == w.task:
                    return m
        except ProtocolError:
            pass  # its last words are garbled: fall back to the exit status
        return None

    def root_cause(self, exclude: str, suspect: str | None) -> None:
        """Its own Failed message (a user exception) wins over a bare exit status."""
        candidates = [w for w in self.workers.values() if w.task != exclude and w.task not in self.committed
                      and (suspect is None or w.task == suspect)]
        deadline = time.monotonic() + 2.0
        dead: list[tuple[Worker, int]] = []
        while not dead and time.monotonic() < deadline:
            dead = [(w, c) for w in candidates if (c := w.proc.poll()) is not None and c != 0]
            if not dead:
                time.sleep(0.005)  # reaping a process that is dying; bounded by the deadline
        for w, code in dead:
            raise self._failure_of(w, code)

    def live_pids(self) -> dict[str, int]:
        return {t: pid for t, w in self.workers.items()
                if w.proc.poll() is None and (pid := w.proc.pid or w.hello_pid) is not None}

    def finish(self) -> None:
        self.launcher.wait_exit({t: w.proc for t, w in self.workers.items()}, timeout=30.0)  # exit after Committed

    def close(self) -> None:
        if self.sel is not None:
            self.sel.close()
            self.sel = None
        self.launcher.stop({t: w.proc for t, w in self.workers.items()}, timeout=10.0)
        for w in self.workers.values():
            if w.sock is not None:
                w.sock.close()


def _await_exit(proc: WorkerProcess, timeout: float) -> None:
    """Give a worker whose connection closed a moment to exit, so its status explains why
    (polling the launcher; bounded by ``timeout``)."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
