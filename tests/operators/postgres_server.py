"""A real PostgreSQL server for the tests: Debian's ``postgresql`` package, ``initdb`` in a
temporary directory as an unprivileged user (``postgres`` when the tests run as root), on a
free loopback port with ``wal_level=logical``, password authentication (scram) for one user;
stopped and removed after.

Skipped when no ``initdb`` is installed, unless ABS_ENGINE_REQUIRE_POSTGRES is set (CI
installs PostgreSQL and sets it, so there the tests cannot quietly not run).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import pytest

USER, PASSWORD = "abs", "s3cret-for-tests"


def find_bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    return found[-1] if found else shutil.which(name)


@dataclass
class Server:
    port: int
    directory: str

    def dsn(self, user: str = USER, password: str = PASSWORD, dbname: str = "postgres") -> str:
        return f"postgresql://{user}:{password}@127.0.0.1:{self.port}/{dbname}"

    def query(self, text: str, params: Any = None) -> list[tuple[Any, ...]]:
        """An independent reader: psycopg, not the sink's code."""
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            cur = conn.execute(text, params)
            return cur.fetchall() if cur.description else []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_user() -> tuple[Callable[[], None] | None, int | None, int | None]:
    if os.geteuid() != 0:
        return None, None, None
    pw = pwd.getpwnam("postgres")

    def drop() -> None:
        os.setgid(pw.pw_gid)
        os.setuid(pw.pw_uid)

    return drop, pw.pw_uid, pw.pw_gid


@contextlib.contextmanager
def running() -> Iterator[Server]:
    """A server for as long as the block runs (benchmarks/postgres_bench.py uses it too);
    RuntimeError if PostgreSQL is not installed or does not start."""
    initdb, binary = find_bin("initdb"), find_bin("postgres")
    if initdb is None or binary is None:
        raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql)")
    drop, uid, gid = _as_user()
    top = tempfile.mkdtemp(prefix="abs-pg-")
    data = os.path.join(top, "data")
    pwfile = os.path.join(top, "pw")
    with open(pwfile, "w") as f:
        f.write(PASSWORD + "\n")
    if uid is not None and gid is not None:
        os.chown(top, uid, gid)
        os.chown(pwfile, uid, gid)
    subprocess.run([initdb, "-D", data, "-U", USER, "--pwfile", pwfile, "-A", "scram-sha-256", "-E", "UTF8",
                    "--no-sync"], check=True, capture_output=True, preexec_fn=drop)
    port = _free_port()
    with open(os.path.join(top, "log"), "w") as log:
        proc = subprocess.Popen([binary, "-D", data, "-p", str(port), "-k", top, "-c", "listen_addresses=127.0.0.1",
                                 "-c", "wal_level=logical", "-c", "fsync=off", "-c", "max_connections=60"],
                                stdout=subprocess.DEVNULL, stderr=log, preexec_fn=drop)
    server = Server(port, top)
    try:
        deadline = time.monotonic() + 60
        while True:  # polls a condition (the server accepts connections), bounded
            try:
                server.query("SELECT 1")
                break
            except Exception:  # noqa: BLE001 - not up yet
                if proc.poll() is not None or time.monotonic() > deadline:
                    with open(os.path.join(top, "log")) as f:
                        raise RuntimeError(f"PostgreSQL did not start: {f.read()[-2000:]}") from None
                time.sleep(0.05)
        yield server
    finally:
        proc.send_signal(signal.SIGINT)  # fast shutdown: clients are disconnected, not waited for
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres() -> Iterator[Server]:
    if find_bin("initdb") is None or find_bin("postgres") is None:
        if os.environ.get("ABS_ENGINE_REQUIRE_POSTGRES"):
            pytest.fail("PostgreSQL is not installed (apt-get install postgresql): its tests must run here")
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    with running() as server:
        yield server
