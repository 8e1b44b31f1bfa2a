import asyncio

from gateway.sip.config import SipConfig
from gateway.sip.endpoint import SipEndpoint
from gateway.transport.sip_transport import SipTransport
from tests.support.procs import free_ports

OPTIONS = (
    b"OPTIONS sip:agent@127.0.0.1 SIP/2.0\r\n"
    b"Via: SIP/2.0/TCP 127.0.0.1:9;branch=z9hG4bKtcp1\r\n"
    b"Max-Forwards: 70\r\nFrom: <sip:a@127.0.0.1>;tag=1\r\nTo: <sip:agent@127.0.0.1>\r\n"
    b"Call-ID: tcp-1\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n"
)


async def _transport(max_tcp: int) -> SipTransport:
    port = free_ports(1)[0]
    transport = SipTransport(
        SipEndpoint(SipConfig(local_port=port)),
        host="127.0.0.1",
        port=port,
        transports=("tcp",),
        on_events=lambda events: None,
        max_tcp_connections=max_tcp,
    )
    await transport.start()
    return transport


async def test_a_request_dribbled_over_tcp_is_answered_on_its_connection() -> None:
    transport = await _transport(8)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", transport.port)
        for i in range(0, len(OPTIONS), 7):
            writer.write(OPTIONS[i : i + 7])
            await writer.drain()
        status = await asyncio.wait_for(reader.readline(), timeout=5)
        assert status == b"SIP/2.0 200 OK\r\n"
        writer.close()
    finally:
        await transport.aclose()


async def test_connections_beyond_the_cap_are_closed_at_once() -> None:
    transport = await _transport(2)
    try:
        kept = [await asyncio.open_connection("127.0.0.1", transport.port) for _ in range(2)]
        for reader, writer in kept:  # make sure both are registered before the third arrives
            writer.write(OPTIONS)
            assert await asyncio.wait_for(reader.readline(), timeout=5) == b"SIP/2.0 200 OK\r\n"
        reader, writer = await asyncio.open_connection("127.0.0.1", transport.port)
        assert await asyncio.wait_for(reader.read(), timeout=5) == b""  # closed by the gateway
        assert transport.stats.tcp_refused == 1
        for _, w in [*kept, (reader, writer)]:
            w.close()
    finally:
        await transport.aclose()
