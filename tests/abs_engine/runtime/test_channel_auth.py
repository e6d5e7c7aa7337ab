"""Data connections: only authenticated producers become inputs; strangers, tricklers and
oversized frames are dropped without failing the task or delaying the real producers."""

from __future__ import annotations


import select
import socket
import threading
import time

import pytest

from abs_engine import auth, codec
from abs_engine.errors import ProtocolError
from abs_engine.runtime.channel import OutputChannel, accept_inputs

pytestmark = pytest.mark.timeout(30)


def _accept_in_thread(listener: socket.socket, expected: dict[str, bool], secret: bytes, timeout: float):
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["channels"] = accept_inputs(listener, expected, secret, timeout)
        except BaseException as e:  # noqa: BLE001
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, out


def test_strangers_and_tricklers_are_dropped_and_the_real_producer_gets_through() -> None:
    secret = auth.new_secret()
    listener = socket.create_server(("127.0.0.1", 0))
    addr = listener.getsockname()[:2]
    t, out = _accept_in_thread(listener, {"a->b": False}, secret, 20.0)
    # a stranger who speaks first: a HELLO and records, no handshake
    stranger = socket.create_connection(addr)
    stranger.sendall(codec.frame(codec.FrameKind.HELLO, codec.pack("a->b")) + codec.records_frame([1, 2, 3]))
    # a trickler: one byte, then silence
    trickler = socket.create_connection(addr)
    trickler.sendall(b"A")
    # a client with the wrong secret
    with pytest.raises(ProtocolError):
        OutputChannel.connect("a->b", addr, auth.new_secret(), timeout=5)
    t0 = time.monotonic()
    real = OutputChannel.connect("a->b", addr, secret, timeout=5)
    real.send(codec.records_frame(["real"]))
    t.join()
    assert "error" not in out, out
    channels = out["channels"]
    assert list(channels) == ["a->b"]  # type: ignore[call-overload]
    ch = channels["a->b"]  # type: ignore[index]
    while (f := ch.next_frame()) is None:
        select.select([ch.sock], [], [], 10)
        ch.fill_nowait()
    assert f == (codec.FrameKind.RECORDS, codec.pack(["real"]), False)
    assert time.monotonic() - t0 < 5  # not delayed by the trickler
    # the stranger got the challenge and nothing more, then was closed
    stranger.settimeout(5)
    got = b""
    while data := stranger.recv(4096):
        got += data
    assert got[:4] == auth.MAGIC and len(got) == auth.CHALLENGE_SIZE
    trickler.settimeout(5)
    assert len(trickler.recv(4096)) == auth.CHALLENGE_SIZE
    real.close()
    listener.close()


def test_missing_channels_are_named_at_the_deadline() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    with pytest.raises(ProtocolError, match=r"\['x->y'\] did not connect"):
        accept_inputs(listener, {"x->y": False}, auth.new_secret(), 0.3)
    listener.close()
