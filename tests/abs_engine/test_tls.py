"""TLS between engine processes (abs_engine/tls.py, wire.py): the material and contexts,
who is refused (another certificate, no TLS at all), and that records on the wire are
not readable by whoever relays them."""

from __future__ import annotations


import io
import os
import select
import socket
import ssl
import sys
import tempfile
import threading

import pytest

from abs_engine import auth, codec, tls
from abs_engine.errors import ProtocolError, ProtocolErrorReason
from abs_engine.executors.config import JobConfig
from abs_engine.runtime import worker
from abs_engine.runtime.channel import InputChannel, OutputChannel, accept_inputs
from abs_engine.wire import Wire
from tests.abs_engine.executors.test_security import read_all

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(scope="module")
def material() -> tls.Material:
    return tls.Material.generate()


def _accept(listener: socket.socket, secret: bytes, material: tls.Material | None,
            timeout: float = 20.0) -> tuple[threading.Thread, dict[str, object]]:
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["channels"] = accept_inputs(listener, {"a->b": False}, secret, timeout, material)
        except BaseException as e:  # noqa: BLE001
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, out


def _first_frame(ch: InputChannel) -> tuple[int, bytes]:
    while (f := ch.next_frame()) is None:
        select.select([ch.sock], [], [], 10)
        ch.fill_nowait()
    return f[0], f[1]


def test_material_round_trips_and_the_contexts_are_mutual_tls13(material: tls.Material) -> None:
    assert tls.Material.decode(material.encode()) == material
    assert "\n" not in material.encode()  # one stdin line
    for server_side in (True, False):
        ctx = tls.context(material, server_side)
        assert ctx.minimum_version is ssl.TLSVersion.TLSv1_3
        assert ctx.verify_mode is ssl.CERT_REQUIRED
        assert not ctx.check_hostname
        assert ctx.cert_store_stats()["x509"] == 1  # this job's certificate, nothing else
    with pytest.raises(ValueError):
        tls.Material.decode("bm90IG1zZ3BhY2s=")


def test_contexts_load_without_memfd_and_leave_no_file_behind(material: tls.Material,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "memfd_create", raising=False)
    monkeypatch.setattr(tls, "_contexts", {})
    before = {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("abs-engine-tls-")}
    ctx = tls.context(material, True)
    assert ctx.verify_mode is ssl.CERT_REQUIRED
    after = {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("abs-engine-tls-")}
    assert after == before


def test_a_record_over_a_tls_channel_is_not_plaintext_to_a_relay(material: tls.Material) -> None:
    """A TCP relay between producer and consumer sees everything on the wire: with TLS the
    record is not in it; without TLS it is (so the relay does see the traffic)."""
    record = "a-record-nobody-between-machines-may-read-" * 3
    for material_or_none in (material, None):
        secret = auth.new_secret()
        listener = socket.create_server(("127.0.0.1", 0))
        relay = socket.create_server(("127.0.0.1", 0))
        seen: list[bytes] = []

        def pipe(src: socket.socket, dst: socket.socket) -> None:
            try:
                while data := src.recv(1 << 16):
                    seen.append(data)
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                dst.close()

        def run_relay() -> None:
            a, _ = relay.accept()
            b = socket.create_connection(listener.getsockname()[:2])
            threading.Thread(target=pipe, args=(b, a), daemon=True).start()
            pipe(a, b)

        threading.Thread(target=run_relay, daemon=True).start()
        t, out = _accept(listener, secret, material_or_none)
        producer = OutputChannel.connect("a->b", relay.getsockname()[:2], secret, 5, material_or_none)
        producer.send(codec.records_frame([record]))
        t.join()
        assert "error" not in out, out
        ch = out["channels"]["a->b"]  # type: ignore[index]
        assert _first_frame(ch) == (codec.FrameKind.RECORDS, codec.pack([record]))
        wire_bytes = b"".join(seen)
        assert (record.encode() in wire_bytes) is (material_or_none is None)
        assert (b"a->b" in wire_bytes) is (material_or_none is None)  # the HELLO too
        producer.close()
        ch.sock.close()
        listener.close()
        relay.close()


def test_another_certificate_and_plain_clients_are_refused_and_the_real_producer_gets_through(
        material: tls.Material) -> None:
    secret = auth.new_secret()
    listener = socket.create_server(("127.0.0.1", 0))
    addr = listener.getsockname()[:2]
    t, out = _accept(listener, secret, material)
    # plain strangers: a well-formed HELLO with records, and garbage
    hello = socket.create_connection(addr)
    hello.sendall(codec.frame(codec.FrameKind.HELLO, codec.pack("a->b")) + codec.records_frame([1, 2, 3]))
    garbage = socket.create_connection(addr)
    garbage.sendall(b"\x16\x03\x01" + b"\xff" * 300)
    # a client of another job (another certificate), even knowing the secret
    with pytest.raises((ProtocolError, OSError)):
        OutputChannel.connect("a->b", addr, secret, 5, tls.Material.generate())
    # a plain client that knows the secret waits for a challenge that never comes in the clear
    with pytest.raises(ProtocolError):
        OutputChannel.connect("a->b", addr, secret, 0.5)
    real = OutputChannel.connect("a->b", addr, secret, 5, material)
    real.send(codec.records_frame(["real"]))
    t.join()
    assert "error" not in out, out
    ch = out["channels"]["a->b"]  # type: ignore[index]
    assert _first_frame(ch) == (codec.FrameKind.RECORDS, codec.pack(["real"]))
    for s in (hello, garbage):
        got = read_all(s, 5)
        assert auth.MAGIC not in got and len(got) < 64, got  # at most a TLS alert
        s.close()
    real.close()
    ch.sock.close()
    listener.close()


@pytest.mark.parametrize("client_cert", ["none", "another"])
def test_the_server_requires_this_jobs_client_certificate(material: tls.Material, client_cert: str) -> None:
    """A client that trusts the server but shows no certificate, or another one, gets no
    challenge: the TLS handshake fails on the server's side, and a real producer still
    gets through."""
    secret = auth.new_secret()
    listener = socket.create_server(("127.0.0.1", 0))
    addr = listener.getsockname()[:2]
    t, out = _accept(listener, secret, material)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(cadata=material.cert_pem.decode())
    if client_cert == "another":
        ctx.load_cert_chain(*_files(tls.Material.generate()))
    raw = socket.create_connection(addr)
    s = ctx.wrap_socket(raw)  # TLS 1.3: the client is done before the server checks it
    s.settimeout(5)
    try:
        got = s.recv(4096)
    except (ssl.SSLError, ConnectionResetError):
        got = b""
    assert got == b""  # refused (an alert, or the connection closed), no challenge
    s.close()
    real = OutputChannel.connect("a->b", addr, secret, 5, material)
    t.join()
    assert "error" not in out, out
    real.close()
    listener.close()


def _files(m: tls.Material) -> tuple[str, str]:
    d = tempfile.mkdtemp()
    paths = (os.path.join(d, "c.pem"), os.path.join(d, "k.pem"))
    for path, blob in zip(paths, (m.cert_pem, m.key_pem)):
        with open(path, "wb") as f:
            f.write(blob)
    return paths


def test_a_client_refuses_a_server_with_another_certificate(material: tls.Material) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    other = tls.Material.generate()

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            auth.server_handshake(Wire(conn, other, server_side=True), auth.new_secret(), 5)
        except (ProtocolError, OSError):
            pass
        finally:
            conn.close()

    t = threading.Thread(target=serve)
    t.start()
    with pytest.raises(ProtocolError) as info:
        Wire.connect(listener.getsockname()[:2], material, 5)
    assert info.value.reason is ProtocolErrorReason.AUTH_FAILED
    t.join()
    listener.close()


def test_the_worker_reads_its_tls_material_from_the_second_stdin_line(material: tls.Material,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    secret = auth.new_secret()
    monkeypatch.setattr(sys, "stdin", io.StringIO(secret.hex() + "\n" + material.encode() + "\n"))
    assert worker._read_secret() == (secret, material)
    monkeypatch.setattr(sys, "stdin", io.StringIO(secret.hex() + "\n"))
    assert worker._read_secret() == (secret, None)
    monkeypatch.setattr(sys, "stdin", io.StringIO(secret.hex() + "\nnot-base64!\n"))
    with pytest.raises(SystemExit, match="TLS material"):
        worker._read_secret()


def test_tls_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match="tls"):
        JobConfig(tls="yes")  # type: ignore[arg-type]
    assert JobConfig(tls=True).tls
