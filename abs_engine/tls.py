"""Optional TLS between engine processes (``JobConfig.tls``): per-job material, contexts,
and TLS over memory BIOs.

All engine processes of one job are one trust domain. When ``tls`` is on, the driver makes
fresh ``Material`` for each attempt: an EC P-256 key and a self-signed certificate for
it (made with ``cryptography``, on the driver only). Every party of the attempt holds the
same key and certificate; every connection is mutual TLS in which each side accepts
exactly that certificate (it is the only CA loaded, and the peer's certificate is also
compared byte for byte). Host names are not checked: peers are addressed by IP, and
the certificate, not the address, is what identifies a party of the job.

The material travels like the attempt's secret: on stdin to local workers, inside the
pickled stage function on Spark (then on stdin), over TLS connections already
authenticated; never on a command line and never into a checkpoint directory.

``load_cert_chain`` takes only file names. The key and certificate are handed to it
through anonymous in-memory files (``os.memfd_create``, named ``/proc/self/fd/N``) where
the platform has them, so they never touch a file system; elsewhere through a private
temporary directory (0700, files 0600) removed as soon as the context has loaded them.

``Tunnel`` runs TLS over memory BIOs (``ssl.SSLObject``), not over the socket: the engine
keeps reading and writing its plain sockets, selectors see every byte that arrives, and
each read is decrypted in full at once, so no decrypted data ever waits unseen in an
SSL buffer while a selector sleeps. Invariants: TLS 1.3 only; no session tickets, no
renegotiation, so after the handshake reading never needs to write; one lock around the
SSL object, since a control connection is written by several threads while one reads.
"""

from __future__ import annotations

import base64
import datetime
import os
import shutil
import ssl
import tempfile
import threading
from dataclasses import dataclass

from . import codec
from .errors import ProtocolError, ProtocolErrorReason

HANDSHAKE_READ_MAX = 64 << 10  #: ciphertext a peer may send before its TLS handshake is done
VALIDITY = datetime.timedelta(days=30)  #: a job that runs longer gets new material on a restart


@dataclass(frozen=True)
class Material:
    """One attempt's key and certificate, PEM encoded."""

    key_pem: bytes
    cert_pem: bytes

    @classmethod
    def generate(cls) -> "Material":
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "abs-engine job")])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name).issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))  # clocks of other machines
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(key, hashes.SHA256())
        )
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        return cls(key_pem, cert.public_bytes(serialization.Encoding.PEM))

    def encode(self) -> str:
        """One line of text (base64 of a msgpack pair) for a worker's stdin."""
        return base64.b64encode(codec.pack([self.key_pem, self.cert_pem])).decode("ascii")

    @classmethod
    def decode(cls, line: str) -> "Material":
        try:
            pair = codec.unpack(base64.b64decode(line.strip(), validate=True))
        except Exception as e:  # noqa: BLE001 - binascii and msgpack raise several types
            raise ValueError(f"not TLS material: {e}") from None
        if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(p, bytes) for p in pair)):
            raise ValueError("TLS material is [key PEM, certificate PEM]")
        return cls(pair[0], pair[1])

    @property
    def cert_der(self) -> bytes:
        return ssl.PEM_cert_to_DER_cert(self.cert_pem.decode("ascii"))


_contexts: dict[tuple[bytes, bool], ssl.SSLContext] = {}
_contexts_lock = threading.Lock()


def context(material: Material, server_side: bool) -> ssl.SSLContext:
    """The (cached) context for one side: TLS 1.3, this certificate as our identity and as
    the only one we accept from the peer."""
    with _contexts_lock:
        ctx = _contexts.get((material.cert_pem, server_side))
        if ctx is None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server_side else ssl.PROTOCOL_TLS_CLIENT)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_3
            ctx.check_hostname = False  # peers are addressed by IP; the certificate identifies them
            ctx.verify_mode = ssl.CERT_REQUIRED  # mutual: the server requires the client's too
            ctx.load_verify_locations(cadata=material.cert_pem.decode("ascii"))
            _load_chain(ctx, material)
            if server_side:
                ctx.num_tickets = 0  # nothing to send after the handshake
            _contexts[(material.cert_pem, server_side)] = ctx
        return ctx


def _load_chain(ctx: ssl.SSLContext, material: Material) -> None:
    memfd = getattr(os, "memfd_create", None)
    if memfd is not None and os.path.isdir("/proc/self/fd"):
        fds = [memfd("abs-engine-tls", getattr(os, "MFD_CLOEXEC", 0)) for _ in range(2)]
        try:
            for fd, blob in zip(fds, (material.cert_pem, material.key_pem)):
                os.write(fd, blob)
            ctx.load_cert_chain(f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}")
        finally:
            for fd in fds:
                os.close(fd)
        return
    private = tempfile.mkdtemp(prefix="abs-engine-tls-")  # mode 0700
    try:
        paths = [os.path.join(private, n) for n in ("cert.pem", "key.pem")]
        for path, blob in zip(paths, (material.cert_pem, material.key_pem)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
        ctx.load_cert_chain(paths[0], paths[1])
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _refused(e: BaseException) -> ProtocolError:
    return ProtocolError(ProtocolErrorReason.AUTH_FAILED, f"the TLS handshake failed: {e}")


class Tunnel:
    """TLS for one connection, sans-IO: ciphertext in, plaintext out and the reverse.

    During the handshake, ``handshake(ciphertext)`` returns True once it is complete; after
    every call, ``take_output()`` holds the ciphertext to send. Then ``seal`` encrypts
    what to send and ``open`` decrypts all that arrived (an incomplete record stays
    buffered; ``open`` returns b"" then). A peer that closes TLS sets ``closed``."""

    __slots__ = ("obj", "incoming", "outgoing", "lock", "expected", "done", "closed", "handshake_read")

    def __init__(self, material: Material, server_side: bool):
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.obj = context(material, server_side).wrap_bio(self.incoming, self.outgoing, server_side=server_side)
        self.lock = threading.Lock()
        self.expected = material.cert_der
        self.done = False
        self.closed = False
        self.handshake_read = 0

    def handshake(self, ciphertext: bytes = b"") -> bool:
        """Advance the handshake; ProtocolError(AUTH_FAILED) if the peer is not of this job
        (another certificate, no TLS at all, garbage) or sends too much before it is done."""
        self.handshake_read += len(ciphertext)
        if self.handshake_read > HANDSHAKE_READ_MAX:
            raise ProtocolError(ProtocolErrorReason.AUTH_FAILED, "the peer sent too much during the TLS handshake")
        if ciphertext:
            self.incoming.write(ciphertext)
        try:
            self.obj.do_handshake()
        except ssl.SSLWantReadError:
            return False
        except ssl.SSLError as e:
            raise _refused(e) from None
        if self.obj.getpeercert(binary_form=True) != self.expected:
            raise _refused(ValueError("the peer's certificate is not this job's"))
        self.done = True
        return True

    def take_output(self) -> bytes:
        with self.lock:
            return self.outgoing.read()

    def seal(self, data: bytes | memoryview) -> bytes:
        with self.lock:
            if data:
                self.obj.write(data)
            return self.outgoing.read()

    def open(self, ciphertext: bytes) -> bytes:
        """All the plaintext the ciphertext completes (raises ssl.SSLError, an OSError, on
        a record that does not decrypt: a broken or tampered stream)."""
        with self.lock:
            self.incoming.write(ciphertext)
            chunks: list[bytes] = []
            while True:
                try:
                    chunk = self.obj.read(1 << 20)
                except ssl.SSLWantReadError:
                    break
                except ssl.SSLZeroReturnError:
                    self.closed = True
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            return b"".join(chunks)
