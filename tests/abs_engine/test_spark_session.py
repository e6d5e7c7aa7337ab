"""Where the embedded session's driver listens (abs_engine/spark_session.py): loopback on
one machine; on a standalone cluster, this machine's address on its route to the master,
which executors on other machines can reach."""

from __future__ import annotations

import pytest

from abs_engine import spark_session
from abs_engine.spark_session import choose_address, driver_address


@pytest.mark.parametrize("master", [None, "local", "local[4]", "local-cluster[2,1,1024]"])
def test_a_local_master_keeps_the_driver_on_loopback(master):
    assert driver_address(master, "10.1.2.3") == "127.0.0.1"  # (the user's SPARK_LOCAL_IP is not for it)


def test_a_standalone_master_gets_the_address_on_the_route_to_it():
    assert driver_address("spark://127.0.0.1:7077") == "127.0.0.1"
    assert driver_address("spark://127.0.0.1") == "127.0.0.1"  # the default port
    assert driver_address("spark://127.0.0.1:7077,127.0.0.2:7077") == "127.0.0.1"  # an HA list: the first
    assert driver_address("spark://127.0.0.1:99999") is None  # no such port: Spark's own choice, no crash


def test_the_users_address_wins_and_other_masters_are_left_to_spark():
    assert driver_address("spark://127.0.0.1:7077", "10.1.2.3") == "10.1.2.3"
    assert driver_address("yarn") is None
    assert driver_address("k8s://https://api:6443") is None


def test_a_cluster_session_after_a_local_one_is_not_kept_on_loopback(monkeypatch):
    """The engine exports SPARK_LOCAL_IP for its session; a later session on a cluster
    must not take that for the user's choice. The user's own value is kept either way."""
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    monkeypatch.setattr(spark_session, "_set_local_ip", None)
    assert choose_address("local[2]") == "127.0.0.1"
    import os

    assert os.environ["SPARK_LOCAL_IP"] == "127.0.0.1"
    monkeypatch.setattr(spark_session, "driver_address", lambda master, ip=None: ip or "10.9.8.7")
    assert choose_address("spark://master:7077") == "10.9.8.7"
    assert os.environ["SPARK_LOCAL_IP"] == "10.9.8.7"
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.1.2.3")  # the user's
    assert choose_address("spark://master:7077") == "10.1.2.3"
    assert os.environ["SPARK_LOCAL_IP"] == "10.1.2.3"
