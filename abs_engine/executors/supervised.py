"""A supervised driver: ``python -m abs_engine.executors.supervised RESULT_FD``, started by
its supervisor (executors/supervisor.py) with the job on stdin (an 8-byte length, then the
cloudpickled dataflow and options: the user's code, from the user's own process). It runs
the job, adopting the checkpoint directory's lock its supervisor holds, and writes its last
word on RESULT_FD: ``R`` and the result as msgpack, or ``E`` and the error (result_data.py).
A driver that dies writes nothing, and the supervisor restarts it."""

from __future__ import annotations

import os
import sys
import traceback
from typing import BinaryIO

from .. import codec
from ..checkpoint.lock import INHERITED_ENV
from ..errors import AbsEngineError, JobInterrupted
from . import result_data
from .supervisor import ERROR, RESULT

MAX_JOB = 1 << 30  #: bytes of a cloudpickled job read at most


def main(argv: list[str]) -> int:
    # What the job's own code starts must hold neither the result pipe (the supervisor
    # would wait on it) nor the lock (it would outlive the job).
    out_fd = int(argv[0])
    os.set_inheritable(out_fd, False)
    if os.environ.get(INHERITED_ENV, "").isdigit():
        os.set_inheritable(int(os.environ[INHERITED_ENV]), False)
    out = os.fdopen(out_fd, "wb")
    try:
        size = int.from_bytes(sys.stdin.buffer.read(8), "big")
        if not 0 < size <= MAX_JOB:
            raise SystemExit("abs-engine supervised driver: no job on stdin (it is started by a supervisor)")
        import cloudpickle

        flow, config = cloudpickle.loads(sys.stdin.buffer.read(size))
        from .run import run_job

        result = run_job(flow, config)
    except KeyboardInterrupt:  # passed on by the supervisor before the job could take it
        return _said(out, JobInterrupted("the supervised driver was interrupted before its job started", None))
    except Exception as e:  # noqa: BLE001 - the job ended with it: said, not restarted
        if not isinstance(e, AbsEngineError):
            traceback.print_exc()  # a bug's traceback, for the console
        return _said(out, e)
    out.write(RESULT + result_data.encode(result))
    out.close()
    return 0


def _said(out: BinaryIO, e: BaseException) -> int:
    out.write(ERROR + codec.pack(result_data.error_to_data(e)))
    out.close()
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
