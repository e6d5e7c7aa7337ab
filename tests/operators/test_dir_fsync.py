"""Renames that publish a file are durable: the containing directory is fsynced after each
(a rename lives in the directory's entry; without the directory fsync a power loss can undo
it although the file's own data was fsynced)."""

from __future__ import annotations

import os
import stat

import pytest

from operators.base import OperatorContext

pa = pytest.importorskip("pyarrow")


class DiskLog:
    """Records os.replace and os.fsync calls in order: ("replace", dst) / ("fsync", path, is_dir)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.events: list[tuple] = []
        real_fsync, real_replace = os.fsync, os.replace

        def fsync(fd):
            st = os.fstat(fd)
            self.events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"), stat.S_ISDIR(st.st_mode)))
            return real_fsync(fd)

        def replace(src, dst, **kw):
            real_replace(src, dst, **kw)
            self.events.append(("replace", os.path.abspath(dst)))

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)

    def assert_each_rename_then_dir_fsync(self, expected_renames: int) -> None:
        renames = [i for i, e in enumerate(self.events) if e[0] == "replace"]
        assert len(renames) == expected_renames, self.events
        for n, i in enumerate(renames):
            directory = os.path.realpath(os.path.dirname(self.events[i][1]))
            end = renames[n + 1] if n + 1 < len(renames) else len(self.events)
            assert ("fsync", directory, True) in self.events[i + 1:end], (
                f"no fsync of {directory} after renaming {self.events[i][1]}: {self.events}")


def ctx(index: int = 0, parallelism: int = 1) -> OperatorContext:
    return OperatorContext(operator="op", subtask_index=index, parallelism=parallelism, attempt=0, restored=False)


def test_parquet_publish_fsyncs_the_directory_after_each_rename(tmp_path, monkeypatch):
    from operators.parquet import ParquetSink

    sink = ParquetSink(tmp_path / "pq", ["word", "n"])
    sink.open(ctx())
    sink.process([("a", 1), ("b", 2)])
    sink.snapshot(1)
    sink.process([("c", 3)])
    sink.snapshot(2)
    log = DiskLog(monkeypatch)
    sink.notify_checkpoint_complete(2)  # publishes epochs 1 and 2: two renames
    log.assert_each_rename_then_dir_fsync(2)
    assert sorted(os.listdir(tmp_path / "pq")) == ["part-00000-000001.parquet", "part-00000-000002.parquet"]


class FakeStream:
    isStreaming = True
    columns = ["value"]


class FakeBatch:
    def __init__(self, rows: list[str]):
        self.rows = rows

    def toArrow(self):
        return pa.table({"value": self.rows})


class FakeQuery:
    def awaitTermination(self) -> None:
        pass

    def exception(self) -> None:
        return None


def test_spark_stream_staging_fsyncs_the_directory_after_each_rename(tmp_path, monkeypatch):
    from operators.spark_stream import SparkStreamSource

    src = SparkStreamSource(FakeStream(), tmp_path / "staging")
    os.makedirs(src.staging)
    log = DiskLog(monkeypatch)
    src.stage(FakeBatch(["x", "y"]), 0)
    src.stage(FakeBatch(["z"]), 1)
    src._query = FakeQuery()
    src._await_end()  # writes the _end marker: a third rename
    log.assert_each_rename_then_dir_fsync(3)
    assert sorted(os.listdir(src.staging)) == ["_end", "batch-000000000.arrow", "batch-000000001.arrow"]
