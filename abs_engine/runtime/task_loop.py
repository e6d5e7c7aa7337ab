"""The task over sockets: the run loops of a worker process (runtime/worker_run.py).

``ProcessTask`` is the protocol of runtime/task.py driven by a selector over its input
channels and control connection. Everything it decides about frames, barriers, snapshots
and control messages is the base class's (the code the simulation runs too); what is here
is when to read which socket.

Invariants:
- Back-edge inputs are always *read*, even while the task is blocked sending or a back-edge
  is held: a loop of bounded channels cannot deadlock. What is read and not processed yet
  is held in memory up to ``loop_memory`` (each back-edge its share, behind a reader of
  1 MiB), then spills to disk and is read back in order (runtime/overflow.py).
- An input's frames are processed ``TURN`` seconds at a time, then the other inputs and the
  control connection get a turn: a back-edge that never runs dry starves nothing.
- An input blocked by an alignment is not read from its socket (``_park``): its producer
  is back-pressured, as ABS intends.
"""

from __future__ import annotations

import selectors
import socket
from typing import Any

from .. import messages
from .channel import RECV_SIZE, InputChannel
from .task import Task

PROGRESS_EVERY = 0.5  # seconds between progress reports of a source
#: While frames keep a task busy, how often it looks at its control connection (a trigger
#: of an unaligned checkpoint), reads ahead the inputs a log waits on, and checks the
#: aligned timeout: the reaction time of an unaligned checkpoint, short of one batch.
SERVICE_EVERY = 0.005
#: Seconds one input's frames are processed before the other inputs, the sockets and the
#: control connection get a turn. An input that never runs dry (a back-edge whose backlog
#: is larger than the loop can hold: it spills) would otherwise starve them: no barrier on
#: a regular input, no trigger, would be read, and no checkpoint would complete.
TURN = 0.05


def _sock(ch: InputChannel | Any) -> socket.socket:
    sock = ch.sock
    assert sock is not None, "a process task's channels are sockets"
    return sock


class ProcessTask(Task):
    """A task in a worker process: its loops select over sockets."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sel: selectors.BaseSelector | None = None
        if self.back:
            for out in self.outputs:
                for ch in out.channels:
                    ch.while_blocked = self._drain_back_edges

    def _park(self, ch: InputChannel) -> None:
        if self._sel is not None:
            try:
                self._sel.unregister(_sock(ch))
            except KeyError:
                pass  # already unregistered (blocked, or ended)

    def _unpark(self, ch: InputChannel) -> None:
        if self._sel is not None:
            self._sel.register(_sock(ch), selectors.EVENT_READ, ch)

    def run(self) -> None:
        self.start()
        if self.source is not None:
            self._run_source()
        else:
            self._run_inputs()
        if self.await_shutdown:
            self._await_shutdown()

    def _run_source(self) -> None:
        control, clock = self.control, self.clock
        last_progress = clock.monotonic()
        while not self.stop:
            if self.finished or self.paused:
                self.on_control(control.receive())
                continue
            for msg in control.poll():
                self.on_control(msg)
            if self.stop:
                break
            self.read_source()
            now = clock.monotonic()
            if now - last_progress >= PROGRESS_EVERY:
                last_progress = now
                control.send(messages.Progress(self.spec.id, self.records_in, self.records_out))

    def _run_inputs(self) -> None:
        sel = self._sel = selectors.DefaultSelector()
        control, clock = self.control, self.clock
        sel.register(_sock(control), selectors.EVENT_READ, None)
        for ch in self.inputs.values():
            if not ch.ended:
                sel.register(_sock(ch), selectors.EVENT_READ, ch)
        runnable = self.runnable
        runnable.extend(ch for ch in self.inputs.values() if ch.has_frames())
        backlog = self.backlog
        next_service = clock.monotonic() + SERVICE_EVERY

        while not self.stop:
            turn_ends = clock.monotonic() + TURN
            while runnable and not self.stop:
                ch = runnable.popleft()
                while self.take(ch):
                    now = clock.monotonic()
                    if (self.responsive or backlog.logging) and now >= next_service:
                        self.flush()
                        self.service()
                        next_service = clock.monotonic() + SERVICE_EVERY
                    if now >= turn_ends:
                        runnable.append(ch)  # more later, after the others' and the sockets' turn
                        break
                if clock.monotonic() >= turn_ends:
                    break
            self.flush()
            if self.stop:
                break
            self.check_aligned_timeout()
            timeout = None
            deadline = self.alignment_deadline()
            if deadline is not None:
                timeout = max(0.0, deadline - clock.perf_counter())
            if not self.finished:
                self.fire_timers()
                due = self.timer_due()
                if due is not None:
                    wait = max(0.0, due - clock.time())
                    timeout = wait if timeout is None else min(timeout, wait)
            if runnable:
                timeout = 0.0  # a turn ended with frames left: only a look at the sockets
            for key, _ in sel.select(timeout):
                if key.data is None:
                    for msg in control.poll():  # non-blocking, like the channels' reads
                        self.on_control(msg)
                else:
                    ch = key.data
                    if ch in runnable:
                        # Its turn ended with frames left: reading more now would only move
                        # its backlog from the kernel's buffers into ours (no backpressure).
                        continue
                    # Not a blocking read: a read-ahead for an earlier event of this batch
                    # (a trigger on the control connection) may have taken these bytes.
                    ch.fill_nowait(RECV_SIZE)
                    self.on_input_readable(ch)
                    runnable.append(ch)
        sel.close()
        self._sel = None

    def _drain_back_edges(self, out_sock: socket.socket) -> None:
        """A send would block: wait until ``out_sock`` is writable, reading the back-edges
        meanwhile (their frames are processed later, in order): into their readers up to
        their share of ``loop_memory``, then into their spills (InputChannel.fill_nowait)."""
        sel = selectors.DefaultSelector()
        try:
            sel.register(out_sock, selectors.EVENT_WRITE, None)
            for c in self.back:
                if not c.ended:
                    sel.register(_sock(c), selectors.EVENT_READ, c)
            for key, _ in sel.select():
                if key.data is not None:
                    key.data.fill_nowait(RECV_SIZE)
                    self.runnable.append(key.data)
        finally:
            sel.close()

    def _await_shutdown(self) -> None:
        """Stopped with a savepoint: wait for Shutdown with every connection held open, and
        read and discard what still arrives on the inputs. A producer may be blocked sending
        to this task (backpressure) with its own stop notification unread behind that send:
        if this task stopped reading, that producer would never commit and the job would
        never stop. Everything unread here came after the savepoint's barrier (savepoints are
        aligned, and this task acknowledged it), so a job started from the savepoint reads
        it again: discarding it loses nothing."""
        with selectors.DefaultSelector() as sel:
            sel.register(_sock(self.control), selectors.EVENT_READ, None)
            for ch in self.inputs.values():
                if not ch.ended:
                    sel.register(_sock(ch), selectors.EVENT_READ, ch)
            while True:
                if any(isinstance(m, messages.Shutdown) for m in self.control.poll()):
                    return
                for key, _ in sel.select(timeout=1.0):
                    if key.data is not None:
                        try:
                            _, closed = key.data.wire.read_nowait(RECV_SIZE, 8 * RECV_SIZE)
                        except OSError:
                            closed = True
                        if closed:  # its producer exited (it was told to go first)
                            sel.unregister(key.fileobj)
