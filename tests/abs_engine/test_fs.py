"""The URI layer (abs_engine/fs.py): which locations are remote, credentials never shown,
and a Store against a real S3-compatible server: bounded reads, atomic puts, listing."""

from __future__ import annotations

import pytest

from abs_engine import fs


def test_local_and_remote_locations_are_told_apart(tmp_path):
    assert not fs.is_remote(str(tmp_path)) and not fs.is_remote(f"file://{tmp_path}")
    assert fs.is_remote("s3://bucket/prefix") and fs.is_remote("hdfs://namenode:8020/ck")
    assert fs.local_path(f"file://{tmp_path}/ck") == f"{tmp_path}/ck"
    assert fs.local_path("relative/dir").endswith("/relative/dir")
    with pytest.raises(ValueError, match="file:///path"):
        fs.local_path("file://otherhost/x")
    with pytest.raises(ValueError, match="not a local path"):
        fs.local_path("s3://bucket/x?secret_key=hunter2")


def test_split_is_joins_inverse_and_keeps_a_uris_query_on_the_parent(tmp_path):
    uri = "s3://bucket/ck/run?endpoint_override=h:9000&scheme=http"
    assert fs.split(fs.join(uri, "gate")) == (uri, "gate")
    assert fs.split(fs.join(str(tmp_path), "gate")) == (str(tmp_path), "gate")
    assert fs.split(f"file://{tmp_path}/gate") == (str(tmp_path), "gate")
    assert fs.split("s3://bucket/gate/") == ("s3://bucket", "gate")
    for root in ("s3://bucket", "s3://bucket/", "s3://bucket?region=x"):
        with pytest.raises(ValueError, match="names no object below its bucket"):
            fs.split(root)


def test_credentials_never_appear_in_what_is_shown():
    shown = fs.redact("s3://bucket/ck?access_key=AKIA1&secret_key=hunter2&endpoint_override=h:9000")
    assert "hunter2" not in shown and "AKIA1" not in shown and "endpoint_override=h:9000" in shown
    assert "pw" not in fs.redact("hdfs://user:pw@namenode:8020/ck")


def test_a_store_refuses_names_that_climb_out(s3_server):
    store = fs.Store(s3_server("names"))
    for bad in ["..", "a/b", "", "."]:
        with pytest.raises(ValueError, match="not a plain name"):
            store.path(bad)


def test_put_read_list_delete_on_s3(s3_server):
    store = fs.Store(s3_server("roundtrip"))
    store.make_root()
    store.put(("d", "x"), b"hello")
    store.put(("d", "x"), b"hello again")  # replaced whole
    assert store.read(("d", "x"), 100) == b"hello again"
    assert store.list() == ["d"] and store.list("d") == ["x"]
    assert store.size("d", "x") == 11 and store.size("d", "nothing") is None
    store.delete_dir("d")
    assert store.list() == [] and not store.exists("d", "x")
    store.delete_dir("d")  # missing is fine


def test_reads_are_bounded_before_anything_is_buffered(s3_server):
    store = fs.Store(s3_server("bounded"))
    store.put(("big",), b"x" * 1000)
    with pytest.raises(fs.TooLarge):
        store.read(("big",), 999)
    assert len(store.read(("big",), 1000)) == 1000
    with pytest.raises(FileNotFoundError):
        store.read(("missing",), 10)


def test_an_unreachable_store_is_a_store_error_naming_it():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    store = fs.Store(f"s3://k:hunter2@b/p?endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1")
    with pytest.raises(fs.StoreError) as info:
        store.make_root()  # (the first thing a job does with a store; it fails at once)
    assert f"127.0.0.1:{port}" in str(info.value) and "hunter2" not in str(info.value)
