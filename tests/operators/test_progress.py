"""Each source's ``progress()`` (operators/progress.py), read off its offset: exact counts
left and in all while it reads, after a restore and after a rescale, and None where the
input is unbounded."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from abs_engine.testing import GatedSource, TestingSource
from operators import ParquetSource, RangeSource, TextFileSource
from operators.base import OperatorContext
from operators.progress import SourceProgress


def ctx(index: int = 0, parallelism: int = 1) -> OperatorContext:
    return OperatorContext("src", index, parallelism, 0, False)


def test_a_range_source_counts_the_records_left_of_every_subtask_and_keeps_the_sum_through_a_rescale() -> None:
    subtasks = [RangeSource(0, 1000, batch_size=10) for _ in range(2)]
    for i, s in enumerate(subtasks):
        s.open(ctx(i, 2))
        assert s.progress() == SourceProgress(500, 1000, "records", f"index {i}")
    for _ in range(7):
        subtasks[0].read_batch()
    assert subtasks[0].progress() == SourceProgress(430, 1000, "records", "index 140")
    old = [s.snapshot(1) for s in subtasks]
    new = [RangeSource(0, 1000, batch_size=10) for _ in range(3)]
    for i, s in enumerate(new):
        s.open(ctx(i, 3))
        s.restore(s.rescale_state(old, i, 3, lambda k: True))
    assert sum(s.progress().left or 0 for s in new) == 930  # every unread index, in exactly one subtask
    while subtasks[1].read_batch() is not None:
        pass
    assert subtasks[1].progress() == SourceProgress(0, 1000, "records", "end")


def test_a_text_file_source_counts_bytes_left_and_a_wrapping_source_says_its_inner_sources_progress(
        tmp_path: Path) -> None:
    path = tmp_path / "in.txt"
    path.write_text("".join(f"line {i:04d}\n" for i in range(100)))  # 10 bytes a line
    size = path.stat().st_size
    src = GatedSource(TextFileSource(path, batch_bytes=100), tmp_path / "gate", after=10**9)
    src.open(ctx())
    assert src.progress() == SourceProgress(size, size, "bytes", "byte 0")
    batch = src.read_batch()
    assert batch is not None and len(batch) == 10
    assert src.progress() == SourceProgress(size - 100, size, "bytes", "byte 100")
    again = TextFileSource(path, batch_bytes=100)
    again.open(ctx())
    again.restore(src.snapshot(1)["inner"])
    assert again.progress() == SourceProgress(size - 100, size, "bytes", "byte 100")


def test_a_parquet_source_counts_row_groups_left(tmp_path: Path) -> None:
    pq.write_table(pa.table({"n": list(range(30))}), tmp_path / "a.parquet", row_group_size=10)
    src = ParquetSource(tmp_path, batch_rows=4)
    src.open(ctx())
    assert src.progress() == SourceProgress(3, 3, "row groups", "a.parquet row group 0, row 0")
    src.read_batch()
    assert src.progress() == SourceProgress(3, 3, "row groups", "a.parquet row group 0, row 4")
    for _ in range(2):
        src.read_batch()  # rows 4..9: the first group is read
    assert src.progress() == SourceProgress(2, 3, "row groups", "a.parquet row group 1, row 0")


def test_the_testing_source_counts_its_items() -> None:
    src = TestingSource(list(range(25)), batch_size=5)
    src.open(ctx(1, 2))  # items 1, 3, ..., 23: twelve
    assert src.progress() == SourceProgress(12, 25, "records", "index 1")
    src.read_batch()
    assert src.progress() == SourceProgress(7, 25, "records", "index 11")
