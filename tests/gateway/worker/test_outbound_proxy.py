"""A worker with GATEWAY_SIP_OUTBOUND_PROXY on loopback: the call it places goes to the proxy (a scripted SBC that
answers itself) with a loose-routing Route naming it and the Request-URI of the real target, whose host does not
resolve; the media then flows both ways. And the settings: host:port shorthand, refusals that name the setting."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from gateway.sip.events import CallOffered
from gateway.worker.settings import WorkerSettings
from tests.gateway.worker.sip_peer import SipPeer, echo_worker
from tests.gateway.worker.test_worker import speechlike

pytestmark = pytest.mark.timeout(60)


async def test_a_placed_call_goes_to_the_outbound_proxy_with_its_route() -> None:
    from gateway.fleet.models import AdmissionDecision, OriginateRequest

    async with (
        SipPeer() as proxy,
        echo_worker(worker_id="w-proxy", rtp_timeout_s=5.0, sip_outbound_proxy=f"127.0.0.1:{proxy.port}") as worker,
    ):
        await worker.originate(
            OriginateRequest(to="sip:+15550100@carrier.invalid"),
            AdmissionDecision(accepted=True, call_id="c-proxy", route="default"),
        )
        offered = await proxy.wait_for(CallOffered)
        assert isinstance(offered, CallOffered)
        assert offered.request_uri == "sip:+15550100@carrier.invalid"
        assert [v for n, v in offered.headers if n.lower() == "route"] == [f"<sip:127.0.0.1:{proxy.port};lr>"]
        call = proxy.answer(offered)
        await proxy.stream(call, speechlike(1.0))
        leg = worker.legs["c-proxy"]
        snapshot = worker.snapshot_of(leg)
        assert snapshot.stats.rtp_packets_in >= 40
        proxy.hang_up(call)
        await asyncio.wait_for(leg.task, timeout=5)  # type: ignore[arg-type]
        assert leg.end_reason != "resolve_failed" and len(proxy.heard(call)) > 4000


def test_the_proxy_setting_takes_host_port_and_refuses_what_cannot_work(monkeypatch: pytest.MonkeyPatch) -> None:
    assert WorkerSettings().trunking.sip_outbound_proxy is None
    monkeypatch.setenv("GATEWAY_SIP_OUTBOUND_PROXY", " sbc.example.net:5080 ")
    assert WorkerSettings().trunking.sip_outbound_proxy == "sip:sbc.example.net:5080"
    monkeypatch.setenv("GATEWAY_SIP_OUTBOUND_PROXY", "sips:sbc.example.net")
    with pytest.raises(ValidationError, match=r"sip_outbound_proxy: .* reached over tls, which is not among"):
        WorkerSettings()
    monkeypatch.setenv("GATEWAY_SIP_OUTBOUND_PROXY", "sip:bob@sbc.example.net")
    with pytest.raises(ValidationError, match="URI of a host"):
        WorkerSettings()
    monkeypatch.delenv("GATEWAY_SIP_OUTBOUND_PROXY")
    with pytest.raises(ValidationError, match="needs TLS on every hop"):
        WorkerSettings(
            sip_transports=("udp", "tls"),
            sip_tls_self_signed=True,
            sip_outbound_proxy="sip:sbc.example.net",
            trunk_register=True,
            trunk_registrar="sips:carrier.example",
            trunk_user="u",
        )
