"""Key groups: where a key lives, the same on every machine, process and Python version.

A key maps to one of ``max_parallelism`` key groups by a stable hash of a canonical
encoding of its value (never Python's ``hash()``, whose str hashing changes with the seed and
between interpreter versions). Subtask i of p owns the contiguous range of groups
``key_group_range(max_p, p, i)`` and a hash exchange sends a key to the owner of its group
(``operator_index_for_key_group``), exactly as Flink's KeyGroupRangeAssignment does; a
checkpoint's keyed state can therefore be re-split by group range at another parallelism.

Invariants:
- Keys equal in Python are equal here: ``1 == 1.0 == True`` share a dict entry, so they
  share a group (bools and integral floats encode as ints); tuples and lists of equal
  elements share one. Keys of different types that Python keeps apart stay apart ("1",
  b"1", 1 and (1,) are all encoded with a type tag).
- The hash is CRC-32 of the tagged encoding (zlib, the same everywhere), mixed by
  MurmurHash3's finaliser so that consecutive keys spread over the groups.
- The ranges of the p subtasks partition range(max_p) in order, and
  ``operator_index_for_key_group(kg) == i`` iff ``kg in key_group_range(i)``.
- A key of another type (a set, a dict, an object) is KeyTypeError, naming the type and
  the fix: deterministic, so never retried.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

from .errors import KeyTypeError

DEFAULT_MAX_PARALLELISM = 128
UPPER_BOUND = 1 << 15  #: as Flink: at most 32768 key groups

_STR, _BYTES, _INT, _NONE, _FLOAT, _SEQ = (zlib.crc32(t) for t in (b"s", b"y", b"i", b"n", b"f", b"t"))
_M32 = 0xFFFFFFFF


def _fmix(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def _int_crc(v: int) -> int:
    return zlib.crc32(v.to_bytes((v.bit_length() + 8) // 8, "big", signed=True), _INT)


def stable_hash(key: Any) -> int:
    """A 32-bit hash of ``key``'s value, stable across processes, machines and versions."""
    t = type(key)
    if t is str:
        return zlib.crc32(key.encode("utf-8", "surrogatepass"), _STR)
    if t is int or t is bool:
        return _int_crc(int(key))
    if t is bytes:
        return zlib.crc32(key, _BYTES)
    if t is tuple or t is list:
        crc = zlib.crc32(len(key).to_bytes(4, "big"), _SEQ)
        for item in key:
            crc = zlib.crc32(stable_hash(item).to_bytes(4, "big"), crc)
        return crc
    if key is None:
        return _NONE
    if t is float:
        return _int_crc(int(key)) if key.is_integer() else zlib.crc32(struct.pack(">d", key), _FLOAT)
    if isinstance(key, str):  # subclasses (str enums): their value, not their str()
        return zlib.crc32(str.encode(key, "utf-8", "surrogatepass"), _STR)
    bases: tuple[Any, ...] = (int, bytes, float, tuple, list)  # IntEnum, namedtuples, ...
    for base in bases:
        if isinstance(key, base):
            return stable_hash(base(key))
    raise KeyTypeError(f"a key of type {type(key).__name__} cannot be placed in a key group: key_by must give "
                       "a str, int, bytes, float, bool, None, or a tuple of those (return e.g. str(x) or a tuple)")


def key_group(key: Any, max_parallelism: int) -> int:
    """The key group of ``key``: in range(max_parallelism)."""
    return _fmix(stable_hash(key)) % max_parallelism


def check_parallelism(max_parallelism: int, parallelism: int) -> None:
    if not 1 <= max_parallelism <= UPPER_BOUND:
        raise ValueError(f"max_parallelism must be between 1 and {UPPER_BOUND}, got {max_parallelism}")
    if not 1 <= parallelism <= max_parallelism:
        raise ValueError(f"parallelism {parallelism} must be between 1 and max_parallelism ({max_parallelism})")


def key_group_range(max_parallelism: int, parallelism: int, index: int) -> range:
    """The key groups subtask ``index`` of ``parallelism`` owns (contiguous, in order)."""
    check_parallelism(max_parallelism, parallelism)
    start = (index * max_parallelism + parallelism - 1) // parallelism
    end = ((index + 1) * max_parallelism + parallelism - 1) // parallelism
    return range(start, end)


def operator_index_for_key_group(max_parallelism: int, parallelism: int, group: int) -> int:
    """The subtask of ``parallelism`` that owns key group ``group``."""
    return group * parallelism // max_parallelism


def owners(max_parallelism: int, parallelism: int) -> list[int]:
    """Key group -> owning subtask, as a table (a hash exchange's routing)."""
    return [operator_index_for_key_group(max_parallelism, parallelism, g) for g in range(max_parallelism)]
