"""DeltaSink and IcebergSink with their tables on an S3-compatible server (moto's, on
loopback: tests/conftest.py's ``s3_server``): exactly once through an in-process crash and
through SIGKILLs of workers, read back with each format's own reader over S3."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from abs_engine.testing import KillOnCheckpoints, fail_at

from .test_table_sinks import SCHEMA, events, flow_into

pytestmark = pytest.mark.slow


def endpoint(s3_server: Any, prefix: str) -> tuple[str, str]:
    """(the s3:// location of ``prefix``, the server's http endpoint)."""
    uri = urlsplit(s3_server(prefix))
    host = parse_qs(uri.query)["endpoint_override"][0]
    return f"s3://{uri.netloc}{uri.path}", f"http://{host}"


def delta(s3_server: Any, prefix: str) -> tuple[Any, Any]:
    pytest.importorskip("deltalake")
    from operators.delta import DeltaSink

    location, http = endpoint(s3_server, prefix)
    opts = {"AWS_ENDPOINT_URL": http, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}

    def read() -> list[tuple[Any, ...]]:
        import deltalake

        t = deltalake.DeltaTable(location, storage_options=opts).to_pyarrow_table()
        return list(zip(*(t.column(c).to_pylist() for c in ("k", "n", "label"))))

    return DeltaSink(location, SCHEMA, storage_options=opts), read


def iceberg(s3_server: Any, prefix: str, tmp_path: Path) -> tuple[Any, Any]:
    pytest.importorskip("pyiceberg")
    from operators.iceberg import IcebergSink

    location, http = endpoint(s3_server, prefix)
    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": location, "s3.endpoint": http,
             "s3.region": "us-east-1", "s3.access-key-id": "testing", "s3.secret-access-key": "testing"}

    def read() -> list[tuple[Any, ...]]:
        from pyiceberg.catalog import load_catalog

        t = load_catalog("default", **props).load_table("shop.events").scan().to_arrow()
        return list(zip(*(t.column(c).to_pylist() for c in ("k", "n", "label"))))

    return IcebergSink(props, "shop.events", SCHEMA), read


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_crash_in_process_on_s3_equals_the_oracle(s3_server: Any, tmp_path: Path, kind: str) -> None:
    target, read = (delta(s3_server, f"delta-{tmp_path.name}") if kind == "delta"
                    else iceberg(s3_server, f"iceberg-{tmp_path.name}", tmp_path))
    items = events(3_000)
    res = flow_into(target, items, fail_at(1_200)).run(executor="inprocess", checkpoint_interval=0.05,
                                                        checkpoint_dir=str(tmp_path / "ck"))
    assert res.restarts == 1
    assert collections.Counter(read()) == collections.Counter(items)
    assert any(f.endswith(".parquet") for f in objects(s3_server, f"{kind}-{tmp_path.name}"))  # on S3, not local


def objects(s3_server: Any, prefix: str) -> list[str]:
    from pyarrow import fs as pafs

    location, http = endpoint(s3_server, prefix)
    store = pafs.S3FileSystem(endpoint_override=http.removeprefix("http://"), scheme="http", region="us-east-1")
    return [i.path for i in store.get_file_info(pafs.FileSelector(location.removeprefix("s3://"), recursive=True))]


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_sigkills_of_workers_on_s3_leave_the_table_equal_to_the_oracle(s3_server: Any, tmp_path: Path,
                                                                       kind: str) -> None:
    target, read = (delta(s3_server, f"delta-k-{tmp_path.name}") if kind == "delta"
                    else iceberg(s3_server, f"iceberg-k-{tmp_path.name}", tmp_path))
    items = events(20_000, keys=300)
    chaos = KillOnCheckpoints([2, 4], seed=7, open_gate=tmp_path / "gate")
    res = flow_into(target, items, gate=tmp_path / "gate", hold_after=3_000).run(
        checkpoint_interval=0.1, checkpoint_dir=str(tmp_path / "ck"), chaos=chaos)
    assert len(chaos.killed) == 2 and res.restarts == 2
    assert collections.Counter(read()) == collections.Counter(items)
