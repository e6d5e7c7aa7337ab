"""Worker process entry point:
``python -m abs_engine.runtime.worker HOST PORT TASK GENERATION [BIND_HOST]`` starts one
worker (the Spark executor's way); ``python -m abs_engine.runtime.worker --fork-server
EVENTS_FD HOST PORT GENERATION`` starts an attempt's fork server, which forks its workers
(the local launcher's way: runtime/fork_server.py). Either way this module is on the
process's command line, which the output fence looks for (checkpoint/fence.py).

HOST:PORT is the driver; BIND_HOST is the address of this worker's own machine, where its
data listener binds and which it publishes to its peers (default: HOST, when the driver
and the workers share a machine).

The attempt's secret arrives as one hex line on stdin (never on the command line, which
every local user can read). A second line, when the job has ``tls`` on, holds the
attempt's TLS material (tls.Material.encode: base64 of msgpack); an empty or missing
second line means no TLS. What a worker does is runtime/worker_run.py.
"""

from __future__ import annotations

import os
import sys

from ..tls import Material
from .worker_run import TLS_LINE_MAX, parse_secret, run_worker


def _read_secret() -> tuple[bytes, Material | None]:
    return parse_secret(sys.stdin.readline(256), sys.stdin.readline(TLS_LINE_MAX))


def main(argv: list[str] | None = None) -> int:
    args = (argv or sys.argv[1:])
    if args[:1] == ["--fork-server"]:
        from .fork_server import serve
        return serve(args[1:])
    host, port, task_id, generation = args[:4]
    bind_host = args[4] if len(args) > 4 else host
    secret, material = _read_secret()
    return run_worker(host, int(port), task_id, int(generation), bind_host, secret, material)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
