"""Mid-call offers through a real worker on loopback: a scripted phone (our UA core) holds and resumes the call
with re-INVITEs, refreshes it, asks for the gateway's offer with an empty re-INVITE, and tries a codec change.
The gateway's answers, its media direction and its o= line must follow RFC 3264 §6.1 and §8."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gateway.sip.events import OutboundCallAnswered, ReinviteAnswered, ReinviteFailed
from gateway.sip.sdp import Direction, SessionDescription, build_offer, parse_sdp
from gateway.worker.worker import MediaWorker
from tests.gateway.worker.sip_peer import PeerCall, SipPeer, echo_worker
from tests.gateway.worker.test_worker import speechlike

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def worker() -> AsyncIterator[MediaWorker]:
    async with echo_worker(worker_id="w-reinvite", rtp_timeout_s=5.0, srtp="off") as w:
        yield w


def _target(worker: MediaWorker) -> str:
    return f"sip:agent@127.0.0.1:{worker.settings.sip.sip_port}"


async def _answered(peer: SipPeer, call: PeerCall) -> bytes:
    event = await peer.wait_for(OutboundCallAnswered, call=call.handle)
    peer.answered(call, event.body)  # type: ignore[attr-defined]
    return event.body  # type: ignore[attr-defined,no-any-return]


def _offer(call: PeerCall, version: int, *, direction: Direction = "sendrecv", codec: str = "PCMU") -> bytes:
    return build_offer(
        local_address="127.0.0.1",
        local_port=call.rtp.getsockname()[1],
        session_id=1,
        session_version=version,
        preferences=(codec,),
        direction=direction,
    ).to_bytes()


async def _reinvite(peer: SipPeer, call: PeerCall, body: bytes) -> SessionDescription:
    peer.endpoint.reinvite(call.handle, peer.transport.now(), body=body)
    peer.transport.pump()
    answered = await peer.wait_for(ReinviteAnswered, call=call.handle)
    return parse_sdp(answered.body)  # type: ignore[attr-defined]


async def test_hold_resume_refresh_and_a_reoffer_follow_rfc_3264(worker: MediaWorker) -> None:
    async with SipPeer() as peer:
        call = peer.invite(_target(worker))
        first = parse_sdp(await _answered(peer, call))
        await peer.stream(call, speechlike(0.2))
        [leg] = list(worker.legs.values())
        media = worker.engine.call(leg.id)
        assert media.direction == "sendrecv" and first.origin.session_version == 1

        held = await _reinvite(peer, call, _offer(call, 2, direction="sendonly"))
        assert held.media[0].direction == "recvonly" and media.direction == "recvonly"
        assert (held.origin.session_id, held.origin.session_version) == (first.origin.session_id, 2)
        assert leg.negotiated is not None and leg.negotiated.on_hold

        refreshed = await _reinvite(peer, call, _offer(call, 2, direction="sendonly"))
        assert refreshed == held  # nothing changed: the same description, the same version

        resumed = await _reinvite(peer, call, _offer(call, 3))
        assert resumed.media[0].direction == "sendrecv" and media.direction == "sendrecv"
        assert resumed.origin.session_version == 3 and not leg.negotiated.on_hold

        # A re-INVITE without a body asks for our offer: the call's codec only, our last description again.
        ours = await _reinvite(peer, call, b"")
        assert [c.name for c in ours.media[0].codecs] == ["PCMU", "telephone-event"]
        assert ours.origin.session_version == 3 and ours.media[0].port == first.media[0].port

        peer.endpoint.reinvite(call.handle, peer.transport.now(), body=_offer(call, 4, codec="PCMA"))
        peer.transport.pump()
        failed = await peer.wait_for(ReinviteFailed, call=call.handle)
        assert (failed.status, failed.reason) == (  # type: ignore[attr-defined]
            488,
            "codec change not supported: the call is PCMU and the re-offer has none",
        )
        assert media.direction == "sendrecv" and leg.state == "active"  # the call goes on as it was
        peer.hang_up(call)
        await asyncio.wait_for(leg.task, timeout=5)  # type: ignore[arg-type]
    assert worker.ports.in_use == frozenset()
