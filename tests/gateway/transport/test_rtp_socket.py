import asyncio
import socket

import pytest

from gateway.transport.rtp_socket import PortsExhaustedError, RtpPortPool, RtpPortRange


async def test_pool_hands_out_even_pairs_and_takes_them_back() -> None:
    pool = RtpPortPool(RtpPortRange(first=41000, last=41005))
    endpoints = [pool.allocate() for _ in range(3)]
    assert [e.port % 2 for e in endpoints] == [0, 0, 0]
    assert len({e.port for e in endpoints}) == 3
    with pytest.raises(PortsExhaustedError):
        pool.allocate()
    pool.release(endpoints[0])
    again = pool.allocate()
    assert again.port == endpoints[0].port
    for e in [again, *endpoints[1:]]:
        pool.release(e)
    assert pool.in_use == frozenset()


async def test_endpoint_delivers_every_datagram_and_sends_back() -> None:
    pool = RtpPortPool(RtpPortRange(first=41100, last=41199))
    endpoint = pool.allocate()
    got: list[tuple[bytes, tuple[str, int]]] = []
    all_in = asyncio.Event()

    def on_rtp(data: bytes, addr: tuple[str, int]) -> None:
        got.append((data, addr))
        if len(got) == 200:
            all_in.set()

    endpoint.start(on_rtp, lambda d, a: None)
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.bind(("127.0.0.1", 0))
    peer.setblocking(False)
    try:
        for i in range(200):
            peer.sendto(i.to_bytes(2, "big") * 86, ("127.0.0.1", endpoint.port))
        await asyncio.wait_for(all_in.wait(), timeout=5)
        assert [int.from_bytes(d[:2], "big") for d, _ in got] == list(range(200))
        assert {a for _, a in got} == {peer.getsockname()}
        endpoint.send_rtp(b"x" * 172, peer.getsockname())
        loop = asyncio.get_running_loop()
        data = await asyncio.wait_for(loop.sock_recv(peer, 2048), timeout=5)
        assert data == b"x" * 172
    finally:
        peer.close()
        pool.release(endpoint)
