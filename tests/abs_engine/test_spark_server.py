"""The partition server's reads in flight and the end of a job (abs_engine/spark_server.py):
the embedded session is stopped only once no partition read runs. Stopping it under a
running read is what made Spark log "Block taskresult_N does not exist" and rejected
status updates at the end of a resumed run. No JVM here: the read is held by a stand-in."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import abs_engine.spark_session as spark_session
from abs_engine.spark_server import PartitionServer, partition_server
from operators import spark as spark_source
from operators.spark import SparkSource, _PartitionStream


def held_read(server: PartitionServer, monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """A read of source "held" that runs until the returned ``release`` is set."""
    started, release = threading.Event(), threading.Event()

    def stream(conn: Any, reg: Any, partition: int, start_row: int) -> int:
        started.set()
        release.wait(30)
        return 0

    monkeypatch.setattr(server, "_stream", stream)
    server.register("held", None, "fp", None)
    stream_client = _PartitionStream(server.address, server.secret, ["held", "fp", 0, 0])
    assert started.wait(10), "the read never started"
    threading.Thread(target=lambda: (release.wait(30), stream_client.close()), daemon=True).start()
    return started, release


def test_wait_idle_waits_for_a_read_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    server = PartitionServer()
    try:
        assert server.wait_idle(0)  # nothing in flight
        _, release = held_read(server, monkeypatch)
        assert not server.wait_idle(0.2)
        release.set()
        assert server.wait_idle(10)
    finally:
        server.close()


def test_the_end_of_a_job_stops_its_session_only_after_the_reads_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    server = partition_server("127.0.0.1")
    _, release = held_read(server, monkeypatch)
    stopped = threading.Event()
    monkeypatch.setattr(spark_session, "stop_embedded", stopped.set)
    monkeypatch.setattr(spark_source, "STOP_WAIT", 30.0)
    src = SparkSource(None, owns_session=True)
    src._server_host = "127.0.0.1"
    ending = threading.Thread(target=src.driver_stop)
    ending.start()
    assert not stopped.wait(0.5), "the session was stopped under a running read"
    release.set()
    ending.join(30)
    assert stopped.is_set() and server.wait_idle(0)
