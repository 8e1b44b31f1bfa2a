"""SIP over TLS through a real worker on loopback: a scripted phone (our UA core over TLS + libsrtp) calls the echo
agent over TLS with SRTP media and hears itself; the call record and the metrics name the transport; the worker's
outbound calls go over TLS to a sips: target, and end at once with tls_failed when the target cannot be verified."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from gateway.fleet.errors import CommandRejectedError
from gateway.fleet.models import AdmissionDecision, OriginateRequest
from gateway.observability import REGISTRY
from gateway.providers.echo import EchoConfig, EchoModel
from gateway.sip.events import CallOffered, OutboundCallAnswered
from gateway.transport.self_signed import SelfSignedPair, ensure_self_signed
from gateway.transport.tls import SipTlsConfig, TlsContexts
from gateway.worker.settings import WorkerSettings
from gateway.worker.worker import MediaWorker
from tests.gateway.worker.sip_peer import SipPeer, echo_worker
from tests.gateway.worker.test_worker import best_correlation, speechlike
from tests.support.procs import free_ports

pytestmark = pytest.mark.timeout(60)
SUITE = "AES_CM_128_HMAC_SHA1_80"


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
def peer_pair(tmp_path: Path) -> SelfSignedPair:
    return ensure_self_signed(tmp_path / "peer", ("localhost", "127.0.0.1"))


@pytest.fixture
async def worker(tmp_path: Path, peer_pair: SelfSignedPair) -> AsyncIterator[MediaWorker]:
    sip_port, tls_port = free_ports(2)
    async with echo_worker(
        worker_id="w-tls",
        rtp_timeout_s=5.0,
        sip_port=sip_port,
        sip_transports=("udp", "tcp", "tls"),
        sip_tls_port=tls_port,
        sip_tls_self_signed=True,
        sip_tls_ca=peer_pair.cert_file,  # the only peer it trusts
        state_dir=tmp_path / "state",
    ) as w:
        yield w


def _trusting(worker: MediaWorker) -> TlsContexts:
    """A phone's TLS contexts that verify the worker's self-signed certificate."""
    assert worker.sip_tls is not None and worker.sip_tls.config.cert_file is not None
    return TlsContexts(SipTlsConfig(ca_file=worker.sip_tls.config.cert_file))


async def test_a_tls_call_with_srtp_echoes_and_is_recorded_as_tls(worker: MediaWorker) -> None:
    before = _sample("gateway_sip_calls_total", worker="w-tls", transport="tls", direction="inbound")
    async with SipPeer(tls=_trusting(worker)) as peer:
        call = peer.invite(f"sips:agent@127.0.0.1:{worker.sip.tls_port}", srtp=(SUITE,))
        event = await peer.wait_for(OutboundCallAnswered, call=call.handle)
        peer.answered(call, event.body)  # type: ignore[attr-defined]
        assert call.srtp is not None
        sent = speechlike(2.0)
        await peer.stream(call, sent)
        await peer.stream(call, np.zeros(8000, np.int16), frames=15)
        [leg] = list(worker.legs.values())
        snapshot = worker.snapshot_of(leg)
        assert (snapshot.transport, snapshot.srtp, snapshot.codec) == ("tls", SUITE, "PCMU")
        peer.hang_up(call)  # the BYE goes over the TLS connection the call came on
        await asyncio.wait_for(leg.task, timeout=5)  # type: ignore[arg-type]
        assert worker.snapshot_of(leg).end_reason == "caller_hangup"
        correlation = best_correlation(sent, peer.heard(call))
        assert correlation > 0.9, correlation
        # The gateway's answer came from its TLS port with a sips Contact; nothing went over UDP or TCP.
        assert peer.transport.stats.udp_received == 0 and peer.transport.stats.tls_received >= 3
        assert worker.sip.stats.tls_connections == 1 and worker.sip.stats.tcp_connections == 0
    worker.export_counters()
    assert _sample("gateway_sip_calls_total", worker="w-tls", transport="tls", direction="inbound") == before + 1
    assert _sample("gateway_sip_transport_messages_total", worker="w-tls", transport="tls") >= 3
    expiry = _sample("gateway_sip_tls_certificate_expiry_timestamp_seconds", worker="w-tls")
    assert 300 * 86400 < expiry - time.time() < 366 * 86400


async def test_an_outbound_call_to_a_sips_target_goes_over_tls(worker: MediaWorker, peer_pair: SelfSignedPair) -> None:
    callee_tls = TlsContexts(SipTlsConfig(cert_file=peer_pair.cert_file, key_file=peer_pair.key_file))
    async with SipPeer(tls=callee_tls) as callee:
        await worker.originate(
            OriginateRequest(to=f"sips:callee@127.0.0.1:{callee.tls_port}"),
            AdmissionDecision(accepted=True, call_id="c-tls-out", route="default"),
        )
        offered = await callee.wait_for(CallOffered)
        assert isinstance(offered, CallOffered) and offered.transport == "tls"
        assert offered.request_uri == f"sips:callee@127.0.0.1:{callee.tls_port}"
        call = callee.answer(offered, srtp_tag=1)
        sent = speechlike(1.5)
        await callee.stream(call, sent)
        await callee.stream(call, np.zeros(8000, np.int16), frames=15)
        leg = worker.legs["c-tls-out"]
        assert worker.snapshot_of(leg).transport == "tls"
        leg.hang_up("agent_ended")  # our BYE, over the connection we opened
        await asyncio.wait_for(leg.task, timeout=5)  # type: ignore[arg-type]
        assert best_correlation(sent, callee.heard(call)) > 0.9
        invite = next(r for r in callee.requests if r.method == "INVITE")
        assert (invite.headers.get("Via") or "").startswith(f"SIP/2.0/TLS 127.0.0.1:{worker.sip.tls_port};")
        assert invite.headers.get("Contact") == f"<sips:gateway@127.0.0.1:{worker.sip.tls_port}>"
        assert [r.method for r in callee.requests] == ["INVITE", "ACK", "BYE"]
        assert worker.sip.stats.tls_connections == 1  # one connection for the whole dialog


async def test_an_outbound_call_to_an_unverifiable_tls_target_ends_at_once_as_tls_failed(
    worker: MediaWorker, tmp_path: Path
) -> None:
    stranger = ensure_self_signed(tmp_path / "stranger", ("127.0.0.1",))
    before = _sample("gateway_calls_total", worker="w-tls", end_reason="tls_failed")
    async with SipPeer(tls=TlsContexts(SipTlsConfig(cert_file=stranger.cert_file, key_file=stranger.key_file))) as peer:
        started = time.monotonic()
        await worker.originate(
            OriginateRequest(to=f"sip:callee@127.0.0.1:{peer.tls_port};transport=tls"),
            AdmissionDecision(accepted=True, call_id="c-tls-bad", route="default"),
        )
        leg = worker.legs["c-tls-bad"]
        await asyncio.wait_for(leg.task, timeout=5)  # type: ignore[arg-type]
        assert time.monotonic() - started < 3.0  # not Timer B's 32 s
        snapshot = worker.snapshot_of(leg)
        assert (snapshot.state, snapshot.end_reason, snapshot.transport) == ("ended", "tls_failed", "tls")
        assert peer.transport.stats.tls_connections == 0 and peer.endpoint.stats.requests_received == 0
    assert _sample("gateway_calls_total", worker="w-tls", end_reason="tls_failed") == before + 1
    assert worker.sip.stats.tls_verify_failed == 1
    assert worker.legs == {} and worker.ports.in_use == frozenset()


async def test_a_sips_target_on_a_worker_without_tls_is_rejected_before_anything_is_held() -> None:
    sip_port = free_ports(1)[0]
    rtp_low = free_ports(8)[0]
    rtp_low += rtp_low % 2
    settings = WorkerSettings(worker_id="w-plain", sip_port=sip_port, rtp_ports=f"{rtp_low}-{rtp_low + 5}")
    w = MediaWorker(settings, model_factory=lambda name: EchoModel(EchoConfig()))
    await w.start()
    try:
        with pytest.raises(CommandRejectedError, match="TLS"):
            await w.originate(OriginateRequest(to="sips:x@127.0.0.1"), AdmissionDecision(accepted=True, route="r"))
        assert w.legs == {} and w.ports.in_use == frozenset()
    finally:
        await w.aclose()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"sip_transports": "udp,tls"}, "needs sip_tls_cert and sip_tls_key"),
        ({"sip_transports": "udp,tls", "sip_tls_cert": "/c.pem"}, "set both sip_tls_cert and sip_tls_key"),
        (
            {"sip_transports": "tls", "sip_tls_cert": "/c", "sip_tls_key": "/k", "sip_tls_self_signed": True},
            "sip_tls_self_signed is for running without a certificate",
        ),
        ({"sip_transports": "tcp,tls", "sip_tls_self_signed": True, "sip_tls_port": 5060}, "taken by SIP over TCP"),
        ({"sip_transports": "udp,sctp"}, "one or more of udp, tcp, tls"),
        ({"sip_tls_client_certs": "sometimes"}, "sip_tls_client_certs"),
    ],
)
def test_tls_settings_that_cannot_work_are_refused_at_start(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        WorkerSettings(**settings)  # type: ignore[arg-type]


def test_tls_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GATEWAY_SIP_TRANSPORTS", "UDP, tls")
    monkeypatch.setenv("GATEWAY_SIP_TLS_CERT", str(tmp_path / "cert.pem"))
    monkeypatch.setenv("GATEWAY_SIP_TLS_KEY", str(tmp_path / "key.pem"))
    monkeypatch.setenv("GATEWAY_SIP_TLS_CLIENT_CERTS", "Required")
    monkeypatch.setenv("GATEWAY_SIP_TLS_VERIFY_SERVER", "false")
    settings = WorkerSettings()
    assert settings.sip.sip_transports == ("udp", "tls") and settings.tls.sip_tls_port == 5061
    assert (settings.tls.sip_tls_client_certs, settings.tls.sip_tls_verify_server) == ("required", False)
    assert settings.tls.sip_tls_cert == tmp_path / "cert.pem"
