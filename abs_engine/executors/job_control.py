"""The running job's control endpoint: how ``abs-engine savepoint DIR [--stop]`` reaches the
driver of the job on DIR, without signalling any process.

The driver, once it holds the directory lock (checkpoint/lock.py), listens on a Linux
abstract Unix socket with a random name and writes ``DIR/_control`` (0600, in the 0700
control directory): the socket's name and a fresh 32-byte secret. A client:

1. reads ``_control`` bounded, never through a link, only a regular file owned by its own
   user and not readable by others;
2. connects, and checks the peer's credentials from the kernel (``SO_PEERCRED``): its uid
   must be the client's, and its pid must be a process that holds the flock on
   ``DIR/_lock`` (Linux ``/proc/locks``), i.e. the job's driver;
3. runs the mutual HMAC handshake of every engine connection (auth.py) with the secret;
4. sends one request (msgpack ``{"op": "savepoint"|"stop", "timeout": s}``) and waits for
   the answer: the savepoint's location once it is written, or why there is none.

The driver checks the client's uid (``SO_PEERCRED``) before the handshake and drops any
connection that fails either. Invariants: nothing is ever sent a signal; a file planted in
the directory can at worst make the client talk to nobody (the lock's holder must be the
peer); a stranger (another uid) is refused by the kernel's credentials before a byte is
read; every read is bounded (``MAX_FILE``, ``MAX_FRAME``) and every wait has a deadline.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import secrets
import socket
import stat
import struct
import threading
import time
from typing import Any, Callable

import msgpack

from .. import auth, codec
from ..checkpoint.fence import lock_holders
from ..checkpoint.lock import LOCK_FILE
from ..errors import CheckpointError, CheckpointErrorReason, ProtocolError

CONTROL_FILE = "_control"
MAX_FILE = 4096  #: bytes of ``_control`` read at most
MAX_FRAME = 4096  #: bytes of a request or an answer
MAX_WAIT = 24 * 3600.0  #: seconds a request may ask the driver to wait for its savepoint
OPS = ("savepoint", "stop")
_UCRED = struct.Struct("3i")  #: struct ucred: pid, uid, gid

_R = CheckpointErrorReason

#: What the driver does with a request: take a savepoint (``stop``: then stop the job);
#: the future resolves to the savepoint's location, or fails with the reason there is none.
Handler = Callable[[bool], "concurrent.futures.Future[str]"]


def peer_credentials(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a Unix socket, from the kernel."""
    pid, uid, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return pid, uid


def _send(sock: socket.socket, doc: dict[str, Any]) -> None:
    sock.sendall(codec.frame(codec.FrameKind.RECORDS, msgpack.packb(doc, use_bin_type=True)))


def _receive(sock: socket.socket, deadline: float) -> dict[str, Any]:
    """One bounded frame holding a msgpack map, before ``deadline`` (monotonic)."""
    reader = codec.FrameReader(MAX_FRAME)
    while (frame := reader.next_frame()) is None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no answer in time")
        sock.settimeout(left)
        data = sock.recv(MAX_FRAME)
        if not data:
            raise ConnectionError("the other side closed the connection")
        reader.feed(data)
    doc = msgpack.unpackb(frame[1], raw=False)
    if not isinstance(doc, dict):
        raise ValueError("not a map")
    return doc


class ControlServer:
    """The driver's side: serves requests on an abstract socket for as long as it runs
    (a context manager; start it after the directory lock is taken, stop it before)."""

    def __init__(self, directory: str, handler: Handler):
        self.directory = directory
        self.path = os.path.join(directory, CONTROL_FILE)
        self.handler = handler
        self.secret = auth.new_secret()
        self.name = "abs-engine-" + secrets.token_hex(16)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind("\0" + self.name)
        self.sock.listen(16)
        self._thread = threading.Thread(target=self._serve, name="job-control", daemon=True)
        self._inode: tuple[int, int] | None = None

    def __enter__(self) -> "ControlServer":
        self._publish()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._unpublish()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() at once (Linux: EINVAL)
        except OSError:
            pass
        self._thread.join(5.0)
        self.sock.close()

    def _publish(self) -> None:
        """Write ``_control`` afresh (a stale one of a dead driver, or anything planted under
        that name, is unlinked first, never followed or written through)."""
        doc = json.dumps({"version": 1, "socket": self.name, "secret": self.secret.hex(), "pid": os.getpid()})
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            raise CheckpointError(_R.UNSAFE_PATH, f"{self.path} is a directory: remove it (abs-engine writes a "
                                                  "file of its own there)") from None
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, doc.encode())
            st = os.fstat(fd)
            self._inode = (st.st_dev, st.st_ino)
        finally:
            os.close(fd)

    def _unpublish(self) -> None:
        try:
            st = os.lstat(self.path)
            if (st.st_dev, st.st_ino) == self._inode:  # ours, not a successor's
                os.unlink(self.path)
        except OSError:
            pass

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # shut down (__exit__)
            try:
                stranger = peer_credentials(conn)[1] != os.geteuid()
            except OSError:
                stranger = True
            if stranger:  # another user: not a word, and no thread for them
                conn.close()
                continue
            threading.Thread(target=self._answer, args=(conn,), name="job-control-request", daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                auth.server_handshake(conn, self.secret)
                request = _receive(conn, time.monotonic() + auth.HANDSHAKE_TIMEOUT)
                op, wait = request.get("op"), request.get("timeout")
                if op not in OPS or not isinstance(wait, (int, float)) or not 0 < wait <= MAX_WAIT:
                    _send(conn, {"ok": False, "error": f"a malformed request: op must be one of {OPS}"})
                    return
                future = self.handler(op == "stop")
                try:
                    _send(conn, {"ok": True, "savepoint": future.result(timeout=wait)})
                except concurrent.futures.TimeoutError:
                    _send(conn, {"ok": False, "error": f"no savepoint within {wait:g}s (it is still asked for: "
                                                       "the job takes it when its checkpoint completes)"})
                except Exception as e:  # noqa: BLE001 - the reason there is no savepoint, for the client
                    _send(conn, {"ok": False, "error": str(e)})
            except (OSError, ProtocolError, ValueError, TimeoutError, msgpack.ExtraData):
                return  # a broken or unauthenticated client: dropped, nothing fails


def _read_control(directory: str) -> dict[str, Any]:
    path = os.path.join(directory, CONTROL_FILE)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CheckpointError(_R.NOT_FOUND, f"no job is running on {directory} (it has no {CONTROL_FILE} file: "
                                            "the job ended, or has not started yet)") from None
    except OSError as e:
        raise CheckpointError(_R.UNSAFE_PATH, f"cannot open {path} ({e}): it must be a regular file written "
                                              "by the job's driver") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise CheckpointError(_R.UNSAFE_PATH, f"{path} is not a private file of yours (a regular file, "
                                                  "mode 0600, owned by you): it was not written by your job's "
                                                  "driver; refusing to use it")
        raw = os.read(fd, MAX_FILE + 1)
    finally:
        os.close(fd)
    try:
        doc: dict[str, Any] = json.loads(raw[:MAX_FILE].decode())
        name, secret = doc["socket"], bytes.fromhex(doc["secret"])
        if not isinstance(name, str) or not name.startswith("abs-engine-") or len(secret) < 16:
            raise ValueError(name)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise CheckpointError(_R.CORRUPT_METADATA, f"{path} is damaged: it does not describe a running job's "
                                                   "control endpoint") from None
    doc["secret"] = secret
    return doc


def request(directory: str, op: str, timeout: float) -> str:
    """Ask the driver of the job whose lock is in ``directory`` for a savepoint (``op``
    "savepoint") or a savepoint and a stop ("stop"); returns the savepoint's location.
    Raises CheckpointError naming why not (no job running, not ours, no answer)."""
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}")
    doc = _read_control(directory)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with sock:
        sock.settimeout(auth.HANDSHAKE_TIMEOUT)
        try:
            sock.connect("\0" + doc["socket"])
        except OSError:
            raise CheckpointError(_R.NOT_FOUND, f"no job is running on {directory} (nothing answers at the "
                                                "address its driver left: it has ended)") from None
        pid, uid = peer_credentials(sock)
        if uid != os.geteuid() or pid not in lock_holders(os.path.join(directory, LOCK_FILE)):
            raise CheckpointError(_R.LOCKED, f"the process answering for {directory} (pid {pid}, uid {uid}) is not "
                                             "the driver holding its lock: refusing to talk to it")
        try:
            auth.client_handshake(sock, doc["secret"])
            _send(sock, {"op": op, "timeout": timeout})
            answer = _receive(sock, time.monotonic() + timeout + auth.HANDSHAKE_TIMEOUT)
        except (OSError, ProtocolError, ValueError, TimeoutError, msgpack.ExtraData) as e:
            raise CheckpointError(_R.NOT_FOUND, f"the job on {directory} did not answer ({e})") from None
    if answer.get("ok") is True and isinstance(answer.get("savepoint"), str):
        return str(answer["savepoint"])
    raise CheckpointError(_R.NOT_FOUND, f"the job on {directory} took no savepoint: {answer.get('error')}")
