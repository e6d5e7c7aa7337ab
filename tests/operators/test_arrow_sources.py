"""Columnar sources (operators/arrow_sources.py): the same rows as their row-by-row
counterparts, offsets that restore exactly, rescaling that reads every row once, clear
errors for bad input; and the vectorized word count exact under SIGKILLs."""

from __future__ import annotations

import collections
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from abs_engine import Dataflow
from abs_engine.errors import InputError
from abs_engine.testing import GatedSource, KillOnCheckpoints, write_zipf_corpus
from operators import ArrowTextSource, FileSink, ParquetSource, TextFileSource
from operators.base import OperatorContext
from operators.files import SourceChangedError

TEXT = "héllo wörld\n\nsecond  line\r\n\tthird\u3000line\nlast line without newline"


def read_all(src: Any, index: int = 0, parallelism: int = 1, state: Any = None, limit: int | None = None) -> list[Any]:
    src.open(OperatorContext("src", index, parallelism, 0, state is not None))
    if state is not None:
        src.restore(state)
    out: list[Any] = []
    while limit is None or len(out) < limit:
        b = src.read_batch()
        if b is None:
            break
        out += b
    return out


def lines_of(batches: list[Any]) -> list[str]:
    return [s for b in batches for s in b.column("line").to_pylist()]


@pytest.mark.parametrize("batch_bytes", [4, 64, 1 << 20])
@pytest.mark.parametrize("parallelism", [1, 3])
def test_arrow_text_lines_equal_the_text_sources(tmp_path: Path, batch_bytes: int, parallelism: int) -> None:
    path = tmp_path / "t.txt"
    path.write_text(TEXT * 20, encoding="utf-8")
    for i in range(parallelism):
        want = read_all(TextFileSource(path, batch_bytes), i, parallelism)
        assert lines_of(read_all(ArrowTextSource(path, batch_bytes), i, parallelism)) == want


def test_arrow_text_restores_at_its_offset_and_rescales_without_loss(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("".join(f"line {i}\n" for i in range(2_000)), encoding="utf-8")
    src = ArrowTextSource(path, batch_bytes=512)
    first = lines_of(read_all(src, 0, 2, limit=5))
    state = src.snapshot(1)
    rest = lines_of(read_all(ArrowTextSource(path, 512), 0, 2, state=state))
    assert first + rest == read_all(TextFileSource(path), 0, 2)
    # rescale 2 -> 3 from mid-read offsets: every unread line exactly once
    other = ArrowTextSource(path, 512)
    seen = lines_of(read_all(other, 1, 2, limit=3))
    olds = [state, other.snapshot(1)]
    again: list[str] = []
    for i in range(3):
        s = ArrowTextSource(path, 512)
        s.open(OperatorContext("src", i, 3, 1, True))
        again += lines_of(read_all(ArrowTextSource(path, 512), i, 3, state=s.rescale_state(olds, i, 3, lambda k: True)))
    assert collections.Counter(first + seen + again) == collections.Counter(f"line {i}" for i in range(2_000))


def test_arrow_text_refuses_invalid_utf8_naming_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(b"fine\nbro\xffken\n")
    with pytest.raises(InputError, match=r"not valid UTF-8 near byte 8"):
        read_all(ArrowTextSource(path))


def write_parquet(path: Path, n: int, row_group: int, offset: int = 0) -> None:
    pq.write_table(pa.table({"id": list(range(offset, offset + n)), "word": [f"w{i % 17}" for i in range(n)]}),
                   path, row_group_size=row_group)


def ids_of(batches: list[Any]) -> list[int]:
    return [i for b in batches for i in b.column("id").to_pylist()]


def test_parquet_reads_every_row_once_across_subtasks_files_and_row_groups(tmp_path: Path) -> None:
    d = tmp_path / "in"
    d.mkdir()
    write_parquet(d / "a.parquet", 1_000, 300)
    write_parquet(d / "b.parquet", 500, 128, offset=1_000)
    (d / "_SUCCESS").write_text("")
    got = []
    for i in range(3):
        batches = read_all(ParquetSource(d, columns=["id"], batch_rows=100), i, 3)
        assert all(b.num_rows <= 100 and b.schema.names == ["id"] for b in batches)
        got += ids_of(batches)
    assert sorted(got) == list(range(1_500))


def test_parquet_restores_mid_row_group_and_rescales(tmp_path: Path) -> None:
    path = tmp_path / "a.parquet"
    write_parquet(path, 3_000, 1_000)
    a, b = ParquetSource(path, batch_rows=150), ParquetSource(path, batch_rows=150)
    head = ids_of(read_all(a, 0, 2, limit=4)) + ids_of(read_all(b, 1, 2, limit=1))
    olds = [a.snapshot(1), b.snapshot(1)]
    assert ids_of(read_all(ParquetSource(path, batch_rows=150), 0, 2, state=olds[0])) == ids_of(
        read_all(ParquetSource(path, batch_rows=150), 0, 2))[600:]
    rest = []
    for i in range(3):
        s = ParquetSource(path, batch_rows=150)
        s.open(OperatorContext("src", i, 3, 1, True))
        rest += ids_of(read_all(ParquetSource(path, batch_rows=150), i, 3, state=s.rescale_state(olds, i, 3, None)))
    assert sorted(head + rest) == list(range(3_000))


def test_parquet_refuses_a_changed_file_a_missing_column_and_a_missing_path(tmp_path: Path) -> None:
    path = tmp_path / "a.parquet"
    write_parquet(path, 100, 50)
    src = ParquetSource(path)
    read_all(src, limit=1)
    state = src.snapshot(1)
    write_parquet(path, 120, 50)
    with pytest.raises(SourceChangedError, match="changed since the checkpoint"):
        read_all(ParquetSource(path), state=state)
    with pytest.raises(InputError, match="no column 'price'.*fix ParquetSource"):
        ParquetSource(path, columns=["price"]).check()
    with pytest.raises(InputError, match="does not exist"):
        ParquetSource(tmp_path / "nope").check()
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="without \\*.parquet files"):
        ParquetSource(tmp_path / "empty").check()


def split_words(b: pa.RecordBatch) -> pa.RecordBatch:
    words = pc.list_flatten(pc.utf8_split_whitespace(b.column("line")))
    return pa.record_batch([words.filter(pc.not_equal(words, ""))], names=["word"])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_vectorized_word_count_is_exact_under_sigkills(tmp_path: Path) -> None:
    corpus = write_zipf_corpus(tmp_path / "c.txt", 400_000, 2_000, seed=5)
    with open(corpus, encoding="utf-8") as f:
        expected = collections.Counter(w for line in f for w in line.split())
    flow = Dataflow("vwc", parallelism=2)
    # Each subtask holds after 40 batches until the second kill is behind it (6 checkpoints):
    # both kills fall while the job runs, at any speed of the machine.
    gate = tmp_path / "gate"
    flow.source(GatedSource(ArrowTextSource(corpus, batch_bytes=8 << 10), gate, after=40), name="lines").map_batches(
        split_words, name="words").aggregate_batches("word", name="count").sink(
        FileSink(tmp_path / "out.tsv"), name="sink", parallelism=1)
    chaos = KillOnCheckpoints([2, 5], seed=3)
    res = flow.run(checkpoint_interval=0.02, checkpoint_dir=str(tmp_path / "ck"), chaos=chaos, restart_delay=0,
                   stop_when=lambda r: len(chaos.killed) == 2 and r.checkpoints_completed >= 6 and gate.touch())
    assert res.kills == 2 and len(res.restored_from) >= 2
    got = collections.Counter()
    with open(tmp_path / "out.tsv", encoding="utf-8") as f:
        for line in f:
            word, n = line.rstrip("\n").rsplit("\t", 1)
            assert word not in got  # once per word
            got[word] = int(n)
    assert got == expected
    assert os.path.getsize(tmp_path / "out.tsv") > 0
