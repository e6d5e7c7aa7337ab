"""The Parquet files of one published group of rows (operators/parquet.py): split by
partition values into Hive-style directories, then into pieces of at most
``max_file_rows``, each encoded with the sink's compression and row-group size.

Invariant: the same rows give the same files in the same order (partitions sorted by their
directory names, rows kept in arrival order), so a replay overwrites, never adds.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence
from urllib.parse import quote

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"  #: Hive's (and Spark's) directory for a null value


def _directory(column: str, value: Any) -> str:
    return f"{column}={HIVE_NULL if value is None else quote(str(value), safe='')}"


def files(rows: list[Any], columns: Sequence[str], partition_by: Sequence[str], compression: str,
          row_group_size: int | None, max_file_rows: int | None) -> Iterator[tuple[tuple[str, ...], int | None, bytes]]:
    """(partition directories, piece number or None, file bytes) for every file of ``rows``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = list(columns)
    if len(cols) == 1:
        rows = [(r,) for r in rows]
    at = [cols.index(c) for c in partition_by]
    keep = [i for i in range(len(cols)) if i not in at]
    groups: dict[tuple[str, ...], list[Any]] = {}
    for r in rows:
        groups.setdefault(tuple(_directory(cols[i], r[i]) for i in at), []).append(r)
    for where in sorted(groups):
        part = groups[where]
        size = max_file_rows or max(1, len(part))
        pieces = [part[i:i + size] for i in range(0, len(part), size)]
        for n, piece in enumerate(pieces):
            table = pa.table({cols[i]: [r[i] for r in piece] for i in keep})
            buf = pa.BufferOutputStream()
            pq.write_table(table, buf, compression=compression, row_group_size=row_group_size)
            yield where, (n if len(pieces) > 1 else None), buf.getvalue().to_pybytes()
