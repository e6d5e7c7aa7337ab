"""Testing kit for users' tests and ours (in the spirit of bytewax.testing).

- ``TestingSource(items)``: a replayable in-memory source; offsets are list indices.
  Put ``TestingSource.ABORT`` in the list to crash the worker (SIGKILL of itself; under
  ``executor="inprocess"`` a ``SimulatedCrash``) the first time that point is reached, in
  the job's first attempt.
- ``GatedSource(inner, gate, after)``: ``inner``'s records, but each subtask holds (reads
  nothing, still takes checkpoints) after ``after`` records until the file ``gate`` exists
  (a local path, or a URI on a store every worker reaches, ``s3://...``, for workers on
  hosts that share no disk): a job a test stops half-way (``stop_when``) can never finish
  first, whatever its speed.
- ``CapturingSink(directory)``: an exactly-once sink (two-phase commit, like FileSink)
  whose committed records you read back with ``records()``.
- ``fail_at(n, kind)``: a map function that raises (or crashes its own worker, as
  ``crash()`` does) at the n-th record it sees in the first attempt; after recovery it
  lets records through.
- ``KillOnCheckpoints(after, seed)``: the driver SIGKILLs a seeded-random live worker right
  after the n-th completed checkpoints (n in ``after``), so each kill is followed by a
  restore from a checkpoint. Pass as ``chaos=`` to ``run``; tests prefer it.
- ``RandomKills(times, seed)``: the driver SIGKILLs a random live worker at each of the
  given moments (seconds after the job started). Pass as ``chaos=`` to ``run``.
"""

from __future__ import annotations

import os
import random
import signal
import time
from typing import Any, Callable, Generic, Iterable, TypeVar

from operators.base import OperatorContext, Source, WrappingSource
from operators.files import FileSink
from operators.generators import Progressions
from operators.progress import SourceProgress

from . import codec

T = TypeVar("T")


class _Abort:
    """The marker ``TestingSource.ABORT``: one instance per process, also after (cloud)pickle
    ships a TestingSource to a worker (unpickling yields that process's marker)."""

    def __repr__(self) -> str:
        return "TestingSource.ABORT"

    def __reduce__(self) -> tuple[Callable[[], "_Abort"], tuple[()]]:
        return _the_abort, ()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Abort)

    def __hash__(self) -> int:
        return hash(_Abort)


def _the_abort() -> _Abort:
    return TestingSource.ABORT


class TestingSource(Source[T]):
    """The records of ``items``, replayable (offsets are list indices); subtask i of p reads
    items i, i+p, i+2p, ..., up to ``batch_size`` per batch. ``ABORT`` in the list kills
    the reading worker in the first attempt (and is never emitted)."""

    __test__ = False  # not a pytest test class
    ABORT = _Abort()

    def __init__(self, items: Iterable[T], batch_size: int = 100):
        self.items: list[Any] = list(items)
        self.batch_size = batch_size

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        # Subtask i of p owns items i, i+p, i+2p, ...; its offset is what it has left of them.
        self.todo = Progressions.of_subtask(len(self.items), ctx.subtask_index, ctx.parallelism)

    def read_batch(self) -> list[T] | None:
        r = self.todo.take(self.batch_size)
        if r is None:
            return None
        batch = [self.items[i] for i in r]
        if any(isinstance(item, _Abort) for item in batch):
            if self.ctx.attempt == 0:
                crash()
            batch = [item for item in batch if not isinstance(item, _Abort)]
        return batch

    def snapshot(self, checkpoint_id: int) -> Any:
        return self.todo.state()

    def restore(self, state: Any) -> None:
        p, i = self.ctx.parallelism, self.ctx.subtask_index
        if isinstance(state, int):  # older checkpoints: how many of its own items it had read
            state = i + state * p
        self.todo = Progressions.from_state(len(self.items), state, p, i)

    def rescale_state(self, old: list[Any], index: int, parallelism: int, owns: Any) -> Any:
        p_old = len(old)
        absolute = [k + s * p_old if isinstance(s, int) else s for k, s in enumerate(old)]
        return Progressions.rescale(len(self.items), absolute, p_old, index, parallelism)

    def progress(self) -> SourceProgress:
        return self.todo.progress()


class GatedSource(WrappingSource[T], Generic[T]):
    """``inner``'s records; each subtask holds after ``after`` of them until ``gate`` exists:
    it reads nothing meanwhile, but answers triggers, so checkpoints go on. ``gate`` is a
    file path, or a URI (``abs_engine.fs``: ``s3://bucket/dir/gate``) polled every 50 ms.
    The offsets are ``inner``'s (a rescale uses its rule); open the gate before a run that
    must read to the end."""

    __test__ = False  # not a pytest test class

    def __init__(self, inner: Source[T], gate: str | os.PathLike[str], after: int):
        from . import fs

        super().__init__(inner)
        self.gate, self.after = os.fspath(gate), after
        self._where = fs.split(self.gate)  # (a URI that names no object fails here, not in a worker)
        self._remote = fs.is_remote(self.gate)
        self.read = 0
        self._open = False  #: the gate was seen open (it is never closed again)
        self._store: Any = None  #: the gate's directory on a store (made at the first poll)

    def _gate_open(self) -> bool:
        from . import fs

        if not self._remote:
            return os.path.exists(fs.local_path(self.gate))
        head, name = self._where
        try:
            if self._store is None:
                self._store = fs.Store(head)
            return bool(self._store.exists(name))
        except fs.StoreError:  # the store unreachable for now: still closed, asked again
            return False

    def read_batch(self) -> list[T] | None:
        if self.read >= self.after and not self._open:
            self._open = self._gate_open()
            if not self._open:
                # an idle source polls (as Endless sources do); not synchronisation
                time.sleep(0.05 if self._remote else 0.005)
                return []
        batch = self.inner.read_batch()
        self.read += len(batch or ())
        return batch

    def snapshot(self, checkpoint_id: int) -> Any:
        return {"inner": self.inner.snapshot(checkpoint_id), "read": self.read}

    def restore(self, state: Any) -> None:
        self.inner.restore(state["inner"])
        self.read = int(state["read"])

    def rescale_state(self, old: list[Any], index: int, parallelism: int, owns: Any) -> Any:
        inner = self.inner.rescale_state([s["inner"] if s else None for s in old], index, parallelism, owns)
        return {"inner": inner, "read": max((int(s["read"]) for s in old if s), default=0)}


class PacedSource(WrappingSource[T], Generic[T]):
    """``inner``'s batches, one per checkpoint: after a batch each subtask reads nothing until
    a checkpoint has snapshotted it (it answers triggers meanwhile), so every epoch holds
    exactly one batch, however fast the job runs. For tests that need many epochs."""

    __test__ = False

    def __init__(self, inner: Source[T]):
        super().__init__(inner)
        self.waiting = False

    def read_batch(self) -> list[T] | None:
        if self.waiting:
            time.sleep(0.001)  # an idle source polls (as GatedSource does); not synchronisation
            return []
        batch = self.inner.read_batch()
        self.waiting = bool(batch)
        return batch

    def snapshot(self, checkpoint_id: int) -> Any:
        self.waiting = False
        return self.inner.snapshot(checkpoint_id)

    def restore(self, state: Any) -> None:
        self.inner.restore(state)
        self.waiting = False

    def rescale_state(self, old: list[Any], index: int, parallelism: int, owns: Any) -> Any:
        return self.inner.rescale_state(old, index, parallelism, owns)


def _msgpack_line(record: Any) -> str:
    return codec.pack(record).hex()


class CapturingSink(FileSink):
    """Commits records exactly once into ``directory``; ``records()`` reads them back."""

    def __init__(self, directory: str | os.PathLike[str]):
        directory = os.fspath(directory)
        os.makedirs(directory, exist_ok=True)
        super().__init__(os.path.join(directory, "captured"), format=_msgpack_line, directory=True)

    def records(self) -> list[Any]:
        """Every committed record, read back from the directory (call it after the run)."""
        out: list[Any] = []
        base = self.path
        if not os.path.isdir(base):
            return out
        for name in sorted(os.listdir(base)):
            with open(os.path.join(base, name)) as f:
                out += [codec.unpack(bytes.fromhex(line)) for line in f.read().splitlines()]
        return out


def fail_at(n: int, kind: str = "raise", attempts: tuple[int, ...] = (0,)) -> Callable[[Any], Any]:
    """A map function (use with ``.map(...)``) that fails at its ``n``-th record (1-based)
    in the attempts numbered in ``attempts`` (default: the first only): ``kind="raise"``
    raises RuntimeError, ``kind="kill"`` SIGKILLs the worker process it runs in (as
    ``crash()``). Counting is per subtask and restarts with the process."""
    if kind not in ("raise", "kill"):
        raise ValueError("kind must be 'raise' or 'kill'")
    seen = 0

    def check(record: Any) -> Any:
        nonlocal seen
        seen += 1
        if seen == n and _current_attempt() in attempts:
            if kind == "kill":
                crash()
            raise RuntimeError(f"injected failure at record {n}: {record!r}")
        return record

    check.__name__ = f"fail_at_{n}"
    return check


def _current_attempt() -> int:
    return int(os.environ.get("ABS_ENGINE_ATTEMPT", "0"))


class SimulatedCrash(Exception):
    """What ``crash()`` raises under the in-process executor, which has no worker process
    to kill: the attempt fails as if its worker had died, and the job restarts."""


def crash() -> None:
    """End this worker as a SIGKILL does: in a worker process, SIGKILL itself; under the
    in-process executor (ABS_ENGINE_INPROCESS set while it runs: killing the process would
    kill the user's program), raise SimulatedCrash."""
    if os.environ.get("ABS_ENGINE_INPROCESS"):
        raise SimulatedCrash("a simulated worker crash (TestingSource.ABORT or fail_at(kind='kill'))")
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_one(rng: random.Random, pids: dict[str, int]) -> str | None:
    """SIGKILL a worker picked by ``rng``; the task killed, or None if it was already gone."""
    task = rng.choice(sorted(pids))
    try:
        os.kill(pids[task], signal.SIGKILL)
    except ProcessLookupError:
        return None
    return task


class RandomKills:
    """SIGKILL a random live worker at each moment in ``times`` (seconds after job start),
    picked by a random generator seeded with ``seed``. Pass as ``chaos=`` to ``run``."""

    def __init__(self, times: Iterable[float], seed: int = 0):
        self.times = sorted(times)
        self.rng = random.Random(seed)
        self.killed: list[str] = []

    @classmethod
    def uniform(cls, count: int, within: float, seed: int = 0, start: float = 0.0) -> "RandomKills":
        rng = random.Random(seed)
        return cls([rng.uniform(start, within) for _ in range(count)], seed)

    def next_due(self) -> float | None:
        return self.times[0] if self.times else None

    def poll(self, elapsed: float, pids: dict[str, int]) -> str | None:
        """Kill one worker if a moment has come; returns the task killed."""
        if not self.times or elapsed < self.times[0] or not pids:
            return None
        self.times.pop(0)
        task = _kill_one(self.rng, pids)
        if task is not None:
            self.killed.append(task)
        return task


class KillOnCheckpoints:
    """SIGKILL a live worker, picked by a random generator seeded with ``seed``, right after
    the checkpoint completions numbered in ``after`` (1-based, counting every completion
    this object sees, across attempts).

    Pass as ``chaos=`` to ``run``. A kill right after checkpoint n completes is certain to be
    followed by a restore from a checkpoint (n itself, unless it fails verification), unlike
    a kill at a wall-clock moment, which may fall before the first checkpoint. ``killed``
    lists the tasks killed and ``killed_after`` the ids of the checkpoints they followed.
    A kill after the job's *final* checkpoint may find no worker left to kill; choose
    completions the job reaches before its end (it also needs that many completions).

    ``open_gate``: a file this creates once it has made every kill, the gate of a
    ``GatedSource`` that holds the input meanwhile: the job cannot end before the kills,
    however fast it runs."""

    def __init__(self, after: Iterable[int], seed: int = 0, open_gate: str | os.PathLike[str] | None = None):
        self.open_gate = os.fspath(open_gate) if open_gate is not None else None
        self.after = sorted(set(after))
        if any(n < 1 for n in self.after):
            raise ValueError("after counts checkpoint completions from 1")
        self.rng = random.Random(seed)
        self.seen = 0
        self.killed: list[str] = []
        self.killed_after: list[int] = []

    def poll(self, elapsed: float, pids: dict[str, int]) -> None:
        """Nothing happens at wall-clock moments (the executor calls this every loop)."""
        return None

    def on_checkpoint(self, checkpoint_id: int, pids: dict[str, int]) -> str | None:
        """Called by the executor after each completed checkpoint; returns the task killed."""
        killed = self._on_checkpoint(checkpoint_id, pids)
        if self.open_gate is not None and len(self.killed) == len(self.after):
            open(self.open_gate, "a").close()
        return killed

    def _on_checkpoint(self, checkpoint_id: int, pids: dict[str, int]) -> str | None:
        self.seen += 1
        if self.seen not in self.after or not pids:
            return None
        task = self.kill(pids)
        if task is None:
            return None
        self.killed.append(task)
        self.killed_after.append(checkpoint_id)
        return task

    def kill(self, pids: dict[str, int]) -> str | None:
        """The kill itself: a seeded-random live worker (override to kill something else)."""
        return _kill_one(self.rng, pids)


def write_zipf_corpus(path: str | os.PathLike[str], words: int, vocabulary: int = 10_000,
                      seed: int = 0, words_per_line: int = 12) -> str:
    """Write a text file at ``path`` (returned) of ``words`` words drawn from a Zipf(1)
    law over ``vocabulary`` distinct words, ``words_per_line`` to a line. The same
    ``seed`` writes the same file."""
    import itertools

    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(vocabulary)]
    cum = list(itertools.accumulate(1.0 / (i + 1) for i in range(vocabulary)))
    path = os.fspath(path)
    with open(path, "w", encoding="utf-8") as f:
        left = words
        while left > 0:
            chunk = min(left, words_per_line * 1000)
            drawn = rng.choices(vocab, cum_weights=cum, k=chunk)
            f.write("\n".join(" ".join(drawn[i : i + words_per_line]) for i in range(0, chunk, words_per_line)))
            f.write("\n")
            left -= chunk
    return path


def fastest_run(run: Callable[[], Any], times: int = 2) -> float:
    """Seconds of the fastest of ``times`` calls of ``run()``, uninterrupted runs of a job
    (the first warms caches).

    Kill moments drawn inside a fraction of this window fall while a run with kills is
    still going (each restart only makes that run longer)."""
    import time as _time

    best = float("inf")
    for _ in range(times):
        t0 = _time.monotonic()
        run()
        best = min(best, _time.monotonic() - t0)
    return best
