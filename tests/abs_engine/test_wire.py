"""Connections that give up: a worker's control connection aborts when the driver stops
acknowledging (abs_engine/wire.py ``give_up_after``, Linux TCP_USER_TIMEOUT)."""

from __future__ import annotations

import socket

import pytest

from abs_engine.wire import give_up_after


@pytest.mark.skipif(not hasattr(socket, "TCP_USER_TIMEOUT"), reason="TCP_USER_TIMEOUT is Linux's")
def test_a_connection_gives_up_after_the_time_asked_in_milliseconds():
    with socket.create_server(("127.0.0.1", 0)) as server, \
            socket.create_connection(server.getsockname()) as client:
        assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 0  # the kernel's ~15 min
        give_up_after(client, 3.0)
        assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 3000
        give_up_after(client, 0)  # 0: leave it as it is
        assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 3000


def test_a_socket_that_is_not_tcp_is_left_alone():
    a, b = socket.socketpair()
    with a, b:
        give_up_after(a, 3.0)  # no error: nothing to bound
        a.sendall(b"x")
        assert b.recv(1) == b"x"
