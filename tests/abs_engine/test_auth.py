"""The mutual HMAC handshake: a peer without the secret learns nothing and gets nothing."""

from __future__ import annotations

import socket
import threading

import pytest

from abs_engine import auth
from abs_engine.errors import ProtocolError, ProtocolErrorReason


def _pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair()


def test_both_sides_authenticate_with_the_same_secret() -> None:
    a, b = _pair()
    secret = auth.new_secret()
    errors: list[BaseException] = []

    def server() -> None:
        try:
            auth.server_handshake(a, secret, timeout=5)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=server)
    t.start()
    auth.client_handshake(b, secret, timeout=5)
    t.join()
    assert errors == []


def test_a_client_with_another_secret_is_refused_and_sees_no_proof() -> None:
    a, b = _pair()
    hs = auth.ServerHandshake(auth.new_secret())
    b_challenge = hs.challenge
    wrong = auth.new_secret()
    # what a client with the wrong secret sends
    response = auth.MAGIC + auth._mac(wrong, b"C", b_challenge[4:]) + b"n" * auth.NONCE
    with pytest.raises(ProtocolError) as info:
        hs.feed(response)
    assert info.value.reason is ProtocolErrorReason.AUTH_FAILED
    assert not hs.done


def test_a_server_with_another_secret_is_refused_by_the_client() -> None:
    a, b = _pair()

    def server() -> None:
        try:
            auth.server_handshake(a, auth.new_secret(), timeout=5)
        except ProtocolError:
            a.close()

    t = threading.Thread(target=server)
    t.start()
    with pytest.raises(ProtocolError):
        auth.client_handshake(b, auth.new_secret(), timeout=5)
    t.join()


def test_the_server_reads_no_more_than_the_response_before_verifying() -> None:
    hs = auth.ServerHandshake(auth.new_secret())
    assert hs.wanted() == auth.RESPONSE_SIZE
    assert hs.feed(b"x" * 10) is None
    assert hs.wanted() == auth.RESPONSE_SIZE - 10
    with pytest.raises(ProtocolError):
        hs.feed(b"y" * hs.wanted())


def test_a_silent_peer_times_out() -> None:
    a, b = _pair()
    with pytest.raises(ProtocolError) as info:
        auth.client_handshake(b, auth.new_secret(), timeout=0.3)
    assert info.value.reason is ProtocolErrorReason.HANDSHAKE_TIMEOUT
    hs = auth.ServerHandshake(auth.new_secret(), timeout=0.0)
    assert hs.expired()
