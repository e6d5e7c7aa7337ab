"""Where the embedded session's driver listens (abs_engine/spark_session.py): loopback on
one machine; on a standalone cluster, this machine's address on its route to the master,
which executors on other machines can reach."""

from __future__ import annotations

import pytest

from abs_engine.spark_session import driver_address


@pytest.mark.parametrize("master", [None, "local", "local[4]", "local-cluster[2,1,1024]"])
def test_a_local_master_keeps_the_driver_on_loopback(master, monkeypatch):
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.1.2.3")  # not for a local master
    assert driver_address(master) == "127.0.0.1"


def test_a_standalone_master_gets_the_address_on_the_route_to_it(monkeypatch):
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    assert driver_address("spark://127.0.0.1:7077") == "127.0.0.1"
    assert driver_address("spark://127.0.0.1") == "127.0.0.1"  # the default port
    # An HA list: the first master's route.
    assert driver_address("spark://127.0.0.1:7077,127.0.0.2:7077") == "127.0.0.1"


def test_spark_local_ip_wins_and_other_masters_are_left_to_spark(monkeypatch):
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.1.2.3")
    assert driver_address("spark://127.0.0.1:7077") == "10.1.2.3"
    monkeypatch.delenv("SPARK_LOCAL_IP")
    assert driver_address("yarn") is None
    assert driver_address("k8s://https://api:6443") is None
