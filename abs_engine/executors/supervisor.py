"""Driver high availability: ``run(supervise=True)`` (``abs-engine run --supervise``).

The calling process becomes the job's supervisor and the driver runs in a process of its
own (executors/supervised.py), handed the dataflow and its options as cloudpickled code on
a pipe only the supervisor holds. When the driver crashes (killed, out of memory: it dies
without a word) the supervisor starts another, which resumes from the newest completed
checkpoint, at most ``driver_restarts`` times; then it gives up with a JobFailed that says
so and where the checkpoints are.

Invariants:
- Two drivers never run on one checkpoint directory: the supervisor takes the directory's
  lock before the first driver starts and holds it until the job has ended; each driver
  adopts it (an inherited descriptor, checkpoint/lock.py) rather than taking it, so no
  other job can take the directory between a crash and the restart.
- What a driver says is data: its result comes back as msgpack (result_data.py), its
  failure as a message; a driver that ended by itself (finished, failed, cancelled,
  interrupted) is never restarted, only one that died.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time

from .. import codec
from ..checkpoint.lock import INHERITED_ENV, DirectoryLock
from ..checkpoint.remote import control_dir
from ..errors import ConfigError, JobFailed
from .config import JobConfig
from .job_storage import open_job_storage
from .result import JobResult
from . import result_data

#: A driver's last word on its result pipe: its result, or the error that ended the job.
RESULT, ERROR = b"R", b"E"


def supervise(flow: object, config: JobConfig, compiled_job: str) -> JobResult:
    """Run ``flow`` under a supervisor (see the module docstring); ``compiled_job`` is its
    name (the flow compiled in this process first: a bad graph fails here, at once)."""
    import cloudpickle

    if config.spark is not None:
        raise ConfigError("spark", "supervise=True runs the driver in a process of its own, which cannot be handed "
                                   "a SparkSession: leave spark unset (the driver starts the embedded session)")
    storage, location, _ = open_job_storage(config)
    lock = DirectoryLock(control_dir(location), compiled_job).acquire()
    try:
        crashes: list[str] = []
        run = dataclasses.replace(config, supervise=False)
        while True:
            payload = cloudpickle.dumps((flow, run))  # the user's code and options, to our own child
            word, how = _drive(payload, lock.fileno())
            if word[:1] == RESULT:
                return result_data.decode(word[1:])
            if word[:1] == ERROR:
                raise result_data.error_from_data(codec.unpack(word[1:]))
            crashes.append(how)
            if len(crashes) > config.driver_restarts:
                raise JobFailed(
                    f"the driver crashed {len(crashes)} times ({'; '.join(crashes)}): the supervisor gave up "
                    f"(driver_restarts={config.driver_restarts}). The checkpoints in {storage.shown} are intact: "
                    "fix the cause, then run again with resume=True (--resume)")
            _say(compiled_job, f"the driver {how}; restarting it ({len(crashes)} of {config.driver_restarts}) "
                               "from the latest checkpoint")
            if storage.completed_ids():  # from now on: the newest checkpoint, not the savepoint it began from
                run = dataclasses.replace(run, resume=True, restore_from=None)
            time.sleep(config.restart_delay)
    finally:
        lock.release()


def _drive(payload: bytes, lock_fd: int) -> tuple[bytes, str]:
    """One driver's life: its last word (empty if it died without one) and how it ended."""
    result_r, result_w = os.pipe()
    env = dict(os.environ, **{INHERITED_ENV: str(lock_fd)})
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "abs_engine.executors.supervised", str(result_w)],
                                stdin=subprocess.PIPE, pass_fds=(result_w, lock_fd), env=env)
    finally:
        os.close(result_w)
    try:
        with os.fdopen(result_r, "rb") as words:
            assert proc.stdin is not None
            try:
                proc.stdin.write(len(payload).to_bytes(8, "big") + payload)
                proc.stdin.close()
            except OSError:
                pass  # it died at once: its exit status says how
            try:
                word = words.read(result_data.MAX_RESULT + 1)
            except KeyboardInterrupt:
                # Ctrl-C on a terminal reaches the driver too: it stops the job (a
                # savepoint first, by default) and says how it ended.
                word = words.read(result_data.MAX_RESULT + 1)
        code = proc.wait()
    finally:
        if proc.poll() is None:  # the supervisor is leaving (a second Ctrl-C): its driver with it,
            proc.kill()          # before the lock they share is released
            proc.wait()
    return word, f"was killed by signal {-code}" if code < 0 else f"exited with status {code} without a result"


def _say(job: str, msg: str) -> None:
    print(f"[{job}] supervisor: {msg}", file=sys.stderr, flush=True)
