"""Serves Spark partitions to source subtasks as Arrow record batches (driver side).

The DataFrame lives in the driver's SparkSession; source subtasks run in worker processes.
A subtask connects, asks for (source, fingerprint, partition, first row), and the server
runs a Spark job on *that partition only* (earlier partitions are never read again) and
streams its Arrow batches, rows before the offset dropped. The batches are the JVM's own
Arrow IPC messages (``Dataset.toArrowBatchRdd``), passed through without re-encoding.

The server listens on two addresses: ``address`` in the clear and ``tls_address`` with
mutual TLS 1.3 (tls.py) under the server's own ``material`` (random per server, made at
start, travelling with the secret). A source of a job with ``tls`` on uses the second.

Wire, in this order on every connection:

0. On ``tls_address`` only: the TLS handshake, within ``handshake_timeout`` seconds; a
   peer without the server's certificate (or without TLS at all) is closed.
1. The mutual HMAC handshake of ``abs_engine.auth`` with the server's ``secret`` (random
   per server; it reaches the workers inside the pickled SparkSource, over the job's
   control connection). Nothing else is read before it succeeds; a peer that fails it,
   or does not finish it within ``handshake_timeout`` seconds, is closed without a reply.
2. The request: one CONTROL frame (codec framing) of at most ``MAX_REQUEST`` bytes whose
   payload is msgpack [source_id: str, fingerprint: str, partition: int >= 0,
   start_row: int >= 0], within ``handshake_timeout`` seconds of the handshake. A larger
   header, another frame kind or another payload gets an ERROR frame and the connection is
   closed.
3. The reply: SCHEMA frame (Arrow schema), BATCH frames (Arrow record batch messages), then
   END with the row count, or an ERROR frame with a message.

Invariants: every connection has its own thread, so a slow or hostile peer delays no one
else; nothing a peer sends can raise out of that thread or stop the accept loop.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from . import codec
from .auth import HANDSHAKE_TIMEOUT, new_secret, server_handshake
from .errors import ProtocolError, ProtocolErrorReason
from .tls import Material
from .wire import Wire, server_socket

SCHEMA, BATCH, END, ERROR = 10, 11, 12, 13
MAX_REQUEST = 64 << 10  #: a request is a 4-element msgpack list: a few hundred bytes at most


@dataclass
class Registered:
    df: Any
    fingerprint: str
    arrow_schema: Any
    delivered: int = 0  #: rows sent to subtasks (for tests and stats)
    jobs: int = 0
    first_request: float | None = None  #: monotonic time of the first request served
    last_end: float | None = None  #: monotonic time the last partition was fully sent


class PartitionServer:
    def __init__(self, host: str = "127.0.0.1", handshake_timeout: float = HANDSHAKE_TIMEOUT):
        self.secret = new_secret()  #: workers prove they know it before anything is read
        self.handshake_timeout = handshake_timeout
        self.sources: dict[str, Registered] = {}
        self.material = Material.generate()  #: for tls_address; travels with the secret
        self.sock = server_socket(host, backlog=64)
        self.address = self.sock.getsockname()[:2]
        self.tls_sock = server_socket(host, backlog=64)
        self.tls_address = self.tls_sock.getsockname()[:2]
        self._lock = threading.Lock()
        self._closed = False
        #: Partition reads in flight (each a Spark job, then its stream): the embedded session
        #: is stopped only once there are none (``wait_idle``), or its block manager goes
        #: from under a running task ("Block taskresult_N does not exist", a rejected
        #: status update), which Spark logs as errors.
        self._active = 0
        self._idle = threading.Condition(self._lock)
        threading.Thread(target=self._accept, args=(self.sock, None), name="spark-partition-server",
                         daemon=True).start()
        threading.Thread(target=self._accept, args=(self.tls_sock, self.material),
                         name="spark-partition-server-tls", daemon=True).start()

    def register(self, source_id: str, df: Any, fingerprint: str, arrow_schema: Any) -> None:
        with self._lock:
            self.sources[source_id] = Registered(df, fingerprint, arrow_schema)

    def unregister(self, source_id: str) -> None:
        with self._lock:
            self.sources.pop(source_id, None)

    def stats(self, source_id: str) -> Registered:
        return self.sources[source_id]

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no partition read is in flight; False if some still were after ``timeout``."""
        with self._idle:
            return self._idle.wait_for(lambda: self._active == 0, timeout)

    def close(self) -> None:
        self._closed = True
        self.sock.close()
        self.tls_sock.close()

    def _accept(self, listener: socket.socket, material: Material | None) -> None:
        while not self._closed:
            try:
                conn, _ = listener.accept()
            except OSError as e:
                if self._closed:
                    return
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    time.sleep(0.1)  # out of descriptors (a connection flood?): keep serving
                continue  # ECONNABORTED and the like concern one connection only
            try:
                threading.Thread(target=self._serve, args=(Wire(conn, material, server_side=True),),
                                 daemon=True).start()
            except RuntimeError:  # no more threads (a connection flood?): drop this one only
                conn.close()

    def _serve(self, conn: Wire) -> None:
        try:
            try:
                rest = server_handshake(conn, self.secret, self.handshake_timeout)
            except ProtocolError:
                return  # unauthenticated, silent or too slow: no reply at all
            try:
                request = self._read_request(conn, rest, time.monotonic() + self.handshake_timeout)
            except ProtocolError as e:
                if e.reason is not ProtocolErrorReason.CLOSED:
                    _refuse(conn, f"bad request to the Spark partition server: {e}")
                return
            source_id, fingerprint, partition, start_row = request
            with self._lock:
                reg = self.sources.get(source_id)
            if reg is None or reg.fingerprint != fingerprint:
                _refuse(conn, f"source {source_id} is not served here or its DataFrame changed "
                              f"(fingerprint {fingerprint}); restart the job from its driver")
                return
            with self._lock:
                self._active += 1
            try:
                sent = self._stream(conn, reg, partition, start_row)
            except OSError:
                return  # the subtask died or went away
            except Exception as e:  # noqa: BLE001 - a Spark failure goes to the subtask as text
                msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                _refuse(conn, f"Spark failed reading partition {partition}: {msg}")
                return
            finally:
                with self._lock:
                    self._active -= 1
                    self._idle.notify_all()
            conn.sendall(codec.frame(END, codec.pack(sent)))
        except Exception:  # noqa: BLE001 - nothing a peer does may escape its thread
            pass
        finally:
            conn.close()

    @staticmethod
    def _read_request(conn: Wire, rest: bytes, deadline: float) -> tuple[str, str, int, int]:
        """The one request frame, bounded in size and time, checked for shape and types."""
        reader = codec.FrameReader(max_frame=MAX_REQUEST)
        reader.feed(rest)
        while (frame := reader.next_frame()) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProtocolError(ProtocolErrorReason.HANDSHAKE_TIMEOUT, "no request arrived in time")
            conn.sock.settimeout(left)
            try:
                data = conn.recv(1 << 16)
            except socket.timeout:
                raise ProtocolError(ProtocolErrorReason.HANDSHAKE_TIMEOUT, "no request arrived in time") from None
            if data is None:
                continue  # part of a TLS record
            if not data:
                raise ProtocolError(ProtocolErrorReason.CLOSED, "the peer closed the connection")
            reader.feed(data)
        conn.sock.settimeout(None)
        kind, payload = frame
        if kind != codec.FrameKind.CONTROL:
            raise ProtocolError(ProtocolErrorReason.MALFORMED, f"a request is a CONTROL frame, not kind {kind}")
        try:
            request = codec.unpack(payload)
        except Exception:  # noqa: BLE001 - msgpack raises several types on garbage
            raise ProtocolError(ProtocolErrorReason.MALFORMED, "the request is not msgpack") from None
        if (not isinstance(request, tuple) or len(request) != 4
                or not isinstance(request[0], str) or not isinstance(request[1], str)
                or not all(type(v) is int and v >= 0 for v in request[2:])):
            raise ProtocolError(ProtocolErrorReason.MALFORMED,
                                "a request is [source_id: str, fingerprint: str, partition: int >= 0, "
                                "start_row: int >= 0]")
        return request[0], request[1], request[2], request[3]

    def _stream(self, conn: Wire, reg: Registered, partition: int, start_row: int) -> int:
        import pyarrow as pa
        from pyspark.rdd import _load_from_socket
        from pyspark.serializers import NoOpSerializer

        spark = reg.df.sparkSession
        sc = spark.sparkContext
        jrdd = reg.df._jdf.toArrowBatchRdd().toJavaRDD()
        with self._lock:
            reg.jobs += 1
            if reg.first_request is None:
                reg.first_request = time.monotonic()
        sock_info = sc._jvm.PythonRDD.runJob(sc._jsc.sc(), jrdd, [partition])
        conn.sendall(codec.frame(SCHEMA, reg.arrow_schema.serialize().to_pybytes()))
        skip, sent = start_row, 0
        with _load_from_socket(sock_info, NoOpSerializer()) as stream:
            for blob in stream:
                if skip:
                    batch = pa.ipc.read_record_batch(pa.py_buffer(blob), reg.arrow_schema)
                    if skip >= batch.num_rows:
                        skip -= batch.num_rows
                        continue
                    batch = batch.slice(skip)
                    skip = 0
                    blob = batch.serialize().to_pybytes()
                    n = batch.num_rows
                else:
                    n = pa.ipc.read_record_batch(pa.py_buffer(blob), reg.arrow_schema).num_rows
                conn.sendall(codec.frame(BATCH, blob))
                sent += n
                with self._lock:
                    reg.delivered += n
        with self._lock:
            reg.last_end = time.monotonic()
        return sent


def _refuse(conn: Wire, message: str) -> None:
    """Send an ERROR frame and stop writing (the caller closes the connection)."""
    try:
        conn.sendall(codec.frame(ERROR, codec.pack(message)))
        conn.sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass


_servers: dict[str, PartitionServer] = {}  #: bound address -> its server
_server_lock = threading.Lock()


def partition_server(host: str = "127.0.0.1") -> PartitionServer:
    """The process's partition server on ``host`` (the driver's address the executors
    reach: loopback on one machine), started on first use."""
    with _server_lock:
        if host not in _servers:
            _servers[host] = PartitionServer(host)
        return _servers[host]
