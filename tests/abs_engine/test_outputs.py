"""One output, one writer (outputs.py): two sinks on one file, directory or URI are a
GraphError at build naming both."""

from __future__ import annotations

import os

import pytest

from abs_engine import Dataflow
from abs_engine.errors import GraphError, GraphErrorReason
from abs_engine.outputs import overlap
from abs_engine.testing import CapturingSink, TestingSource
from operators import FileSink
from operators.parquet import ParquetSink


def two_sinks(first: object, second: object) -> GraphError:
    flow = Dataflow("job")
    s = flow.source(TestingSource(range(10)))
    s.sink(first, name="first")  # type: ignore[arg-type]
    with pytest.raises(GraphError) as e:
        s.map(str).sink(second, name="second")  # type: ignore[arg-type]
    return e.value


def test_two_file_sinks_on_one_path_are_refused_naming_both(tmp_path) -> None:  # type: ignore[no-untyped-def]
    e = two_sinks(FileSink(tmp_path / "out.tsv"), FileSink(str(tmp_path / "sub" / ".." / "out.tsv")))
    assert e.reason is GraphErrorReason.SHARED_OUTPUT and e.operator == "first"
    assert "'second'" in str(e) and "'first'" in str(e)


def test_a_sink_inside_another_sinks_directory_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    two_sinks(ParquetSink(tmp_path / "parts", ["x"]), FileSink(tmp_path / "parts" / "extra.tsv"))
    two_sinks(CapturingSink(tmp_path / "cap"), FileSink(tmp_path / "cap"))


def test_a_symlink_to_the_same_place_is_the_same_place(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    two_sinks(FileSink(tmp_path / "real" / "o"), FileSink(tmp_path / "link" / "o"))


def test_uris_compare_without_their_query() -> None:
    assert overlap("s3://bucket/out?endpoint_override=a", "s3://bucket/out/part?region=x")
    assert not overlap("s3://bucket/out", "s3://other/out")
    assert not overlap("s3://bucket/out", "s3://bucket/outer")
    assert not overlap("/data/out", "s3://bucket/data/out")


def test_distinct_outputs_pass(tmp_path) -> None:  # type: ignore[no-untyped-def]
    flow = Dataflow("job")
    s = flow.source(TestingSource(range(10)))
    s.sink(FileSink(tmp_path / "a"), name="a")
    s.sink(FileSink(tmp_path / "ab"), name="ab")  # a name prefix is another place
    s.sink(CapturingSink(tmp_path / "c"), name="c")
