import asyncio
import contextlib
import socket
import struct
import time

import pytest

from gateway.transport.errors import PortsExhaustedError
from gateway.transport.rtp_socket import RtpDrain, RtpPortPool, RtpPortRange


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


# ------------------------------------------------------------------------------------------- RtpDrain

needs_drain = pytest.mark.skipif(not RtpDrain.supported(), reason="RtpDrain needs Linux epoll")


def _peer() -> socket.socket:
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.bind(("127.0.0.1", 0))
    return peer


async def _timestamping_on(peer: socket.socket) -> None:
    """Wait (2 s at most) until the host stamps datagrams on arrival; Linux turns it on from a work queue."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    probe.setsockopt(socket.SOL_SOCKET, 35, 1)  # SO_TIMESTAMPNS
    deadline = time.monotonic() + 2.0
    try:
        while True:
            sent = time.time()
            peer.sendto(b"probe", probe.getsockname())
            await asyncio.sleep(0.01)
            _, ancillary, _, _ = probe.recvmsg(64, socket.CMSG_SPACE(16))
            seconds, nanoseconds = struct.unpack("@qq", ancillary[0][2])
            if seconds + nanoseconds * 1e-9 - sent < 0.005:
                return
            assert time.monotonic() < deadline, "receive timestamps were not turned on within 2 s"
    finally:
        probe.close()


@needs_drain
async def test_drain_reads_every_socket_with_the_kernels_arrival_time() -> None:
    pool = RtpPortPool(RtpPortRange(first=41200, last=41299))
    drain = RtpDrain()
    endpoints = [pool.allocate() for _ in range(5)]
    got: list[tuple[int, bytes, tuple[str, int], float]] = []
    for i, endpoint in enumerate(endpoints):
        endpoint.start_drained(drain, lambda d, a, t, i=i: got.append((i, d, a, t)), lambda d, a: None)
    peer = _peer()
    try:
        await _timestamping_on(peer)
        before = time.monotonic()
        for i, endpoint in enumerate(endpoints):
            peer.sendto(bytes([i]) * 172, ("127.0.0.1", endpoint.port))
        after = time.monotonic()
        await asyncio.sleep(0.05)  # the gap between arrival and reading that the arrival time must not contain
        assert drain.drain() == 5
        read_at = time.monotonic()
        assert sorted((i, d) for i, d, _, _ in got) == [(i, bytes([i]) * 172) for i in range(5)]
        assert {a for _, _, a, _ in got} == {peer.getsockname()}
        for _, _, _, arrival in got:
            # loopback delivers inside sendto; the clocks agree to well within a millisecond
            assert before - 0.002 <= arrival <= after + 0.002
            assert read_at - arrival >= 0.045
        assert [e.stats.received for e in endpoints] == [1] * 5
        assert drain.drain() == 0  # nothing left, nothing read twice
    finally:
        peer.close()
        for endpoint in endpoints:
            pool.release(endpoint)
        drain.close()


@needs_drain
async def test_a_flooded_socket_gets_a_bounded_share_of_a_drain_and_keeps_the_rest() -> None:
    pool = RtpPortPool(RtpPortRange(first=41300, last=41399))
    drain = RtpDrain(max_rounds=4)
    flooded, quiet = pool.allocate(), pool.allocate()
    flood: list[bytes] = []
    calm: list[bytes] = []
    flooded.start_drained(drain, lambda d, a, t: flood.append(d), lambda d, a: None)
    quiet.start_drained(drain, lambda d, a, t: calm.append(d), lambda d, a: None)
    peer = _peer()
    try:
        for i in range(100):
            peer.sendto(i.to_bytes(2, "big") * 86, ("127.0.0.1", flooded.port))
        peer.sendto(b"q" * 172, ("127.0.0.1", quiet.port))
        assert drain.drain() == 5
        assert [int.from_bytes(d[:2], "big") for d in flood] == [0, 1, 2, 3]
        assert calm == [b"q" * 172]
        assert drain.rounds_capped == 1
        while drain.drain():
            pass
        assert [int.from_bytes(d[:2], "big") for d in flood] == list(range(100))  # kept in order, none lost
    finally:
        peer.close()
        pool.release(flooded)
        pool.release(quiet)
        drain.close()


@needs_drain
async def test_a_failing_handler_or_a_closed_call_does_not_disturb_the_others() -> None:
    pool = RtpPortPool(RtpPortRange(first=41400, last=41499))
    drain = RtpDrain()
    broken, closed, fine = pool.allocate(), pool.allocate(), pool.allocate()
    got: list[bytes] = []

    def explode(data: bytes, addr: tuple[str, int], arrival: float) -> None:
        raise RuntimeError("bad packet")

    broken.start_drained(drain, explode, lambda d, a: None)
    closed.start_drained(drain, lambda d, a, t: got.append(b"closed " + d), lambda d, a: None)
    fine.start_drained(drain, lambda d, a, t: got.append(d), lambda d, a: None)
    peer = _peer()
    try:
        closed_port = closed.port
        pool.release(closed)  # unregisters before the descriptor can be reused
        assert len(drain) == 2
        reused = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # likely the closed socket's number
        reused.bind(("127.0.0.1", 0))
        peer.sendto(b"to reused", reused.getsockname())
        peer.sendto(b"x" * 172, ("127.0.0.1", broken.port))
        peer.sendto(b"y" * 172, ("127.0.0.1", fine.port))
        with contextlib.suppress(OSError):
            peer.sendto(b"z" * 172, ("127.0.0.1", closed_port))
        assert drain.drain() == 2  # broken's packet was handed on (and failed), fine's arrived
        assert got == [b"y" * 172]
        assert reused.recv(64) == b"to reused"  # the drain did not read a socket it does not own
        reused.close()
    finally:
        peer.close()
        pool.release(broken)
        pool.release(fine)
        drain.close()


@needs_drain
async def test_a_stamped_endpoint_hands_on_when_the_kernel_received_not_when_it_was_read() -> None:
    pool = RtpPortPool(RtpPortRange(first=41500, last=41599))
    endpoint = pool.allocate()
    got: list[tuple[bytes, float, float]] = []
    arrived = asyncio.Event()

    def on_rtp(data: bytes, addr: tuple[str, int], arrival: float) -> None:
        got.append((data, arrival, time.monotonic()))
        arrived.set()

    endpoint.start_stamped(on_rtp, lambda d, a: None)
    peer = _peer()
    try:
        sent_at = time.monotonic()
        peer.sendto(b"r" * 172, ("127.0.0.1", endpoint.port))
        time.sleep(0.08)  # noqa: ASYNC251 - the loop is busy on purpose: the datagram waits to be read
        async with asyncio.timeout(5):
            await arrived.wait()
        (data, arrival, read_at) = got[0]
        assert data == b"r" * 172
        assert sent_at - 0.005 <= arrival <= sent_at + 0.02  # the kernel's stamp: when it was sent on loopback
        assert read_at - arrival >= 0.07  # what the busy loop added is not in the arrival
        assert endpoint.stats.received == 1
    finally:
        peer.close()
        pool.release(endpoint)
