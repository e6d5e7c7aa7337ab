"""The driver's Spark partition server against hostile local peers.

Every peer here talks to a real PartitionServer backed by the session's Spark. What each
test proves is in its docstring; all of them fail on a server that reads before it
authenticates, or reads an unbounded request.
"""

from __future__ import annotations

import resource
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from abs_engine import auth, codec
from abs_engine.spark_server import BATCH, ERROR, SCHEMA, PartitionServer
from operators.spark import SparkReadError, SparkSource, _PartitionStream, dataframe_fingerprint

pytestmark = [pytest.mark.spark]

HANDSHAKE_TIMEOUT = 2.0  #: the servers' here: hostile peers are dropped after this
ROWS = 1000
PARTITIONS = 2
CONTROL = codec.FrameKind.CONTROL


class Served:
    def __init__(self, server: PartitionServer, source_id: str, fingerprint: str):
        self.server, self.source_id, self.fingerprint = server, source_id, fingerprint


@pytest.fixture(scope="module")
def served(spark: Any) -> Iterator[Served]:
    """A server of its own (short handshake timeout) serving spark.range(1000) in 2 partitions."""
    from pyspark.sql.pandas.types import to_arrow_schema

    df = spark.range(0, ROWS, 1, PARTITIONS)
    fingerprint, n = dataframe_fingerprint(df)
    assert n == PARTITIONS
    server = PartitionServer(handshake_timeout=HANDSHAKE_TIMEOUT)
    server.register("src", df, fingerprint, to_arrow_schema(df.schema))
    yield Served(server, "src", fingerprint)
    server.close()


def read_partition(s: Served, partition: int, secret: bytes | None = None) -> list[int]:
    """What a real source subtask gets: every row of the partition, through _PartitionStream."""
    stream = _PartitionStream(s.server.address, secret if secret is not None else s.server.secret,
                              [s.source_id, s.fingerprint, partition, 0])
    rows: list[int] = []
    try:
        while (batch := stream.next_batch()) is not None:
            rows += batch.column(0).to_pylist()
    finally:
        stream.close()
    return rows


def expected(partition: int) -> list[int]:
    per = ROWS // PARTITIONS
    return list(range(partition * per, (partition + 1) * per))


def recv_all(sock: socket.socket) -> bytes:
    """Everything until the server closes (the socket's timeout bounds each wait). A reset
    counts as a close: a server that closes with our bytes unread resets the connection."""
    chunks = []
    try:
        while data := sock.recv(1 << 16):
            chunks.append(data)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def frames(data: bytes) -> list[tuple[int, bytes]]:
    reader = codec.FrameReader()
    reader.feed(data)
    out = []
    while (f := reader.next_frame()) is not None:
        out.append(f)
    assert reader.buffered() == 0, "the server sent a partial frame"
    return out


def authenticated(s: Served, timeout: float = 10.0) -> socket.socket:
    sock = socket.create_connection(s.server.address, timeout=timeout)
    auth.client_handshake(sock, s.server.secret)
    return sock


def only_the_challenge(data: bytes) -> bool:
    return len(data) == auth.CHALLENGE_SIZE and data.startswith(auth.MAGIC)


# ---- (a) authentication -----------------------------------------------------------------


def test_the_secret_reaches_the_worker_inside_the_pickled_source_only(spark: Any) -> None:
    """The driver hook puts the server's secret on the source; the copy a subtask gets
    (cloudpickled, as over the control connection) keeps it and drops the DataFrame."""
    import cloudpickle

    from abs_engine.spark_server import partition_server

    src = SparkSource(spark.range(0, 10, 1, 1))
    src.driver_start()
    try:
        worker = cloudpickle.loads(cloudpickle.dumps(src))
        assert worker.secret == src.secret == partition_server().secret
        assert len(worker.secret) == auth.SECRET_BYTES
        assert worker._df is None and not hasattr(worker, "_served")
    finally:
        src.driver_stop()


def test_a_client_without_the_secret_gets_no_data(served: Served) -> None:
    """A peer that sends a perfectly valid request, but no handshake, gets the challenge and
    then the connection closes: no SCHEMA, no BATCH. A real client is served afterwards."""
    with socket.create_connection(served.server.address, timeout=10) as sock:
        sock.sendall(codec.frame(CONTROL, codec.pack([served.source_id, served.fingerprint, 0, 0])))
        sock.shutdown(socket.SHUT_WR)
        got = recv_all(sock)
    assert only_the_challenge(got), f"an unauthenticated peer received {len(got)} bytes"
    assert read_partition(served, 0) == expected(0)


def test_a_wrong_handshake_response_is_refused_before_the_request_is_read(served: Served) -> None:
    """A peer that answers the challenge with a forged response (right size and magic,
    wrong MAC) and then sends a valid request: closed at once, nothing but the challenge."""
    with socket.create_connection(served.server.address, timeout=10) as sock:
        assert only_the_challenge(sock.recv(auth.CHALLENGE_SIZE, socket.MSG_WAITALL))
        forged = auth.MAGIC + bytes(auth.DIGEST) + bytes(auth.NONCE)
        sock.sendall(forged + codec.frame(CONTROL, codec.pack([served.source_id, served.fingerprint, 0, 0])))
        got = recv_all(sock)
    assert got == b"", f"a peer with a forged response received {len(got)} bytes"
    assert read_partition(served, 1) == expected(1)


def test_a_worker_with_another_secret_gets_a_clear_spark_read_error(served: Served) -> None:
    """A source subtask holding the wrong secret (another job's, say) fails with a
    SparkReadError that says why, rather than hanging or reading someone else's data."""
    with pytest.raises(SparkReadError, match="authentication failed"):
        read_partition(served, 0, secret=auth.new_secret())
    assert read_partition(served, 0) == expected(0)


# ---- (b) bounded request ----------------------------------------------------------------


def test_a_request_header_announcing_1_5_gib_is_refused_without_buffering(served: Served) -> None:
    """An authenticated peer announces a 1.5 GiB request frame: the server answers ERROR and
    closes within a couple of seconds, stops reading (what the peer then pushes is not
    buffered: its sends fail early and this process's peak memory does not grow by anything
    like it), and keeps serving."""
    peak_before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with authenticated(served, timeout=5) as sock:
        # The answer comes before the socket's 5 s timeout: the server never waits for the body.
        sock.sendall(codec.HEADER.pack(1536 << 20, CONTROL))
        reply = frames(recv_all(sock))
        assert [k for k, _ in reply] == [ERROR]
        assert "exceeds the maximum" in codec.unpack(reply[0][1])
        pushed, chunk = 0, bytes(1 << 20)
        with pytest.raises(OSError):  # EPIPE / ECONNRESET: nobody reads any more
            while pushed < (512 << 20):
                sock.sendall(chunk)
                pushed += len(chunk)
    assert pushed < (64 << 20)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before_kib) / 1024
    assert grown_mib < 256
    assert read_partition(served, 1) == expected(1)


# ---- (c) slow peers ---------------------------------------------------------------------


def test_a_trickling_peer_is_dropped_within_the_handshake_timeout_while_others_are_served(
        served: Served) -> None:
    """A peer that trickles one byte a second (bytes that would announce a 2 GiB frame to a
    server that skipped the handshake) is closed about HANDSHAKE_TIMEOUT seconds after it
    connected; while it is still connected, other clients authenticate and get answers."""
    sock = socket.create_connection(served.server.address, timeout=HANDSHAKE_TIMEOUT + 3)
    t0 = time.monotonic()
    stop = threading.Event()

    def trickle() -> None:
        while not stop.is_set():
            try:
                sock.send(b"\x7f")
            except OSError:
                return
            stop.wait(1.0)  # pacing: one byte a second

    trickler = threading.Thread(target=trickle, daemon=True)
    trickler.start()
    try:
        challenge = sock.recv(auth.CHALLENGE_SIZE, socket.MSG_WAITALL)
        assert only_the_challenge(challenge)  # its connection thread is in the handshake now
        # Another client, served while the trickler holds its connection: a quick refusal
        # (unknown source) proves its handshake and request did not queue behind it ...
        with authenticated(served) as other:
            other.sendall(codec.frame(CONTROL, codec.pack(["nope", "x", 0, 0])))
            assert [k for k, _ in frames(recv_all(other))] == [ERROR]
        sock.settimeout(0)
        with pytest.raises(BlockingIOError):  # ... and the trickler is still connected
            sock.recv(1, socket.MSG_PEEK)
        sock.settimeout(HANDSHAKE_TIMEOUT + 3)
        # ... and so is a real subtask's partition.
        assert read_partition(served, 0) == expected(0)
        rest = recv_all(sock)
        dropped_after = time.monotonic() - t0
    finally:
        stop.set()
        trickler.join()
        sock.close()
    assert rest == b""
    assert dropped_after < HANDSHAKE_TIMEOUT + 1.5


def test_an_authenticated_peer_that_never_sends_its_request_is_dropped(served: Served) -> None:
    """After the handshake the request has the same short deadline: an authenticated but
    silent peer does not hold a thread and a socket for ever."""
    with authenticated(served, timeout=HANDSHAKE_TIMEOUT + 3) as sock:
        t0 = time.monotonic()
        reply = frames(recv_all(sock))
        assert time.monotonic() - t0 < HANDSHAKE_TIMEOUT + 1.5
    assert [k for k, _ in reply] == [ERROR]


# ---- (d) malformed requests -------------------------------------------------------------

GARBAGE = {
    "not a CONTROL frame": lambda sid, fp: codec.frame(codec.FrameKind.RECORDS, codec.pack([sid, fp, 0, 0])),
    "not msgpack": lambda sid, fp: codec.frame(CONTROL, b"\xc1\xc1\xc1"),
    "truncated msgpack": lambda sid, fp: codec.frame(CONTROL, codec.pack([sid, fp, 0, 0])[:-3]),
    "three elements": lambda sid, fp: codec.frame(CONTROL, codec.pack([sid, fp, 0])),
    "a map": lambda sid, fp: codec.frame(CONTROL, codec.pack({"source": sid})),
    "partition as text": lambda sid, fp: codec.frame(CONTROL, codec.pack([sid, fp, "0", 0])),
    "partition as bool": lambda sid, fp: codec.frame(CONTROL, codec.pack([sid, fp, True, 0])),
    "negative start row": lambda sid, fp: codec.frame(CONTROL, codec.pack([sid, fp, 0, -1])),
    "source id as bytes": lambda sid, fp: codec.frame(CONTROL, codec.pack([sid.encode(), fp, 0, 0])),
}


@pytest.mark.parametrize("what", list(GARBAGE))
def test_a_malformed_request_after_authentication_gets_an_error(served: Served, what: str) -> None:
    """Each malformed request gets exactly one ERROR frame (no data) and a close; the server
    goes on serving real clients."""
    with authenticated(served) as sock:
        sock.sendall(GARBAGE[what](served.source_id, served.fingerprint))
        reply = frames(recv_all(sock))
    assert [k for k, _ in reply] == [ERROR], what
    assert "bad request" in codec.unpack(reply[0][1])
    assert not {SCHEMA, BATCH} & {k for k, _ in reply}
    assert read_partition(served, 1) == expected(1)
