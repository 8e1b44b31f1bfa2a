from __future__ import annotations

import socket

import pytest

from gateway.transport.ports import free_port


@pytest.mark.parametrize("kind", [socket.SOCK_STREAM, socket.SOCK_DGRAM])
def test_the_port_named_can_be_bound_on_that_host_and_kind(kind: int) -> None:
    port = free_port(kind=kind)
    assert 1024 <= port <= 65535
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", port))


def test_an_ipv6_host_gets_an_ipv6_port() -> None:
    if not socket.has_ipv6:
        pytest.skip("this Python has no IPv6")
    try:
        port = free_port("::1", kind=socket.SOCK_DGRAM)
    except OSError as exc:  # no ::1 on this host's loopback
        pytest.skip(f"IPv6 loopback unavailable: {exc}")
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sock:
        sock.bind(("::1", port))
