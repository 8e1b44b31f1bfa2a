"""Draining a live worker (gateway/worker/drain.py): no new calls, live ones go on, a deadline ends them politely.

Real sockets on loopback: a scripted SIP phone (tests/gateway/worker/sip_peer.py) calls a MediaWorker in this
process, with the echo agent, or the OpenAI adapter against the fake OpenAI server when the agent must speak.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from gateway.providers.echo import EchoConfig, EchoModel
from gateway.sip.events import CallEnded, OptionsAnswered, OutboundCallAnswered, OutboundCallFailed
from gateway.worker.drain import DRAIN_DEADLINE
from gateway.worker.settings import WorkerSettings
from gateway.worker.worker import MediaWorker
from tests.gateway.worker.sip_peer import PeerCall, SipPeer
from tests.gateway.worker.test_worker import best_correlation, speechlike
from tests.support.procs import free_ports

GOODBYE = "This line closes now for maintenance. Goodbye."


def _settings(worker_id: str) -> WorkerSettings:
    sip_port = free_ports(1)[0]
    rtp_low = free_ports(12)[0]
    rtp_low += rtp_low % 2
    return WorkerSettings(
        worker_id=worker_id,
        sip_port=sip_port,
        rtp_ports=f"{rtp_low}-{rtp_low + 9}",
        rtp_timeout_s=5.0,
        capacity=4,
        drain_goodbye=GOODBYE,
    )


@pytest.fixture
async def worker() -> AsyncIterator[MediaWorker]:
    w = MediaWorker(_settings("w-drain"), model_factory=lambda name: EchoModel(EchoConfig(delay_frames=1)))
    await w.start()
    try:
        yield w
    finally:
        await w.aclose()


async def _call(peer: SipPeer, worker: MediaWorker) -> PeerCall:
    call = peer.invite(f"sip:agent@127.0.0.1:{worker.settings.sip.sip_port}")
    answered = await peer.wait_for(OutboundCallAnswered, call=call.handle)
    peer.answered(call, answered.body)  # type: ignore[attr-defined]
    return call


async def _options_status(peer: SipPeer, worker: MediaWorker) -> int:
    peer.endpoint.send_options(f"sip:127.0.0.1:{worker.settings.sip.sip_port}", peer.transport.now())
    peer.transport.pump()
    answered = await peer.wait_for(OptionsAnswered)
    return answered.status  # type: ignore[attr-defined]


async def _refused_status(peer: SipPeer, worker: MediaWorker) -> int:
    refused = peer.invite(f"sip:agent@127.0.0.1:{worker.settings.sip.sip_port}")
    failed = await peer.wait_for(OutboundCallFailed, call=refused.handle)
    return failed.status  # type: ignore[attr-defined]


def _bye_reason(peer: SipPeer) -> str | None:
    byes = [request for request in peer.requests if request.method == "BYE"]
    assert len(byes) == 1, [request.method for request in peer.requests]
    return byes[0].headers.get("Reason")


async def test_a_drain_lets_the_live_call_go_on_refuses_new_ones_and_exits_after_the_last(
    worker: MediaWorker,
) -> None:
    assert worker.readiness() == {"ready": True, "draining": False, "control_reachable": True, "live_calls": 0}
    async with SipPeer() as peer:
        assert await _options_status(peer, worker) == 200
        call = await _call(peer, worker)
        await worker.drain(exit_when_empty=True)
        assert worker.info().status == "draining"
        assert worker.readiness() == {"ready": False, "draining": True, "control_reachable": True, "live_calls": 1}
        # A balancer's probe and a new caller both hear 503; the live call goes on, echoing as before.
        assert await _options_status(peer, worker) == 503
        assert await _refused_status(peer, worker) == 503
        sent = speechlike(1.5)
        await peer.stream(call, sent)
        await peer.stream(call, np.zeros(4000, np.int16), frames=10)
        assert best_correlation(sent, peer.heard(call)) > 0.9
        assert not worker.exited.is_set() and worker.live_calls() == 1
        peer.hang_up(call)
        await asyncio.wait_for(worker.exited.wait(), timeout=5)
    assert worker.live_calls() == 0


async def test_a_drain_deadline_ends_the_call_with_a_bye_that_says_why(worker: MediaWorker) -> None:
    async with SipPeer() as peer:
        call = await _call(peer, worker)
        [leg] = list(worker.legs.values())
        loop = asyncio.get_running_loop()
        drained_at = loop.time()
        await worker.drain(exit_when_empty=True, deadline_s=0.6)
        listening = asyncio.create_task(peer.stream(call, np.zeros(8000 * 5, np.int16)))
        try:
            ended = await peer.wait_for(CallEnded, call=call.handle, within=8)
        finally:
            listening.cancel()
        assert loop.time() - drained_at >= 0.6  # not before the deadline
        assert ended.by == "remote"  # type: ignore[attr-defined]
        assert _bye_reason(peer) == f'Q.850;cause=16;text="{DRAIN_DEADLINE}"'
        await asyncio.wait_for(worker.exited.wait(), timeout=5)
        assert leg.end_reason == DRAIN_DEADLINE


async def test_a_later_drain_brings_the_deadline_forward_but_never_back(worker: MediaWorker) -> None:
    await worker.drain(exit_when_empty=False, deadline_s=600)
    first = worker.drainer.seconds_left()
    await worker.drain(exit_when_empty=False, deadline_s=3600)
    assert first is not None and worker.drainer.seconds_left() == pytest.approx(first, abs=1.0)
    await worker.drain(exit_when_empty=False, deadline_s=60)
    left = worker.drainer.seconds_left()
    assert left is not None and 55 < left <= 60
    assert not worker.exited.is_set()  # nobody asked it to exit


async def test_the_agent_says_the_goodbye_before_the_deadline_hangs_up() -> None:
    from gateway.providers.fake_server import FakeOptions, FakeRealtimeServer
    from gateway.providers.openai import OpenAIConfig, OpenAIRealtimeModel

    async with FakeRealtimeServer(FakeOptions(mode="tone", reply_ms=800)) as fake:
        config = OpenAIConfig(url=fake.url, api_key="test-key", setup_timeout_s=5.0)
        worker = MediaWorker(_settings("w-goodbye"), model_factory=lambda name: OpenAIRealtimeModel(config))
        await worker.start()
        try:
            async with SipPeer() as peer:
                call = await _call(peer, worker)
                listening = asyncio.create_task(peer.stream(call, np.zeros(8000 * 8, np.int16)))
                try:
                    await _received(call, packets=10)  # the call is up and quiet
                    assert np.abs(peer.heard(call)).max(initial=0) < 200  # nothing said so far
                    await worker.drain(exit_when_empty=True, deadline_s=0.2)
                    await peer.wait_for(CallEnded, call=call.handle, within=15)
                finally:
                    listening.cancel()
                heard = peer.heard(call)
                assert _bye_reason(peer) == f'Q.850;cause=16;text="{DRAIN_DEADLINE}"'
            [record] = fake.records.values()
            asked = [_instructions(event) for event in record.events if event.get("type") == "response.create"]
            assert asked == [f"Say exactly this, then stop: {GOODBYE}"]
            # The whole goodbye (an 800 ms tone from the fake) reached the caller before the BYE.
            loud = np.count_nonzero(np.abs(heard.astype(np.int32)) > 1000)
            assert loud > 0.6 * 8000 * 0.8, loud
            await asyncio.wait_for(worker.exited.wait(), timeout=5)
        finally:
            await worker.aclose()


async def _received(call: PeerCall, *, packets: int, within: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while len(call.received) < packets:
        assert loop.time() < deadline, f"only {len(call.received)} packets came back"
        await asyncio.sleep(0.02)


def _instructions(event: dict[str, Any]) -> str:
    return str((event.get("response") or {}).get("instructions") or "")
