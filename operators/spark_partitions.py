"""The worker's side of a Spark source's partition protocol (abs_engine/spark_server.py is
the driver's): one authenticated request, (partition, first row), answered with the
partition's Arrow record batches; any breach of the protocol, either way, is a
SparkReadError naming what went wrong.
"""

from __future__ import annotations

from typing import Any

from abs_engine import codec
from abs_engine.auth import HANDSHAKE_TIMEOUT, client_handshake
from abs_engine.errors import InputError, ProtocolError, ProtocolErrorReason
from abs_engine.tls import Material
from abs_engine.wire import Wire


class SparkReadError(InputError):
    """Spark failed to read a partition (a corrupt file, say): retrying cannot help."""

    fatal = True



class PartitionStream:
    """One request to the driver's partition server: (partition, first row) -> batches.

    The connection authenticates first (abs_engine.auth; with ``material``, inside mutual
    TLS); replies are read with the data frame bound. Any breach of the protocol, either
    way, is a SparkReadError."""

    def __init__(self, address: tuple[str, int], secret: bytes, request: list[Any],
                 material: Material | None = None):
        try:
            self.conn = Wire.connect(address, material, HANDSHAKE_TIMEOUT)
        except ProtocolError as e:
            raise _protocol_error(e, handshake=True) from e
        try:
            client_handshake(self.conn, secret)
            self.conn.sock.settimeout(None)
            self.conn.sendall(codec.frame(codec.FrameKind.CONTROL, codec.pack(request)))
        except ProtocolError as e:
            self.conn.close()
            raise _protocol_error(e, handshake=True) from e
        except BaseException:
            self.conn.close()
            raise
        self.reader = codec.FrameReader(max_frame=codec.MAX_FRAME)
        self.schema: Any = None

    def _recv(self) -> tuple[int, bytes]:
        try:
            while (f := self.reader.next_frame()) is None:
                data = self.conn.recv(1 << 20)
                if data is None:
                    continue  # part of a TLS record
                if not data:
                    raise SparkReadError("the driver's Spark partition server closed the connection")
                self.reader.feed(data)
        except ProtocolError as e:
            raise _protocol_error(e) from e
        return f

    def next_batch(self) -> Any:
        """The next Arrow record batch, or None at the end of the partition."""
        import pyarrow as pa

        kind, payload = self._recv()
        if kind == 10 and self.schema is None:
            self.schema = pa.ipc.read_schema(pa.py_buffer(payload))
            kind, payload = self._recv()
        if kind == 11:
            return pa.ipc.read_record_batch(pa.py_buffer(payload), self.schema)
        if kind == 12:
            return None
        raise SparkReadError(codec.unpack(payload) if kind == 13 else f"unexpected frame {kind} from the driver")

    def close(self) -> None:
        self.conn.close()


def _protocol_error(e: ProtocolError, handshake: bool = False) -> SparkReadError:
    if e.reason is ProtocolErrorReason.AUTH_FAILED or (handshake and e.reason is ProtocolErrorReason.CLOSED):
        # The server closes without a word when the response is wrong: that is a refusal too.
        why = ("authentication failed: this worker does not hold the partition server's secret "
               "(a worker of another job or attempt?), or the server is not the job's driver")
    elif e.reason is ProtocolErrorReason.HANDSHAKE_TIMEOUT:
        why = "the authentication handshake did not finish in time"
    elif e.reason is ProtocolErrorReason.FRAME_TOO_LARGE:
        why = f"the server sent an oversized frame ({e})"
    else:
        why = str(e)
    return SparkReadError(f"cannot read from the driver's Spark partition server: {why}")
