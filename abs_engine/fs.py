"""Where files live: a local path, ``file://``, or a URI that ``pyarrow.fs`` opens
(``s3://``, ``gs://``, ``abfs://``, ``hdfs://``, ``viewfs://``).

Local paths (plain or ``file://``) stay with the callers' descriptor-based code, which
refuses symlinks and FIFOs (checkpoint/stores.py, safe_io.py); this module is the layer for
everything else. Why pyarrow.fs and not fsspec: pyarrow is already a dependency (Spark
partitions travel as Arrow batches), its S3/GCS/Azure/HDFS clients are the C++ ones with
no further Python packages, and its API is small and typed; fsspec would add s3fs and
aiobotocore for the same reach.

Invariants:
- ``put`` makes an object visible whole or not at all: on object stores (S3, GCS, Azure) a
  single PUT (or a completed multipart upload) is atomic, so no rename is needed; on HDFS,
  where a file is visible while it is written, the bytes go to a temporary name that is
  renamed into place.
- Every read is bounded: the size is looked up first and a file larger than the caller's
  limit is refused unread; at most ``limit + 1`` bytes are ever read.
- Names joined below a root are plain names (``checkpoint.safe_io.is_plain_name``); a path
  never climbs out of its root.
- URIs shown in errors and logs never carry credentials (``redact``).
- Every failure of the store is an ``OSError`` subclass (``StoreError``) naming the URI.
"""

from __future__ import annotations

import functools
import os
import re
import secrets
import socket
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

#: Schemes whose single PUT is atomic (visible whole or not at all).
ATOMIC_PUT_SCHEMES = frozenset({"s3", "gs", "gcs", "abfs", "abfss", "az"})
#: Temporary files of ``put`` are named ``.tmp-<12 hex>-<name>``: hidden from Spark and Hadoop
#: readers (leading dot) and recognisable as leftovers of a crash (``is_leftover``).
TMP_PREFIX = ".tmp-"
#: The object metadata that makes an object private, per scheme that has ACLs (Arrow's S3
#: file system sets the canned ACL from the "ACL" key).
PRIVATE_ACL: dict[str, dict[str, str]] = {"s3": {"ACL": "private"}}
_TMP_RE = re.compile(r"^\.tmp-[0-9a-f]{12}-(.+)$")
_SECRET_KEYS = frozenset({"secret_key", "session_token", "access_key", "password", "token"})
_SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class StoreError(OSError):
    """A remote store could not be reached or refused an operation."""


def leftover_of(name: str) -> str | None:
    """The file name a crashed ``put`` was writing, if ``name`` is its temporary file."""
    m = _TMP_RE.match(name)
    return m.group(1) if m else None


def is_uri(location: str) -> bool:
    """``location`` has a scheme (``s3://...``, ``file://...``)."""
    return bool(_SCHEME_RE.match(location))


def is_remote(location: str) -> bool:
    """``location`` is a URI that is not ``file://``: it goes through pyarrow.fs."""
    return is_uri(location) and urlsplit(location).scheme.lower() != "file"


def local_path(location: str) -> str:
    """The absolute local path of a plain path or a ``file://`` URI."""
    if is_uri(location):
        parts = urlsplit(location)
        if parts.scheme.lower() != "file":
            raise ValueError(f"{redact(location)} is not a local path")
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"{location}: file:// URIs name no host (file:///path)")
        return os.path.abspath(parts.path)
    return os.path.abspath(location)


def join(location: str, *names: str) -> str:
    """``names`` below ``location``: a local path, or a URI whose query (its options and
    credentials) stays at its end."""
    if not is_remote(location):
        return os.path.join(local_path(location), *names)
    head, sep, query = location.partition("?")
    return "/".join([head.rstrip("/"), *names]) + sep + query


def split(location: str) -> tuple[str, str]:
    """``(parent, name)`` of a local path or a URI, ``join``'s inverse: a URI's query (its
    options and credentials) stays on the parent."""
    if not is_remote(location):
        return os.path.split(local_path(location))
    head, sep, query = location.partition("?")
    if not urlsplit(head).path.strip("/"):
        raise ValueError(f"{redact(location)} names no object below its bucket or host: give a path in it")
    parent, _, name = head.rstrip("/").rpartition("/")
    return parent + sep + query, name


def redact(location: str) -> str:
    """``location`` with credentials in its query or user-info replaced by ``***``."""
    if not is_uri(location):
        return location
    parts = urlsplit(location)
    query = urlencode([(k, "***" if k.lower() in _SECRET_KEYS else v) for k, v in parse_qsl(parts.query)],
                      safe="*:/")
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _is_missing(e: BaseException) -> bool:
    """pyarrow reports some missing paths as a plain OSError with words, not FileNotFoundError."""
    text = str(e).lower()
    return "not found" in text or "does not exist" in text


def _check_plain(names: tuple[str, ...], shown: str) -> None:
    for n in names:
        if not n or n in (".", "..") or "/" in n or "\\" in n or "\x00" in n:
            raise ValueError(f"{n!r} is not a plain name below {shown}")


@functools.lru_cache(maxsize=32)
def _open(uri: str) -> tuple[Any, str]:
    from pyarrow import fs as pafs

    filesystem, path = pafs.FileSystem.from_uri(uri)
    return filesystem, path.rstrip("/")


class Store:
    """A directory on a remote file system or object store, given by a URI."""

    def __init__(self, uri: str, private: bool = False):
        if not is_remote(uri):
            raise ValueError(f"{uri!r} is a local path: use it directly")
        #: Objects are written with a private ACL where the store has ACLs (S3: the canned
        #: ACL "private", owner only, whatever the bucket's default).
        self.private = private
        self.uri = uri.rstrip("/") if "?" not in uri else uri
        self.shown = redact(uri)
        self.scheme = urlsplit(uri).scheme.lower()
        try:
            self.fs, self.base = _open(uri)
        except Exception as e:  # pyarrow raises ArrowInvalid (ValueError) or OSError
            raise StoreError(f"cannot open {self.shown}: {e} (check the URI, its endpoint and the "
                             "credentials in the environment)") from e

    def path(self, *names: str) -> str:
        """The store path of ``names`` below the root (each a plain name)."""
        _check_plain(names, self.shown)
        return "/".join([self.base, *names]) if self.base else "/".join(names)

    def show(self, *names: str) -> str:
        """How ``names`` below the root are shown: the redacted URI plus the names."""
        head, sep, query = self.shown.partition("?")
        return "/".join([head.rstrip("/"), *names]) + (sep + query if sep else "")

    def _fail(self, what: str, names: tuple[str, ...], e: BaseException) -> StoreError:
        return StoreError(f"{what} {self.show(*names)} failed: {e}")

    def list(self, *names: str) -> list[str]:
        """Base names of the entries directly below ``names`` (empty if there is nothing)."""
        from pyarrow import fs as pafs

        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.path(*names) if names else self.base,
                                                            allow_not_found=True, recursive=False))
        except Exception as e:
            raise self._fail("listing", names, e) from e
        return sorted(i.base_name for i in infos)

    def size(self, *names: str) -> int | None:
        """The size of file ``names`` in bytes, None if there is no such file."""
        from pyarrow import fs as pafs

        try:
            info = self.fs.get_file_info(self.path(*names))
        except Exception as e:
            raise self._fail("looking up", names, e) from e
        if info.type == pafs.FileType.NotFound:
            return None
        if info.type != pafs.FileType.File:
            return -1  # a directory (prefix) where a file should be
        return int(info.size)

    def exists(self, *names: str) -> bool:
        from pyarrow import fs as pafs

        try:
            return bool(self.fs.get_file_info(self.path(*names)).type != pafs.FileType.NotFound)
        except Exception as e:
            raise self._fail("looking up", names, e) from e

    def read(self, names: tuple[str, ...], limit: int) -> bytes:
        """The bytes of a file, at most ``limit``: FileNotFoundError if it is missing,
        ``TooLarge`` if it holds more (nothing beyond ``limit + 1`` bytes is read)."""
        try:
            f = self.fs.open_input_file(self.path(*names))
        except FileNotFoundError:
            raise
        except Exception as e:
            if _is_missing(e):
                raise FileNotFoundError(self.show(*names)) from None
            raise self._fail("opening", names, e) from e
        try:
            size = int(f.size())
            if size > limit:
                raise TooLarge(size, limit)
            data = bytes(f.read(limit + 1))
        except TooLarge:
            raise
        except Exception as e:
            raise self._fail("reading", names, e) from e
        finally:
            f.close()
        if len(data) > limit:
            raise TooLarge(len(data), limit)
        return data

    def put(self, names: tuple[str, ...], data: bytes) -> None:
        """Write ``data`` as file ``names``, visible whole or not at all (see the module
        docstring); an existing file of that name is replaced."""
        target = self.path(*names)
        meta = PRIVATE_ACL.get(self.scheme) if self.private else None
        try:
            if self.scheme in ATOMIC_PUT_SCHEMES:
                with self.fs.open_output_stream(target, metadata=meta) as out:
                    out.write(data)
            else:
                tmp = self.path(*names[:-1], f"{TMP_PREFIX}{secrets.token_hex(6)}-{names[-1]}")
                with self.fs.open_output_stream(tmp, metadata=meta) as out:
                    out.write(data)
                self.fs.move(tmp, target)
        except Exception as e:
            raise self._fail("writing", names, e) from e

    def delete_dir(self, *names: str) -> None:
        """Delete directory (prefix) ``names`` and everything below it; missing is fine."""
        self._delete(self.fs.delete_dir, names)

    def delete_file(self, *names: str) -> None:
        """Delete file ``names``; missing is fine."""
        self._delete(self.fs.delete_file, names)

    def _delete(self, op: Any, names: tuple[str, ...]) -> None:
        try:
            op(self.path(*names))
        except FileNotFoundError:
            return
        except Exception as e:
            if _is_missing(e):
                return
            raise self._fail("deleting", names, e) from e

    def make_root(self) -> None:
        """Make sure the root exists (a no-op on object stores, where prefixes are implicit;
        an unreachable store or a missing bucket fails here, before any work is done). An
        ``endpoint_override`` that refuses connections fails at once, not after the S3
        client's retries (12 s)."""
        try:
            endpoint = dict(parse_qsl(urlsplit(self.uri).query)).get("endpoint_override")
            if endpoint:
                endpoint = endpoint.split("://", 1)[-1]
                host, _, port = endpoint.rpartition(":") if ":" in endpoint else (endpoint, "", "")
                https = dict(parse_qsl(urlsplit(self.uri).query)).get("scheme", "https") == "https"
                socket.create_connection((host.strip("[]"), int(port) if port.isdigit() else 443 if https else 80),
                                         timeout=10).close()
            self.fs.create_dir(self.base, recursive=True)
        except Exception as e:
            raise self._fail("creating", (), e) from e


class LocalDir:
    """A local directory with the Store's interface, for code that takes either (sinks,
    staging): ``put`` is a temp file, fsync, rename and a directory fsync. ``private``: the
    directories it makes are 0700 and its files 0600 (the engine's own files: statistics,
    savepoints, staging); else the umask decides, as for any file a program writes (output)."""

    def __init__(self, path: str, private: bool = False):
        self.private = private
        self.base = local_path(path)
        self.uri = self.base
        self.shown = self.base

    def path(self, *names: str) -> str:
        _check_plain(names, self.shown)
        return os.path.join(self.base, *names)

    def show(self, *names: str) -> str:
        return self.path(*names) if names else self.base

    def list(self, *names: str) -> list[str]:
        try:
            return sorted(os.listdir(self.path(*names) if names else self.base))
        except FileNotFoundError:
            return []

    def size(self, *names: str) -> int | None:
        try:
            return os.stat(self.path(*names)).st_size
        except FileNotFoundError:
            return None

    def exists(self, *names: str) -> bool:
        return os.path.exists(self.path(*names))

    def read(self, names: tuple[str, ...], limit: int) -> bytes:
        with open(self.path(*names), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > limit:
                raise TooLarge(size, limit)
            data = f.read(limit + 1)
        if len(data) > limit:
            raise TooLarge(len(data), limit)
        return data

    def put(self, names: tuple[str, ...], data: bytes) -> None:
        target = self.path(*names)
        parent = os.path.dirname(target)
        os.makedirs(parent, exist_ok=True)
        tmp = os.path.join(parent, f"{TMP_PREFIX}{secrets.token_hex(6)}-{os.path.basename(target)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600 if self.private else 0o666)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        fd = os.open(parent, os.O_RDONLY)
        try:
            os.fsync(fd)  # the rename lives in the directory's entry
        finally:
            os.close(fd)

    def delete_file(self, *names: str) -> None:
        try:
            os.remove(self.path(*names))
        except FileNotFoundError:
            pass

    def make_root(self) -> None:
        if not self.private:
            os.makedirs(self.base, exist_ok=True)
            return
        os.makedirs(os.path.dirname(self.base), exist_ok=True)
        try:
            os.mkdir(self.base, 0o700)
        except FileExistsError:
            pass


Directory = Store | LocalDir


def open_dir(location: str, private: bool = False) -> Directory:
    """A directory to put, read, list and delete files in: local (plain path or file://)
    or remote (any other URI); ``private``: only its owner may read what is written there
    (0700 directories and 0600 files; a private ACL on an object store that has ACLs)."""
    return Store(location, private) if is_remote(location) else LocalDir(location, private)


class TooLarge(Exception):
    """A file holds more bytes than the reader allows."""

    def __init__(self, size: int, limit: int):
        super().__init__(f"{size:,}+ bytes, more than the {limit:,} allowed")
        self.size = size
        self.limit = limit
