"""Serves Spark partitions to source subtasks as Arrow record batches (driver side).

The DataFrame lives in the driver's SparkSession; source subtasks run in worker processes.
A subtask connects, asks for (source, fingerprint, partition, first row), and the server
runs a Spark job on *that partition only* (earlier partitions are never read again) and
streams its Arrow batches, rows before the offset dropped. The batches are the JVM's own
Arrow IPC messages (``Dataset.toArrowBatchRdd``), passed through without re-encoding.

Wire (codec framing): request = msgpack [source_id, fingerprint, partition, start_row];
reply = SCHEMA frame (Arrow schema), RECORDS frames (Arrow record batch messages), then END
with the row count, or an ERROR frame with a message.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from . import codec

SCHEMA, BATCH, END, ERROR = 10, 11, 12, 13


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
    def __init__(self, host: str = "127.0.0.1"):
        self.sources: dict[str, Registered] = {}
        self.sock = socket.create_server((host, 0), backlog=64)
        self.address = self.sock.getsockname()[:2]
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name="spark-partition-server", daemon=True).start()

    def register(self, source_id: str, df: Any, fingerprint: str, arrow_schema: Any) -> None:
        with self._lock:
            self.sources[source_id] = Registered(df, fingerprint, arrow_schema)

    def unregister(self, source_id: str) -> None:
        with self._lock:
            self.sources.pop(source_id, None)

    def stats(self, source_id: str) -> Registered:
        return self.sources[source_id]

    def close(self) -> None:
        self._closed = True
        self.sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            reader = codec.FrameReader()
            frame = None
            while frame is None:
                data = conn.recv(1 << 16)
                if not data:
                    return
                reader.feed(data)
                frame = reader.next_frame()
            source_id, fingerprint, partition, start_row = codec.unpack(frame[1])
            reg = self.sources.get(source_id)
            if reg is None or reg.fingerprint != fingerprint:
                conn.sendall(codec.frame(ERROR, codec.pack(
                    f"source {source_id} is not served here or its DataFrame changed "
                    f"(fingerprint {fingerprint}); restart the job from its driver")))
                return
            try:
                sent = self._stream(conn, reg, partition, start_row)
            except (BrokenPipeError, ConnectionResetError):
                return  # the subtask died or went away
            except Exception as e:  # noqa: BLE001 - a Spark failure goes to the subtask as text
                msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                conn.sendall(codec.frame(ERROR, codec.pack(f"Spark failed reading partition {partition}: {msg}")))
                return
            conn.sendall(codec.frame(END, codec.pack(sent)))
        except OSError:
            pass
        finally:
            conn.close()

    def _stream(self, conn: socket.socket, reg: Registered, partition: int, start_row: int) -> int:
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


_server: PartitionServer | None = None
_server_lock = threading.Lock()


def partition_server() -> PartitionServer:
    global _server
    with _server_lock:
        if _server is None:
            _server = PartitionServer()
        return _server
