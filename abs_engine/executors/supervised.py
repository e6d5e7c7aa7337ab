"""A supervised driver: ``python -m abs_engine.executors.supervised RESULT_FD``, started by
its supervisor (executors/supervisor.py) with the job on stdin (an 8-byte length, then the
cloudpickled dataflow and options: the user's code, from the user's own process). It runs
the job, adopting the checkpoint directory's lock its supervisor holds, and writes its last
word on RESULT_FD: ``R`` and the result as msgpack, or ``E`` and the error's message. A
driver that dies writes nothing, and the supervisor restarts it."""

from __future__ import annotations

import os
import sys

import traceback

from .. import codec
from ..errors import AbsEngineError
from . import result_data
from .supervisor import ERROR, RESULT

MAX_JOB = 1 << 30  #: bytes of a cloudpickled job read at most


def main(argv: list[str]) -> int:
    import cloudpickle

    out = os.fdopen(int(argv[0]), "wb")
    size = int.from_bytes(sys.stdin.buffer.read(8), "big")
    if not 0 < size <= MAX_JOB:
        raise SystemExit("abs-engine supervised driver: no job on stdin (it is started by a supervisor)")
    flow, config = cloudpickle.loads(sys.stdin.buffer.read(size))
    from .master import run_job

    try:
        result = run_job(flow, config)
    except Exception as e:  # noqa: BLE001 - the job ended with it: said, not restarted
        if not isinstance(e, AbsEngineError):  # a bug's traceback, for the console
            traceback.print_exc()
        out.write(ERROR + codec.pack(result_data.error_to_data(e)))
        out.close()
        return 1
    out.write(RESULT + result_data.encode(result))
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
