"""The fork server's stdin (runtime/fork_server.py): the secret's two lines and the task
lines, however the pipe cuts them, and nothing read ahead into a buffer a fork inherits."""

from __future__ import annotations

import os

import pytest

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
    [b"ab\n\nt#0\nt#1\n"],                  # all at once
    [b"a", b"b\n", b"\n", b"t#0\nt", b"#1\n"],  # cut anywhere
    [b"ab\n\n", b"t#0\n", b"t#1\n"],        # as the launcher writes them
])
def test_the_secret_lines_and_task_lines_come_apart_however_they_arrive(writes):
    assert lines_of(*writes) == (("ab", ""), ["t#0", "t#1"])


def test_a_closed_stdin_gives_empty_secret_lines():
    assert lines_of() == (("", ""), [])


def test_an_endless_line_is_refused():
    with pytest.raises(SystemExit, match="too long"):
        lines_of(b"x" * (LINE_MAX + 1))
