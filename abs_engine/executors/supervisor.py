"""Driver high availability: ``run(supervise=True)`` (``abs-engine run --supervise``).

The calling process becomes the job's supervisor and the driver runs in a process of its
own (executors/supervised.py), handed the dataflow and its options as cloudpickled code on
a pipe only the supervisor holds. When the driver crashes (it dies by a signal: SIGKILL,
the out-of-memory killer) the supervisor starts another, which resumes from the newest
completed checkpoint, at most ``driver_restarts`` times; then it gives up with a JobFailed
that says how each ended and where the checkpoints are.

Invariants:
- Two drivers never run on one checkpoint directory: the supervisor takes the directory's
  lock before the first driver starts and holds it until the job has ended; each driver
  adopts it (an inherited descriptor, checkpoint/lock.py) rather than taking it, so no
  other job can take the directory between a crash and the restart; and the supervisor
  never releases it while a driver of its own may run (it kills it first).
- Only a death by a signal the supervisor did not pass on is a crash. A driver that ends
  by itself (finished, failed, cancelled, interrupted, or exited without a word: a bug)
  is never restarted; its result or its error comes back as data (result_data.py).
- The driver runs in a session of its own: a terminal's Ctrl-C, SIGTERM and SIGUSR2 reach
  the supervisor, which passes them on (the driver takes a savepoint and stops, or stops
  at once on a second one, as an unsupervised one does) and restarts nothing after.
"""

from __future__ import annotations

import dataclasses
import os
import select
import signal
import subprocess
import sys
import threading
import time
from types import FrameType
from typing import Any

from .. import codec
from ..checkpoint.lock import INHERITED_ENV, DirectoryLock
from ..checkpoint.remote import control_dir
from ..errors import ConfigError, JobFailed, JobInterrupted
from . import result_data
from .config import JobConfig
from .job_storage import any_checkpoints, open_job_storage
from .result import JobResult

#: A driver's last word on its result pipe: its result, or the error that ended the job.
RESULT, ERROR = b"R", b"E"
PASSED_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)


def supervise(flow: object, config: JobConfig, compiled_job: str) -> JobResult:
    """Run ``flow`` under a supervisor (see the module docstring); ``compiled_job`` is its
    name (the flow compiled in this process first: a bad graph fails here, at once)."""
    import cloudpickle

    if config.spark is not None:
        raise ConfigError("spark", "supervise=True runs the driver in a process of its own, which cannot be handed "
                                   "a SparkSession: leave spark unset (the driver starts the embedded session)")
    run = dataclasses.replace(config, supervise=False)
    try:
        payload = cloudpickle.dumps((flow, run))  # the user's code and options, to our own child
    except Exception as e:  # noqa: BLE001 - whatever the pickler refuses, named
        raise ConfigError("supervise", f"supervise=True hands the job to a driver process, and it cannot be "
                                       f"pickled: {type(e).__name__}: {e}. Options such as stop_when must not hold "
                                       "locks, open files or sockets") from e
    storage, location, _ = open_job_storage(config)
    lock = DirectoryLock(control_dir(location), compiled_job).acquire()
    try:
        crashes: list[str] = []
        while True:
            driver = _Driver(payload, lock.fileno())
            word, code = driver.run()
            lock.restamp()  # the driver wrote its own pid there
            if code >= 0 or driver.passed_on:
                return _outcome(word, code, driver.passed_on, storage.shown, crashes)
            if word[:1] == RESULT:  # it said everything, then died: take its word
                return _outcome(word, 0, False, storage.shown, crashes)
            crashes.append(f"killed by signal {-code}")
            if len(crashes) > config.driver_restarts:
                where = (f"The checkpoints in {storage.shown} are intact: fix the cause, then run again with "
                         "resume=True (--resume)") if any_checkpoints(storage) else "No checkpoint had completed."
                raise JobFailed(f"the driver crashed {len(crashes)} times ({'; '.join(crashes)}): the supervisor "
                                f"gave up (driver_restarts={config.driver_restarts}). {where}")
            _say(compiled_job, f"the driver was killed by signal {-code}; restarting it ({len(crashes)} of "
                               f"{config.driver_restarts}) from the latest checkpoint")
            if any_checkpoints(storage):
                # From now on the newest checkpoint (the master still falls back to the
                # savepoint it began from if none of them verifies).
                payload = cloudpickle.dumps((flow, dataclasses.replace(run, resume=True)))
            time.sleep(config.restart_delay)
    finally:
        lock.release()


def _outcome(word: bytes, code: int, stopped: bool, where: str, crashes: list[str]) -> JobResult:
    """What a driver that ended by itself said, as the caller gets it."""
    try:
        if word[:1] == RESULT:
            result = result_data.decode(word[1:])
            result.driver_crashes = list(crashes)
            return result
        if word[:1] == ERROR:
            raise result_data.error_from_data(codec.unpack(word[1:]))
    except (ValueError, TypeError) as e:  # msgpack's errors are ValueErrors too
        raise JobFailed(f"the supervised driver's last word is unreadable ({e}); its checkpoints are in {where}") \
            from None
    if stopped:
        raise JobInterrupted(f"the supervised driver was stopped (it ended with status {code}) before it said how "
                             f"the job ended; resume it with resume=True (--resume)", where)
    raise JobFailed(f"the supervised driver exited with status {code} without saying how the job ended (see its "
                    f"output above): it is not restarted, as a crash would be")


class _Driver:
    """One driver's life: started, fed its job, read, and ended."""

    def __init__(self, payload: bytes, lock_fd: int):
        self.payload, self.lock_fd = payload, lock_fd
        self.passed_on = False  #: a stop signal was passed on to it: it ends by request, not a crash

    def run(self) -> tuple[bytes, int]:
        """Its last word (empty if none) and its exit status (negative: a signal)."""
        result_r, result_w = os.pipe()
        env = dict(os.environ, **{INHERITED_ENV: str(self.lock_fd)})
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        proc: subprocess.Popen[bytes] | None = None
        previous: dict[int, Any] = {}
        try:
            proc = subprocess.Popen([sys.executable, "-m", "abs_engine.executors.supervised", str(result_w)],
                                    stdin=subprocess.PIPE, pass_fds=(result_w, self.lock_fd), env=env,
                                    start_new_session=True)
            os.close(result_w)
            result_w = -1
            previous = self._pass_signals_to(proc)
            assert proc.stdin is not None
            try:
                proc.stdin.write(len(self.payload).to_bytes(8, "big") + self.payload)
                proc.stdin.close()
            except OSError:
                pass  # it died at once: its exit status says how
            word = _read_word(result_r, proc)
            return word, proc.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.close(result_r)
            if result_w >= 0:
                os.close(result_w)
            if proc is not None and proc.poll() is None:  # we are leaving (an error here): it goes first,
                proc.kill()                              # before the lock it shares is released
                proc.wait()

    def _pass_signals_to(self, proc: subprocess.Popen[bytes]) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}  # (signal handlers live on the main thread: a run() in another one gets none)

        def pass_on(sig: int, _frame: FrameType | None) -> None:
            self.passed_on = True
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                pass

        return {sig: signal.signal(sig, pass_on) for sig in PASSED_ON}


def _read_word(fd: int, proc: subprocess.Popen[bytes]) -> bytes:
    """Everything the driver writes on its result pipe until it closes it or exits (a
    process it started may hold the pipe open for ever: its exit ends the wait)."""
    word = bytearray()
    while True:
        ready = select.select([fd], [], [], 0.2)[0]
        if not ready:
            if proc.poll() is None:
                continue
            os.set_blocking(fd, False)  # it has exited: what it wrote is in the pipe already
            try:
                while chunk := os.read(fd, 1 << 16):
                    word += chunk
            except BlockingIOError:
                pass
            return bytes(word)
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return bytes(word)
        word += chunk
        if len(word) > result_data.MAX_RESULT:
            proc.kill()
            raise JobFailed(f"the supervised driver wrote more than {result_data.MAX_RESULT} bytes of result")


def _say(job: str, msg: str) -> None:
    print(f"[{job}] supervisor: {msg}", file=sys.stderr, flush=True)
