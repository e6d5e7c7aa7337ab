"""The fork server (runtime/fork_server.py): the secret's two lines and the requests on its
stdin, however the pipe cuts them, nothing read ahead into a buffer a fork inherits, and no
worker reaped before the launcher holds it."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time

import pytest

from abs_engine import auth
from abs_engine.runtime.fork_server import LINE_MAX, _Lines


def lines_of(*writes: bytes) -> tuple[tuple[str, str], list[str]]:
    r, w = os.pipe()
    try:
        for data in writes:
            os.write(w, data)
        os.close(w)
        w = -1
        src = _Lines(r)
        first = src.first_two()
        tasks = src.take()
        while not src.eof:
            src.fill()
            tasks += src.take()
        return first, [t for t in tasks if t]
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


@pytest.mark.parametrize("writes", [
    [b"ab\n\nfork t#0\nack 12\n"],                  # all at once
    [b"a", b"b\n", b"\n", b"fork t#0\na", b"ck 12\n"],  # cut anywhere
    [b"ab\n\n", b"fork t#0\n", b"ack 12\n"],        # as the launcher writes them
])
def test_the_secret_lines_and_requests_come_apart_however_they_arrive(writes):
    assert lines_of(*writes) == (("ab", ""), ["fork t#0", "ack 12"])


def test_a_closed_stdin_gives_empty_secret_lines():
    assert lines_of() == (("", ""), [])


def test_an_endless_line_is_refused():
    with pytest.raises(SystemExit, match="too long"):
        lines_of(b"x" * (LINE_MAX + 1))


def test_a_worker_is_not_reaped_before_the_launcher_holds_it():
    """A worker that exits at once (no driver to reach) stays a zombie, its pid its own,
    until the launcher acknowledges it; then its exit status is reported, once."""
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nobody listens there: the worker cannot reach its driver and exits 1
    events_r, events_w = os.pipe()
    server = subprocess.Popen([sys.executable, "-m", "abs_engine.runtime.worker", "--fork-server", str(events_w),
                               "127.0.0.1", str(port), "0"], stdin=subprocess.PIPE, pass_fds=(events_w,),
                              env=dict(os.environ, PYTHONHASHSEED="0"), stderr=subprocess.DEVNULL)
    os.close(events_w)
    events = os.fdopen(events_r, "rb")
    try:
        assert server.stdin is not None
        server.stdin.write(auth.new_secret().hex().encode() + b"\n\nfork t#0\n")
        server.stdin.flush()
        kind, pid, task = events.readline().split()
        assert (kind, task) == (b"started", b"t#0")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with open(f"/proc/{int(pid)}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)
        else:
            raise AssertionError("the worker did not exit")
        assert select.select([events], [], [], 0.2)[0] == []  # exited, but not reaped nor reported
        server.stdin.write(b"ack " + pid + b"\n")
        server.stdin.flush()
        assert events.readline().split() == [b"exit", pid, b"1"]
        assert not os.path.exists(f"/proc/{int(pid)}")  # reaped
    finally:
        server.kill()
        server.wait()
        events.close()
