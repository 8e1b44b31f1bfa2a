"""SIP over TLS through the real glue on loopback: the listener, outgoing connections with verification, and every
kind of bad input on the TLS port counted and closed while the transport goes on serving.

Peers here are Python's own ssl stack (a client or server written for each case) and a second SipTransport; the
real phones (baresip, pjsua2) are in tests/e2e/test_sip_tls.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import uvloop

from gateway.sip.config import SipConfig
from gateway.sip.endpoint import SipEndpoint
from gateway.sip.events import OptionsAnswered, Outgoing, SipEvent
from gateway.transport.self_signed import SelfSignedPair, ensure_self_signed
from gateway.transport.sip_transport import SipTransport
from gateway.transport.tls import SipTlsConfig, TlsContexts
from tests.support.procs import free_ports

pytestmark = pytest.mark.timeout(60)


def options(transport: str = "TLS", call_id: str = "tls-1", extra: str = "") -> bytes:
    return (
        f"OPTIONS sip:agent@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/{transport} 127.0.0.1:9;branch=z9hG4bK{call_id}\r\n"
        f"Max-Forwards: 70\r\nFrom: <sip:a@127.0.0.1>;tag=1\r\nTo: <sip:agent@127.0.0.1>\r\n"
        f"Call-ID: {call_id}\r\nCSeq: 1 OPTIONS\r\n{extra}Content-Length: 0\r\n\r\n"
    ).encode()


@pytest.fixture
def pair(tmp_path: Path) -> SelfSignedPair:
    return ensure_self_signed(tmp_path / "gw", ("localhost", "127.0.0.1"))


class Gateway:
    """One SipTransport with UDP, TCP and TLS on free loopback ports; its events are kept."""

    def __init__(self, tls: SipTlsConfig, *, idle_timeout_s: float = 300.0, max_connections: int = 64) -> None:
        self.port, self.tls_port = free_ports(2)
        self.events: list[SipEvent] = []
        self.changed = asyncio.Event()
        self.endpoint = SipEndpoint(
            SipConfig(local_port=self.port, tls_port=self.tls_port, transports=("udp", "tcp", "tls"))
        )
        self.transport = SipTransport(
            self.endpoint,
            host="127.0.0.1",
            port=self.port,
            transports=("udp", "tcp", "tls"),
            on_events=self._on_events,
            tls=TlsContexts(tls),
            tls_port=self.tls_port,
            idle_timeout_s=idle_timeout_s,
            max_tcp_connections=max_connections,
        )

    def _on_events(self, events: list[SipEvent]) -> None:
        self.events.extend(events)
        self.changed.set()

    @property
    def stats(self):  # type: ignore[no-untyped-def]
        return self.transport.stats

    async def wait_for(self, what: Callable[[], object], *, within: float = 10.0) -> object:
        deadline = time.monotonic() + within
        while not (result := what()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"condition not met in {within} s; stats {self.stats}")
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), timeout=min(remaining, 0.05))
        return result


@contextlib.asynccontextmanager
async def running(tls: SipTlsConfig, **kwargs: float) -> AsyncIterator[Gateway]:
    gateway = Gateway(tls, **kwargs)  # type: ignore[arg-type]
    await gateway.transport.start()
    try:
        yield gateway
    finally:
        await gateway.transport.aclose()


def client_context(ca: Path | None, *, cert: SelfSignedPair | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca) if ca else None)
    if cert is not None:
        context.load_cert_chain(cert.cert_file, cert.key_file)
    return context


async def tls_client(
    port: int, context: ssl.SSLContext, server_hostname: str = "127.0.0.1"
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname=server_hostname), timeout=5
    )


async def closed_by_peer(reader: asyncio.StreamReader, within: float = 5.0) -> bool:
    """True when the other side closed (EOF or reset) within ``within`` seconds."""
    try:
        while await asyncio.wait_for(reader.read(4096), timeout=within):
            pass
    except (ConnectionError, ssl.SSLError):
        return True
    return True


def server_tls(pair: SelfSignedPair, **kwargs: object) -> SipTlsConfig:
    return SipTlsConfig(cert_file=pair.cert_file, key_file=pair.key_file, **kwargs)  # type: ignore[arg-type]


# --- the listener -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"])
def test_a_request_over_tls_is_answered_on_its_connection_and_plaintext_is_refused(
    pair: SelfSignedPair, loop_factory: Callable[[], asyncio.AbstractEventLoop]
) -> None:
    async def scenario() -> None:
        async with running(server_tls(pair, handshake_timeout_s=5.0)) as gateway:
            # Plaintext SIP to the TLS port: closed at once (not at the handshake timeout), counted as not TLS.
            started = time.monotonic()
            reader, writer = await asyncio.open_connection("127.0.0.1", gateway.tls_port)
            writer.write(options("TCP"))
            assert await closed_by_peer(reader)
            assert time.monotonic() - started < 2.0
            writer.close()
            assert gateway.stats.tls_not_tls == 1
            # A real TLS client, its request dribbled 7 bytes at a time, is answered on its own connection.
            reader, writer = await tls_client(gateway.tls_port, client_context(pair.cert_file))
            message = options()
            for i in range(0, len(message), 7):
                writer.write(message[i : i + 7])
                await writer.drain()
            assert await asyncio.wait_for(reader.readline(), timeout=5) == b"SIP/2.0 200 OK\r\n"
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            assert b"Via: SIP/2.0/TLS 127.0.0.1:9;branch=z9hG4bKtls-1\r\n" in head
            assert writer.get_extra_info("ssl_object").version() in ("TLSv1.2", "TLSv1.3")
            assert (gateway.stats.tls_received, gateway.stats.tls_connections) == (1, 1)
            assert gateway.transport.connection_counts() == {"tcp": 0, "tls": 1}
            writer.close()

    runner = asyncio.Runner(loop_factory=loop_factory)
    with runner:
        runner.run(scenario())


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning")
async def test_garbage_a_stalled_handshake_and_an_old_protocol_are_each_counted_and_closed(
    pair: SelfSignedPair,
) -> None:
    async with running(server_tls(pair, handshake_timeout_s=0.5)) as gateway:
        # A "handshake record" of noise.
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.tls_port)
        writer.write(b"\x16\x03\x01\x00\x05hello" + bytes(range(256)))
        assert await closed_by_peer(reader)
        writer.close()
        await gateway.wait_for(lambda: gateway.stats.tls_handshake_failed == 1)
        # Connected, then silent: closed by the handshake timeout.
        started = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.tls_port)
        assert await closed_by_peer(reader)
        assert 0.4 < time.monotonic() - started < 3.0
        assert gateway.stats.tls_handshake_timeout == 1
        writer.close()
        # Half a ClientHello, then nothing: the same.
        raw_reader, raw_writer = await asyncio.open_connection("127.0.0.1", gateway.tls_port)
        hello = ssl.create_default_context().wrap_bio(ssl.MemoryBIO(), (out := ssl.MemoryBIO()), server_hostname="x")
        with contextlib.suppress(ssl.SSLWantReadError):
            hello.do_handshake()
        raw_writer.write(out.read()[:20])
        assert await closed_by_peer(raw_reader)
        assert gateway.stats.tls_handshake_timeout == 2
        raw_writer.close()
        # TLS 1.1 only: refused (the gateway takes 1.2 and newer).
        old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        old.check_hostname, old.verify_mode = False, ssl.CERT_NONE
        old.minimum_version = old.maximum_version = ssl.TLSVersion.TLSv1_1
        with pytest.raises((ssl.SSLError, ConnectionError)):  # (this OpenSSL may refuse 1.1 before sending)
            await tls_client(gateway.tls_port, old)
        # After all that, a good client is served.
        reader, writer = await tls_client(gateway.tls_port, client_context(pair.cert_file))
        writer.write(options())
        assert await asyncio.wait_for(reader.readline(), timeout=5) == b"SIP/2.0 200 OK\r\n"
        writer.close()
        assert gateway.stats.tls_connections == 1 and gateway.endpoint.stats.internal_errors == 0


async def test_oversize_and_unframeable_messages_over_tls_close_only_their_connection(pair: SelfSignedPair) -> None:
    async with running(server_tls(pair)) as gateway:
        context = client_context(pair.cert_file)
        keeper_reader, keeper = await tls_client(gateway.tls_port, context)
        keeper.write(options(call_id="keep-1"))
        head = await asyncio.wait_for(keeper_reader.readuntil(b"\r\n\r\n"), timeout=5)
        assert head.startswith(b"SIP/2.0 200 OK\r\n")
        cases = (
            (options().replace(b"Content-Length: 0", b"Content-Length: 99999999"), "tls_closed_oversize"),
            (b"OPTIONS sip:a@b SIP/2.0\r\nX: " + b"y" * 70_000, "tls_closed_oversize"),
            (options().replace(b"Content-Length: 0", b"Content-Length: 2\r\nl: 3"), "tls_closed_unframeable"),
            (options().replace(b"Content-Length: 0", b"Content-Length: 0x10"), "tls_closed_unframeable"),
        )
        for data, counter in cases:
            before = getattr(gateway.stats, counter)
            reader, writer = await tls_client(gateway.tls_port, context)
            writer.write(data)
            assert await closed_by_peer(reader), counter
            await gateway.wait_for(lambda c=counter, b=before: getattr(gateway.stats, c) == b + 1)  # type: ignore[misc]
            writer.close()
        keeper.write(options(call_id="keep-2"))  # the connection that behaved is still served
        assert await asyncio.wait_for(keeper_reader.readline(), timeout=5) == b"SIP/2.0 200 OK\r\n"
        keeper.close()


async def test_client_certificates_when_required(pair: SelfSignedPair, tmp_path: Path) -> None:
    client = ensure_self_signed(tmp_path / "client", ("client.example",))
    stranger = ensure_self_signed(tmp_path / "stranger", ("stranger.example",))
    async with running(server_tls(pair, client_certs="required", ca_file=client.cert_file)) as gateway:
        for cert in (None, stranger):
            reader, writer = await tls_client(gateway.tls_port, client_context(pair.cert_file, cert=cert))
            # TLS 1.3: the client learns of the refusal on its first read.
            writer.write(options())
            assert await closed_by_peer(reader)
            writer.close()
        await gateway.wait_for(lambda: gateway.stats.tls_verify_failed == 2)
        reader, writer = await tls_client(gateway.tls_port, client_context(pair.cert_file, cert=client))
        writer.write(options())
        assert await asyncio.wait_for(reader.readline(), timeout=5) == b"SIP/2.0 200 OK\r\n"
        writer.close()


async def test_idle_tls_connections_are_closed_and_over_the_cap_refused(pair: SelfSignedPair) -> None:
    async with running(server_tls(pair), idle_timeout_s=0.4, max_connections=2) as gateway:
        context = client_context(pair.cert_file)
        clients = [await tls_client(gateway.tls_port, context) for _ in range(2)]
        for reader, writer in clients:
            writer.write(options())
            assert await asyncio.wait_for(reader.readline(), timeout=5) == b"SIP/2.0 200 OK\r\n"
        with contextlib.suppress(ssl.SSLError, ConnectionError, TimeoutError):
            reader, writer = await tls_client(gateway.tls_port, context)
            assert await closed_by_peer(reader)
            writer.close()
        assert gateway.stats.tls_refused == 1
        for reader, writer in clients:  # then both fall idle and are closed
            assert await closed_by_peer(reader, within=5.0)
            writer.close()
        assert gateway.stats.tls_closed_idle == 2
        assert gateway.transport.connection_counts()["tls"] == 0


# --- outgoing -----------------------------------------------------------------------------------------------


async def test_outgoing_tls_verifies_the_dialled_name_reuses_the_connection_and_reports_failures(
    pair: SelfSignedPair, tmp_path: Path
) -> None:
    other = ensure_self_signed(tmp_path / "other", ("localhost", "127.0.0.1"))
    async with running(server_tls(other)) as peer:
        # Trusting the peer's certificate: delivered, answered, and the second request takes the same connection.
        async with running(server_tls(pair, ca_file=other.cert_file)) as gateway:
            for _ in range(2):
                request = gateway.endpoint.send_options(
                    f"sip:agent@127.0.0.1:{peer.tls_port};transport=tls", gateway.transport.now()
                )
                gateway.transport.pump()
                answered = await gateway.wait_for(
                    lambda r=request: [
                        e for e in gateway.events if isinstance(e, OptionsAnswered) and e.request_id == r
                    ]  # type: ignore[misc]
                )
                assert answered == [OptionsAnswered(request_id=request, status=200)]
            assert gateway.stats.tls_connections == 1 and peer.stats.tls_connections == 1
        # Not trusting it (the system store): the request fails at once as a 503, counted as a refused certificate.
        async with running(server_tls(pair)) as gateway:
            started = time.monotonic()
            request = gateway.endpoint.send_options(f"sips:agent@127.0.0.1:{peer.tls_port}", gateway.transport.now())
            gateway.transport.pump()
            await gateway.wait_for(lambda: gateway.events)
            assert gateway.events == [OptionsAnswered(request_id=request, status=503)]
            assert time.monotonic() - started < 3.0
            assert gateway.stats.tls_verify_failed == 1 and gateway.stats.tls_connections == 0
    # Nobody listening: a connect failure, at once.
    async with running(server_tls(pair)) as gateway:
        closed_port = free_ports(1)[0]
        request = gateway.endpoint.send_options(
            f"sip:agent@127.0.0.1:{closed_port};transport=tls", gateway.transport.now()
        )
        gateway.transport.pump()
        await gateway.wait_for(lambda: gateway.events)
        assert gateway.events == [OptionsAnswered(request_id=request, status=503)]
        assert gateway.stats.tls_connect_failed == 1


async def test_outgoing_tls_sends_sni_and_refuses_a_certificate_for_another_name(
    pair: SelfSignedPair, tmp_path: Path
) -> None:
    elsewhere = ensure_self_signed(tmp_path / "elsewhere", ("sip.elsewhere.example",))
    seen: list[str | None] = []
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(elsewhere.cert_file, elsewhere.key_file)
    context.sni_callback = lambda sslobj, name, ctx: seen.append(name)  # type: ignore[assignment, misc, return-value]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    try:
        # Trusted issuer, wrong name ("localhost" dialled, sip.elsewhere.example served): refused.
        async with running(server_tls(pair, ca_file=elsewhere.cert_file)) as gateway:
            call = gateway.endpoint.invite(
                f"sip:agent@localhost:{port};transport=tls",
                gateway.transport.now(),
                from_uri="sip:gw@127.0.0.1",
                body=b"",
            )
            gateway.transport.pump()
            await gateway.wait_for(lambda: gateway.events)
            failed = gateway.events[0]
            assert type(failed).__name__ == "OutboundCallFailed"
            assert (failed.call, failed.status, failed.transport_error) == (call, 503, "tls")  # type: ignore[union-attr]
            assert "certificate verify failed: Hostname mismatch" in failed.reason, failed  # type: ignore[union-attr]
            assert seen == ["localhost"]
            assert gateway.stats.tls_verify_failed == 1
    finally:
        server.close()
        await server.wait_closed()


async def test_a_server_that_never_finishes_the_handshake_fails_the_call_at_the_timeout(pair: SelfSignedPair) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # takes the ClientHello and says nothing
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with running(server_tls(pair, handshake_timeout_s=0.5)) as gateway:
            started = time.monotonic()
            gateway.endpoint.invite(
                f"sips:agent@127.0.0.1:{port}", gateway.transport.now(), from_uri="sip:gw@127.0.0.1", body=b""
            )
            gateway.transport.pump()
            await gateway.wait_for(lambda: gateway.events)
            failed = gateway.events[0]
            assert failed.transport_error == "tls" and "timed out" in failed.reason  # type: ignore[union-attr]
            assert 0.4 < time.monotonic() - started < 3.0
            assert gateway.stats.tls_handshake_timeout == 1
    finally:
        server.close()
        await server.wait_closed()


async def test_a_request_naming_a_flow_goes_on_that_connection(pair: SelfSignedPair) -> None:
    async with running(server_tls(pair)) as gateway:
        reader, writer = await tls_client(gateway.tls_port, client_context(pair.cert_file))
        writer.write(options())
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
        local = writer.get_extra_info("sockname")
        flow = (str(local[0]), int(local[1]))
        # Addressed to a port nobody listens on, but naming the client's connection: it arrives there.
        nowhere = ("127.0.0.1", free_ports(1)[0])
        gateway.transport.streams.send(
            Outgoing(data=options(call_id="back"), destination=nowhere, transport="tls", flow=flow)
        )
        assert await asyncio.wait_for(reader.readline(), timeout=5) == b"OPTIONS sip:agent@127.0.0.1 SIP/2.0\r\n"
        writer.close()


def test_tls_contexts_pick_up_a_renewed_certificate(pair: SelfSignedPair, tmp_path: Path) -> None:
    contexts = TlsContexts(server_tls(pair, reload_check_s=0))
    first = contexts.fingerprint
    assert first == pair.fingerprint
    assert not contexts.maybe_reload(1.0)  # unchanged
    pair.key_file.write_text("not a key")  # half-written renewal: kept the old contexts
    assert not contexts.maybe_reload(2.0) and contexts.reload_failures == 1
    renewed = ensure_self_signed(tmp_path / "gw", ("localhost", "127.0.0.1", "sip.example.org"))
    assert renewed.created
    assert contexts.maybe_reload(3.0) and contexts.fingerprint == renewed.fingerprint != first


def test_self_signed_pair_is_kept_while_it_fits_and_made_again_when_not(tmp_path: Path) -> None:
    first = ensure_self_signed(tmp_path, ("localhost", "127.0.0.1"))
    assert first.created and (first.key_file.stat().st_mode & 0o777) == 0o600
    again = ensure_self_signed(tmp_path, ("127.0.0.1",))
    assert not again.created and again.fingerprint == first.fingerprint
    wider = ensure_self_signed(tmp_path, ("127.0.0.1", "203.0.113.5"))
    assert wider.created and wider.fingerprint != first.fingerprint
