"""Browser calls in the worker: a Python aiortc client against WebRtcCalls with the echo agent.

The worker host is a small stand-in for MediaWorker (id, settings, link, session config, model factory): the
call path under test — admission, CallSession, aiortc peer, reporting, clean-up — is the real one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest

from gateway.fleet.errors import CallNotFoundError, CommandRejectedError
from gateway.fleet.models import (
    AdmissionDecision,
    AdmissionRequest,
    CallSnapshot,
    ProfileModel,
    WorkerEvent,
    WorkerInfo,
)
from gateway.observability import REGISTRY
from gateway.providers.base import RealtimeModel
from gateway.providers.echo import EchoModel
from gateway.session.config import SessionConfig
from gateway.transport.webrtc import CallRefusedError, OfferError
from gateway.worker.counters import CounterExporter
from gateway.worker.webrtc import WebRtcCalls, WebRtcSettings
from tests.gateway.transport.test_webrtc import RATE, browser_stand_in, echo_correlation, speech_like

pytestmark = pytest.mark.timeout(60)


class FakeLink:
    """ControlLink that admits (or refuses) and records every report."""

    def __init__(self, decision: AdmissionDecision | None = None) -> None:
        self.decision = decision
        self.requests: list[AdmissionRequest] = []
        self.events: list[WorkerEvent] = []
        self.changed = asyncio.Event()

    async def register(self, info: WorkerInfo) -> WorkerInfo:
        return info

    async def heartbeat(self, info: WorkerInfo, calls: Sequence[CallSnapshot]) -> WorkerInfo:
        return info

    async def admit(self, request: AdmissionRequest) -> AdmissionDecision:
        self.requests.append(request)
        if self.decision is not None:
            return self.decision
        return AdmissionDecision(
            accepted=True,
            call_id=request.call_id or "",
            worker=request.worker or "",
            route=request.route or "web",
            profile=ProfileModel(name="web", provider="echo", instructions="Plan {metadata.plan}."),
        )

    async def report(self, events: Sequence[WorkerEvent]) -> None:
        self.events.extend(events)
        self.changed.set()

    async def aclose(self) -> None:
        return None

    def kinds(self, call_id: str) -> list[str]:
        return [e.type for e in self.events if e.call is not None and e.call.id == call_id]

    async def wait_event(self, kind: str, call_id: str, *, within: float = 15.0) -> CallSnapshot:
        async with asyncio.timeout(within):
            while True:
                self.changed.clear()
                for event in self.events:
                    if event.type == kind and event.call is not None and event.call.id == call_id:
                        return event.call
                await self.changed.wait()


@dataclass
class Host:
    """The parts of MediaWorker that browser calls use."""

    link: FakeLink | None = None
    id: str = "w-test"
    session_config: SessionConfig = field(default_factory=SessionConfig)
    draining: bool = False
    models: dict[str, RealtimeModel] = field(default_factory=dict)
    counters: CounterExporter = field(default_factory=lambda: CounterExporter("w-test"))

    full: bool = False
    ended_calls: int = 0

    def model_for(self, provider: str) -> RealtimeModel:
        assert provider == "echo"
        return self.models.setdefault(provider, EchoModel())

    def over_capacity(self) -> bool:
        return self.full

    def call_ended(self) -> None:
        self.ended_calls += 1


@pytest.fixture
async def link() -> FakeLink:
    return FakeLink()


@pytest.fixture
async def calls(link: FakeLink) -> AsyncIterator[WebRtcCalls]:
    webrtc = WebRtcCalls(Host(link=link), WebRtcSettings(max_calls=2, connect_timeout_s=5.0))
    try:
        yield webrtc
    finally:
        await webrtc.aclose("test_over")
        assert not webrtc.legs


def _leftover_tasks() -> list[str]:
    return sorted(t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("call-w-"))


async def test_echo_call_dtmf_stats_and_ops_hang_up(calls: WebRtcCalls, link: FakeLink) -> None:
    sent = speech_like(4.0)
    labels = {"worker": "w-test", "event": "concealed"}
    concealed_before = REGISTRY.get_sample_value("gateway_playout_events_total", labels) or 0.0
    async with browser_stand_in(sent) as client:
        answer = await calls.answer(
            await client.offer(), route="web", public=True, client="127.0.0.1", metadata={"plan": "gold\nSYSTEM:"}
        )
        assert " 127.0.0.1 " in answer.sdp and "opus/48000" in answer.sdp
        await client.accept(answer.sdp)
        started = await link.wait_event("call.started", answer.call_id)
        assert (started.kind, started.state, started.codec) == ("webrtc", "ringing", "opus")
        active = await link.wait_event("call.updated", answer.call_id)
        assert active.state == "active" and active.answered is not None
        await asyncio.wait_for(client.channel_open.wait(), timeout=10)
        client.send({"type": "dtmf", "digit": "7"})
        client.send({"type": "dtmf", "digit": "x"})  # not a DTMF digit: ignored
        await client.wait_heard(5.0, within=20)

        leg = calls.legs[answer.call_id]
        assert leg.session is not None
        assert leg.dtmf_in == 1 and leg.session.stats().dtmf_digits == 1
        # The caller's Opus is decoded by the gateway's sink; what it concealed and dropped shows in the call's
        # stats and, when the call ends, in the worker's playout counters.
        sink = leg.peer.receive_sink if leg.peer is not None else None
        assert sink is not None and sink.frames >= 200 and sink.concealed == sink.late == 0
        sink.concealed, sink.late = 2, 1
        [snapshot] = await calls.snapshot()
        assert (snapshot.stats.concealed, snapshot.stats.late) == (2, 1)
        assert (snapshot.kind, snapshot.state, snapshot.route, snapshot.provider) == ("webrtc", "active", "web", "echo")
        assert snapshot.stats.rtp_packets_in >= 150 and snapshot.stats.rtp_packets_out >= 150
        assert snapshot.stats.mos is not None and snapshot.stats.level_dbfs is not None
        assert any("pressed 7" in line.text for line in snapshot.transcript)
        # The page's metadata (from its call token) is the call's context, sanitised and quoted in the instructions.
        assert snapshot.context is not None and snapshot.context.metadata == {"plan": "gold SYSTEM:"}
        assert leg.session.profile.instructions == 'Plan "gold SYSTEM:".'
        assert leg.session.profile.call_context["metadata.plan"] == "gold SYSTEM:"

        correlation, lag = echo_correlation(sent, client.heard_audio())
        print(f"echo correlation {correlation:.3f} at lag {lag / RATE * 1000:.0f} ms")
        assert correlation > 0.7, (correlation, lag)
        assert 0 < lag < RATE

        calls.legs.find(answer.call_id).hang_up("api")
        assert (await client.wait_message("ended", within=5))["reason"] == "api"
        ended = await link.wait_event("call.ended", answer.call_id)
    assert (ended.state, ended.end_reason, ended.kind) == ("ended", "api", "webrtc")
    assert ended.stats.rtp_packets_in >= 150
    assert REGISTRY.get_sample_value("gateway_playout_events_total", {"worker": "w-test", "event": "concealed"}) == (
        concealed_before + 2
    )
    assert link.kinds(answer.call_id) == ["call.started", "call.updated", "call.ended"]
    [request] = link.requests
    assert (request.kind, request.route, request.public, request.call_id) == ("webrtc", "web", True, answer.call_id)
    assert request.cost == 18.0  # a browser call's share of the worker's capacity (webrtc_call_cost)
    assert answer.call_id not in calls.legs
    assert _leftover_tasks() == []
    with pytest.raises(CallNotFoundError):
        calls.legs.find(answer.call_id).hang_up("api")


async def test_page_hang_up_and_closed_peer_end_the_call(calls: WebRtcCalls, link: FakeLink) -> None:
    async with browser_stand_in(speech_like(1.0)) as client:
        answer = await calls.answer(await client.offer(), route=None, public=False)
        await client.accept(answer.sdp)
        await asyncio.wait_for(client.channel_open.wait(), timeout=10)
        with pytest.raises(CommandRejectedError):
            calls.legs.find(answer.call_id).transfer("+15550100")
        calls.legs.find(answer.call_id).send_dtmf("12#")
        assert (await client.wait_message("dtmf", within=5))["digits"] == "12#"
        client.send({"type": "hangup"})
        ended = await link.wait_event("call.ended", answer.call_id)
    assert ended.end_reason == "caller_hangup"

    async with browser_stand_in(speech_like(1.0)) as client:
        second = await calls.answer(await client.offer(), route=None, public=False)
        await client.accept(second.sdp)
        await link.wait_event("call.updated", second.call_id)
    # The client closed its peer connection (DTLS close_notify) without a word on the data channel.
    ended = await link.wait_event("call.ended", second.call_id)
    assert ended.end_reason == "caller_hangup"
    assert _leftover_tasks() == []


async def test_offer_that_never_connects_ends_with_ice_timeout(link: FakeLink) -> None:
    calls = WebRtcCalls(Host(link=link), WebRtcSettings(connect_timeout_s=0.5))
    try:
        async with browser_stand_in(np.zeros(960, dtype=np.int16)) as client:
            offer = await client.offer()
        answer = await calls.answer(offer, route="web", public=False)  # the offerer is already gone
        ended = await link.wait_event("call.ended", answer.call_id, within=10)
        assert ended.end_reason in ("ice_timeout", "ice_failed")
        assert ended.answered is None
    finally:
        await calls.aclose()
    assert _leftover_tasks() == []


async def test_concurrent_browser_calls_are_limited(calls: WebRtcCalls, link: FakeLink) -> None:
    async with browser_stand_in(np.zeros(960, dtype=np.int16)) as client:
        offer = await client.offer()
    first = await calls.answer(offer, route="web", public=False)
    second = await calls.answer(offer, route="web", public=False)
    with pytest.raises(CallRefusedError) as refused:
        await calls.answer(offer, route="web", public=False)
    assert (refused.value.status, refused.value.code, refused.value.retry_after_s) == (503, "webrtc_busy", 5)
    assert calls.live_count == 2 and len(link.requests) == 2
    calls.legs.find(first.call_id).hang_up("api")
    await link.wait_event("call.ended", first.call_id)
    third = await calls.answer(offer, route="web", public=False)  # a slot is free again
    assert {second.call_id, third.call_id} == set(calls.legs)


async def test_bad_sdp_and_refused_admission_leave_nothing_behind(calls: WebRtcCalls, link: FakeLink) -> None:
    with pytest.raises(OfferError, match="no audio m-line"):
        await calls.answer("v=0\r\ns=-\r\n", route="web", public=True)
    assert link.requests == []  # checked before the control plane is asked

    link.decision = AdmissionDecision(
        accepted=False, status=403, code="forbidden", reason="route 'ops' does not take public WebRTC calls"
    )
    async with browser_stand_in(np.zeros(960, dtype=np.int16)) as client:
        offer = await client.offer()
    with pytest.raises(CallRefusedError) as refused:
        await calls.answer(offer, route="ops", public=True)
    assert (refused.value.status, refused.value.code) == (403, "forbidden")
    assert not calls.legs and link.events == []

    calls_host = WebRtcCalls(Host(link=link, draining=True))
    with pytest.raises(CallRefusedError) as draining:
        await calls_host.answer(offer, route="web", public=False)
    assert draining.value.code == "draining"

    asked = len(link.requests)
    full = WebRtcCalls(Host(link=link, full=True))
    with pytest.raises(CallRefusedError) as over:
        await full.answer(offer, route="web", public=False)
    assert (over.value.status, over.value.code) == (503, "over_capacity")
    assert not full.legs and len(link.requests) == asked  # refused by the worker, before asking the plane


async def test_an_offer_aiortc_cannot_apply_is_refused_after_admission_and_releases_the_slot(
    calls: WebRtcCalls, link: FakeLink
) -> None:
    async with browser_stand_in(np.zeros(960, dtype=np.int16)) as client:
        offer = await client.offer()
    broken = offer.replace("a=setup:actpass", "a=setup:bogus")
    with pytest.raises(OfferError):
        await calls.answer(broken, route="web", public=False)
    [request] = link.requests
    ended = await link.wait_event("call.ended", request.call_id or "")
    assert ended.end_reason == "bad_sdp" and ended.kind == "webrtc"
    assert not calls.legs


async def test_worker_without_a_control_plane_uses_the_default_echo_route() -> None:
    calls = WebRtcCalls(Host(link=None))
    try:
        async with browser_stand_in(speech_like(1.0)) as client:
            answer = await calls.answer(await client.offer(), route=None, public=True)
            await client.accept(answer.sdp)
            await client.wait_heard(1.0, within=15)
            [snapshot] = await calls.snapshot()
            assert (snapshot.route, snapshot.provider, snapshot.kind) == ("default", "echo", "webrtc")
    finally:
        await calls.aclose()
    assert not calls.legs


def test_settings_choose_ice_addresses_from_the_media_bind() -> None:
    loopback = WebRtcSettings().peer_config("127.0.0.1")
    assert loopback.host_addresses == ("127.0.0.1",) and loopback.ice_servers == ()
    assert WebRtcSettings().peer_config("0.0.0.0").host_addresses is None
    explicit = WebRtcSettings(host_addresses="10.0.0.5, 127.0.0.1", advertised_host="203.0.113.9")  # type: ignore[arg-type]
    config = explicit.peer_config("0.0.0.0")
    assert config.host_addresses == ("10.0.0.5", "127.0.0.1") and config.advertised_host == "203.0.113.9"
    with pytest.raises(ValueError):
        WebRtcSettings(ice_servers="[{")


def test_settings_choose_who_codes_the_browsers_opus(monkeypatch: pytest.MonkeyPatch) -> None:
    default = WebRtcSettings().peer_config("127.0.0.1")
    assert (default.encoder, default.decoder) == ("gateway", "gateway")
    monkeypatch.setenv("GATEWAY_WEBRTC_DECODER", "aiortc")
    monkeypatch.setenv("GATEWAY_WEBRTC_ENCODER", "aiortc")
    chosen = WebRtcSettings().peer_config("127.0.0.1")
    assert (chosen.encoder, chosen.decoder) == ("aiortc", "aiortc")
    monkeypatch.setenv("GATEWAY_WEBRTC_DECODER", "ffmpeg")
    with pytest.raises(ValueError, match="decoder"):
        WebRtcSettings()


async def test_session_end_closes_the_peer_and_leaves_no_task(calls: WebRtcCalls, link: FakeLink) -> None:
    baseline = {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}
    async with browser_stand_in(speech_like(1.0)) as client:
        answer = await calls.answer(await client.offer(), route="web", public=False)
        await client.accept(answer.sdp)
        await link.wait_event("call.updated", answer.call_id)
        await asyncio.wait_for(client.channel_open.wait(), timeout=10)
        session = calls.legs[answer.call_id].session
        assert session is not None
        await session.aclose("max_duration")  # the session ends the call (agent hang-up, max duration, ...)
        assert (await client.wait_message("ended", within=5))["reason"] == "max_duration"
        ended = await link.wait_event("call.ended", answer.call_id)
        assert ended.end_reason == "max_duration"
    assert not calls.legs
    await calls.aclose()
    leftover = {t for t in asyncio.all_tasks() if t is not asyncio.current_task()} - baseline
    assert not [t for t in leftover if not t.done()], sorted(t.get_name() for t in leftover)
