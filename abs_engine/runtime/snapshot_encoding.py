"""Encoding a task's operator states for a snapshot, off the task thread when they are large.

A snapshot's consistent copy is taken as Redis's BGSAVE takes one: the task thread asks
every operator for its state (a reference, no copy), then forks; the child sees the
memory exactly as it was at the fork (copy-on-write), encodes it with msgpack and sends
the bytes to the parent on a pipe, while the parent forwards the barrier and goes on
processing. The task thread's share is one fork (a page-table copy), not an encoding
that grows with the state.

A fork is not free: the child's first pass copies every page whose reference counts it
touches, and the parent copies every page it writes while the child lives, so encoding by
fork costs about three times the CPU of encoding inline (benchmarks/results/
async_snapshots.md). It buys latency with a spare core. Modes: ``inline`` (never fork),
``fork`` (always), ``auto`` (the default): fork when the states hold at least
AUTO_MIN_ENTRIES entries *and* the machine has a core to spare (load average at least one
below the core count); otherwise encode inline.

Invariants:
- The encoded result is the msgpack map {operator name: packed state}, byte for byte what
  the inline path produces, so state files do not depend on the path taken.
- The child never returns into the worker's code: it closes every descriptor but its pipe
  at once (it can never write to a channel, the control link, a sink or the fence, and a
  dead parent's sockets close at once), takes no lock another thread may hold (msgpack
  only), writes ``b"O" + result`` or ``b"E" + [operator, reason]`` and ``os._exit``s. It is
  SIGKILLed if the parent dies (PR_SET_PDEATHSIG), so no orphan encodes for nobody.
- ``result()`` (on the writer thread) reads the pipe to its end and reaps the child; a
  child that died or sent anything else is a RuntimeError naming its exit, a state that
  msgpack cannot encode is OperatorFailure(fatal) from SerializationError, as inline.
"""

from __future__ import annotations

import ctypes
import os
import signal
from typing import Any, Protocol

import msgpack

from .. import codec
from ..checkpoint.incremental import PendingDelta
from ..errors import SerializationError
from .output import OperatorFailure

MODES = ("auto", "fork", "inline")
AUTO_MIN_ENTRIES = 100_000  #: below this, inline encoding takes under about 10 ms
_PR_SET_PDEATHSIG = 1
_OK, _ERR = b"O", b"E"
_ENCODE_ERRORS = (TypeError, ValueError, OverflowError)


class Encoding(Protocol):
    def result(self) -> bytes:
        """The packed {operator: packed state} map (blocks until it is ready)."""


class Inline:
    """Encoded on the task thread."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data

    def result(self) -> bytes:
        return self.data


def _pack_all(states: dict[str, Any]) -> bytes:
    """The packed map {name: packed state}; OperatorFailure(fatal) naming the operator
    whose state msgpack cannot encode."""
    packed: dict[str, bytes] = {}
    for name, state in states.items():
        if isinstance(state, PendingDelta):
            state = state.build()  # incremental: only the changed keys (here, or in the child)
        try:
            packed[name] = codec.pack(state)
        except _ENCODE_ERRORS as e:
            raise OperatorFailure(name, fatal=True) from SerializationError("the state", name, str(e))
    data: bytes = msgpack.packb(packed, use_bin_type=True)
    return data


class Forked:
    """Encoded by a forked child; ``result()`` collects it."""

    __slots__ = ("pid", "fd")

    def __init__(self, pid: int, fd: int):
        self.pid = pid
        self.fd = fd

    def result(self) -> bytes:
        chunks = []
        try:
            while chunk := os.read(self.fd, 1 << 20):
                chunks.append(chunk)
        finally:
            os.close(self.fd)
            _, status = os.waitpid(self.pid, 0)
        data = b"".join(chunks)
        if data[:1] == _OK and os.waitstatus_to_exitcode(status) == 0:
            return data[1:]
        if data[:1] == _ERR:
            name, reason = msgpack.unpackb(data[1:], raw=False)
            raise OperatorFailure(name, fatal=True) from SerializationError("the state", name, reason)
        raise RuntimeError(f"the snapshot encoder (pid {self.pid}) ended with exit status "
                           f"{os.waitstatus_to_exitcode(status)} without a result")


def _in_child(states: dict[str, Any], w: int, parent: int) -> None:
    """The child's whole life: never returns."""
    code = 0
    try:
        try:
            ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
        if os.getppid() != parent:
            os._exit(1)  # the parent died before the death signal was armed
        os.closerange(3, w)
        os.closerange(w + 1, 1 << 20)
        try:
            out = _OK + _pack_all(states)
        except OperatorFailure as e:
            out = _ERR + msgpack.packb([e.operator, str(e.__cause__)], use_bin_type=True)
        view = memoryview(out)
        while view:
            view = view[os.write(w, view):]
    except BaseException:  # noqa: BLE001 - whatever happens, the child must not live on
        code = 1
    finally:
        os._exit(code)


def entry_count(state: Any) -> int:
    """How many entries a state holds, for the choice of fork or inline (1 if it has no length)."""
    try:
        return len(state)
    except TypeError:
        return 1


def _spare_core() -> bool:
    try:
        return os.getloadavg()[0] + 1 <= (os.cpu_count() or 1)
    except OSError:
        return False


def start(states: dict[str, Any], mode: str = "auto", entries: int | None = None) -> Encoding:
    """Begin encoding ``states`` (operator -> state as returned by ``snapshot``), in a
    forked child or inline as ``mode`` says (see the module docstring; ``entries``: how
    many the states hold, if the caller knows better than their lengths). Raises
    OperatorFailure(fatal) at once for an inline state msgpack cannot encode; a forked one
    fails in ``result()``."""
    if entries is None:
        entries = sum(entry_count(s) for s in states.values())
    fork = mode == "fork" or (mode == "auto" and entries >= AUTO_MIN_ENTRIES and _spare_core())
    if not fork:
        return Inline(_pack_all(states))
    r, w = os.pipe()
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return Inline(_pack_all(states))  # no memory for a fork: encode here instead
    if pid == 0:
        os.close(r)
        _in_child(states, w, parent)
    os.close(w)
    return Forked(pid, r)
