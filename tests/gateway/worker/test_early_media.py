"""Early media through a real worker on loopback: a route's ringback tone in a 183 before the 200 (the same SDP and
To tag in both, the tone's packets counted between them), and an outbound call whose callee sends 183 with audio
before its 200 (the worker receives it, sends only silence and starts the agent only at the 200)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest

from gateway.fleet.models import AdmissionDecision, EarlyMediaModel, OriginateRequest, ProfileModel
from gateway.sip.events import CallCancelled, CallHandle, CallOffered, OutboundCallAnswered, OutboundCallProgressed
from gateway.worker.early_media import outbound_answered, outbound_progressed
from gateway.worker.sip_leg import CallLeg
from gateway.worker.worker import MediaWorker
from telcodecs.frames import unchecked_frame
from tests.gateway.worker.sip_peer import SipPeer, echo_worker
from tests.gateway.worker.test_call_hook_admission import DecidingLink

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def worker() -> AsyncIterator[MediaWorker]:
    async with echo_worker(worker_id="w-early", rtp_timeout_s=5.0) as w:
        yield w


def _dominant_hz(pcm: np.ndarray, rate: int = 8000) -> float:
    spectrum = np.abs(np.fft.rfft(pcm.astype(np.float64) * np.hanning(pcm.size)))
    return float(np.argmax(spectrum) * rate / pcm.size)


async def test_a_tone_route_sends_183_with_the_answer_and_rings_before_the_200(worker: MediaWorker) -> None:
    plan = EarlyMediaModel(mode="tone", seconds=1.5)
    worker.link = DecidingLink(
        AdmissionDecision(accepted=True, call_id="c-early", worker="w-early", route="r", early_media=plan), delay_s=0
    )
    async with SipPeer() as peer:
        call = peer.invite(f"sip:+15550199@127.0.0.1:{worker.settings.sip.sip_port}")
        progressed = await peer.wait_for(OutboundCallProgressed, call=call.handle)
        assert progressed.status == 183  # type: ignore[attr-defined]
        peer.answered(call, progressed.body)  # type: ignore[attr-defined]
        at_183 = len(call.received)
        answered = await peer.wait_for(OutboundCallAnswered, call=call.handle, within=5)
        at_200 = len(call.received)
        (early,) = [r for r in peer.responses if r.status == 183]
        (ok,) = [r for r in peer.responses if r.status == 200 and r.cseq.method == "INVITE"]
        assert early.to.tag == ok.to.tag and early.body == ok.body == answered.body  # type: ignore[attr-defined]
        # 1.5 s of early media at 20 ms: 75 packets, give or take the first tick and the 200's flight
        assert 55 <= at_200 - at_183 <= 80, (at_183, at_200)
        heard = peer.heard(call)
        tone = heard[: 8000 * 9 // 10]  # the first 0.9 s: the tone's 1 s burst
        assert abs(_dominant_hz(tone) - 425.0) < 10 and np.abs(tone).max() > 3000
        (leg,) = worker.legs.values()
        snapshot = worker.snapshot_of(leg)  # type: ignore[arg-type]
        assert snapshot.stats.early_media_frames_out >= 60 and snapshot.state == "active"
        peer.hang_up(call)
        await asyncio.wait_for(leg.task, timeout=5)  # type: ignore[arg-type]


async def test_an_outbound_callees_early_audio_is_received_and_the_agent_waits_for_the_200(
    worker: MediaWorker,
) -> None:
    async with SipPeer() as callee:
        await worker.originate(
            OriginateRequest(to=f"sip:callee@127.0.0.1:{callee.port}"),
            AdmissionDecision(accepted=True, call_id="c-out-early", route="default"),
        )
        offered = await callee.wait_for(CallOffered)
        call = callee.answer(offered, early=True)  # type: ignore[arg-type]
        t = np.arange(8000) / 8000
        announcement = (8000 * np.sin(2 * np.pi * 600 * t)).astype(np.int16)
        await callee.stream(call, announcement)  # 1 s of "announcement" before the answer
        leg = worker.legs["c-out-early"]
        assert leg.early is not None and leg.early.heard >= 40, leg.early and leg.early.heard
        assert leg.state.value == "ringing" and leg.session is not None
        before = len(call.received)
        assert all(set(payload) == {0xFF} for payload in call.received), "only silence before the 200 (PCMU)"
        callee.answer_early(call)
        snapshot = await _until(lambda: _active(worker, "c-out-early"))
        assert snapshot.stats.early_media_frames_in >= 40
        assert leg.early is None and leg.sdp is not None and leg.sdp.state.value == "negotiated"
        await callee.stream(call, announcement[:4000])
        # The echo agent talks once answered: its audio comes after the 200 only.
        await _until(lambda: any(set(payload) != {0xFF} for payload in call.received[before:]) or None)
        callee.hang_up(call)
        await asyncio.wait_for(leg.task, timeout=5)  # type: ignore[arg-type]


def _active(worker: MediaWorker, call_id: str):  # type: ignore[no-untyped-def]
    leg = worker.legs.get(call_id)
    snapshot = worker.snapshot_of(leg) if leg is not None else None  # type: ignore[arg-type]
    return snapshot if snapshot is not None and snapshot.state == "active" else None


async def _until(check, within: float = 5.0):  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while loop.time() < deadline:
        value = check()
        if value:
            return value
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")


async def test_a_greeting_route_starts_the_agent_before_the_200(worker: MediaWorker) -> None:
    # The echo agent's greeting has no audio: the greeting's early media lasts its whole early_media_s.
    plan = EarlyMediaModel(mode="greeting", seconds=1.0)
    profile = ProfileModel(provider="default", greeting="Hello there.")
    decision = AdmissionDecision(
        accepted=True, call_id="c-greet", worker="w-early", route="r", profile=profile, early_media=plan
    )
    worker.link = DecidingLink(decision, delay_s=0)
    async with SipPeer() as peer:
        call = peer.invite(f"sip:+15550199@127.0.0.1:{worker.settings.sip.sip_port}")
        progressed = await peer.wait_for(OutboundCallProgressed, call=call.handle)
        assert progressed.status == 183  # type: ignore[attr-defined]
        loop = asyncio.get_running_loop()
        at_183 = loop.time()
        (leg,) = worker.legs.values()
        session = await _until(lambda: leg.session if leg.session and leg.session.state.value == "active" else None)
        assert leg.state.value == "admitted", "the session is up before the call is answered"
        await peer.wait_for(OutboundCallAnswered, call=call.handle, within=5)
        assert 0.8 <= loop.time() - at_183 <= 1.6
        assert leg.session is session  # the same session goes on after the 200, not started twice
        peer.hang_up(call)
        await asyncio.wait_for(leg.task, timeout=5)  # type: ignore[arg-type]


async def test_a_cancel_during_early_media_ends_the_call_without_a_200(worker: MediaWorker) -> None:
    plan = EarlyMediaModel(mode="tone", seconds=10.0)
    worker.link = DecidingLink(
        AdmissionDecision(accepted=True, call_id="c-gone", worker="w-early", route="r", early_media=plan), delay_s=0
    )
    async with SipPeer() as peer:
        call = peer.invite(f"sip:+15550199@127.0.0.1:{worker.settings.sip.sip_port}")
        await peer.wait_for(OutboundCallProgressed, call=call.handle)
        (leg,) = worker.legs.values()
        await _until(lambda: len(call.received) > 5 or None)  # the tone is playing
        peer.endpoint.hang_up(call.handle, peer.transport.now())  # CANCEL
        peer.transport.pump()
        await asyncio.wait_for(leg.task, timeout=3)  # type: ignore[arg-type]
    assert leg.end_reason == "caller_cancelled"
    assert [r.status for r in peer.responses if r.cseq.method == "INVITE"][-1] == 487
    assert not any(r.status == 200 and r.cseq.method == "INVITE" for r in peer.responses)


async def test_an_outbound_call_hung_up_during_early_media_ends_at_once(worker: MediaWorker) -> None:
    async with SipPeer() as callee:
        await worker.originate(
            OriginateRequest(to=f"sip:callee@127.0.0.1:{callee.port}", ring_timeout_s=30),
            AdmissionDecision(accepted=True, call_id="c-out-gone", route="default"),
        )
        offered = await callee.wait_for(CallOffered)
        call = callee.answer(offered, early=True)  # type: ignore[arg-type]
        leg = worker.legs["c-out-gone"]
        await _until(lambda: leg.session is not None or None)  # early media started: the session is made
        leg.hang_up("api_hangup")
        await asyncio.wait_for(leg.task, timeout=3)  # type: ignore[arg-type]
        await callee.wait_for(CallCancelled, call=call.handle, within=3)  # the 183'd INVITE is CANCELled
        assert leg.end_reason == "api_hangup"


def _outbound_leg() -> tuple[CallLeg, bytes]:
    """A leg whose offer went out, and the offer (answered by tests.gateway.sip.test_offer_answer's sides)."""
    from tests.gateway.sip.test_offer_answer import side

    leg = CallLeg(id="c-fork", sip=None, direction="outbound", from_uri="", to_uri="", owner=None)  # type: ignore[arg-type]
    leg.sdp = side(1)
    return leg, leg.sdp.offer().to_bytes()


def _answer_from(owner: int, offer: bytes) -> bytes:
    from tests.gateway.sip.test_early_media import answered_local
    from tests.gateway.sip.test_offer_answer import side

    return answered_local(side(owner), offer)


def test_the_answering_fork_moves_the_early_media_to_its_address() -> None:
    leg, offer = _outbound_leg()
    fork_a, fork_b = _answer_from(2, offer), _answer_from(3, offer)
    started: list[str] = []
    moved: list[tuple[tuple[str, int], bool]] = []

    def progressed(body: bytes, tag: str) -> bool:
        event = OutboundCallProgressed(
            call=CallHandle("h"), status=183, reason="", body=body, content_type="application/sdp", to_tag=tag
        )
        return outbound_progressed(leg, event, worker="w", start_media=lambda: started.append(tag))  # type: ignore[arg-type, func-returns-value]

    assert progressed(fork_a, "a") and started == ["a"] and leg.early is not None
    assert leg.negotiated is not None and leg.negotiated.remote_rtp == ("192.0.2.2", 40004)
    assert not progressed(fork_b, "b") and started == ["a"]  # the second fork's SDP does not move the media
    leg.early.received(unchecked_frame(0, np.zeros(480, np.int16)))
    answer = OutboundCallAnswered(call=CallHandle("h"), body=fork_b, content_type="application/sdp", to_tag="b")
    kept = outbound_answered(
        leg, answer, route=None, worker="w", follow=lambda result: moved.append(result.media.remote_rtp)
    )
    assert kept is True and moved == [("192.0.2.3", 40006)] and leg.early is None and leg.early_heard == 1
    assert leg.negotiated is not None and leg.negotiated.remote_rtp == ("192.0.2.3", 40006)


def test_a_200_on_the_early_dialog_with_its_sdp_keeps_the_media() -> None:
    leg, offer = _outbound_leg()
    body = _answer_from(2, offer)
    event = OutboundCallProgressed(
        call=CallHandle("h"), status=183, reason="", body=body, content_type="application/sdp", to_tag="a"
    )
    assert outbound_progressed(leg, event, worker="w", start_media=lambda: None)
    moved: list[bool] = []
    answer = OutboundCallAnswered(call=CallHandle("h"), body=body, content_type="application/sdp", to_tag="a")
    assert outbound_answered(leg, answer, route=None, worker="w", follow=lambda result: moved.append(True))
    assert moved == [] and leg.sdp is not None and leg.sdp.state.value == "negotiated"
    # Without early media the worker takes the answer as ever: outbound_answered leaves it alone.
    plain, offer = _outbound_leg()
    answer = OutboundCallAnswered(call=CallHandle("h"), body=_answer_from(2, offer), content_type="application/sdp")
    assert outbound_answered(plain, answer, route=None, worker="w", follow=lambda result: None) is None
