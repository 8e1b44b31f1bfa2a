"""The worker's side of the call-time application: while admission is undecided the caller hears 180 Ringing, the
application's refusal goes on the wire as it chose (302 with Contact for a redirect), and the admission request
carries the INVITE's facts without its routing headers or credentials."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import pytest

from gateway.fleet.models import AdmissionDecision, AdmissionRequest, CallSnapshot, WorkerEvent, WorkerInfo
from gateway.sip.events import OutboundCallFailed, OutboundCallProgressed
from gateway.worker.sip_calls import RING_AFTER_S
from gateway.worker.worker import MediaWorker
from tests.gateway.worker.sip_peer import SipPeer, echo_worker

pytestmark = pytest.mark.timeout(60)


@dataclass
class DecidingLink:
    """A control link whose admission answers ``decision`` after ``delay_s`` (an application being asked)."""

    decision: AdmissionDecision
    delay_s: float
    requests: list[AdmissionRequest] = field(default_factory=list)

    async def register(self, info: WorkerInfo) -> WorkerInfo:
        return info

    async def heartbeat(self, info: WorkerInfo, calls: Sequence[CallSnapshot]) -> WorkerInfo:
        return info

    async def admit(self, request: AdmissionRequest) -> AdmissionDecision:
        self.requests.append(request)
        await asyncio.sleep(self.delay_s)  # the application's thinking time, which the caller must not hear as silence
        return self.decision

    async def report(self, events: Sequence[WorkerEvent]) -> None:
        return None

    async def aclose(self) -> None:
        return None


@pytest.fixture
async def worker() -> AsyncIterator[MediaWorker]:
    async with echo_worker(worker_id="w-hook", rtp_timeout_s=1.0) as w:
        yield w


REDIRECT = AdmissionDecision(
    accepted=False,
    status=302,
    code="application_redirected",
    reason="Moved Temporarily",
    contact="sip:+15550123@pbx.example.net",
)


async def test_a_slow_admission_rings_then_redirects_with_contact(worker: MediaWorker) -> None:
    link = DecidingLink(REDIRECT, delay_s=RING_AFTER_S + 0.3)
    worker.link = link
    async with SipPeer() as peer:
        call = peer.invite(f"sip:+15550199@127.0.0.1:{worker.settings.sip.sip_port}")
        ringing = await peer.wait_for(OutboundCallProgressed, call=call.handle)
        failed = await peer.wait_for(OutboundCallFailed, call=call.handle)
    assert ringing.status == 180  # type: ignore[attr-defined]
    assert failed.status == 302  # type: ignore[attr-defined]
    (moved,) = [response for response in peer.responses if response.status == 302]
    assert moved.headers.values("Contact") == ["<sip:+15550123@pbx.example.net>"]
    (request,) = link.requests
    assert request.invite is not None and request.invite.request_uri.startswith("sip:+15550199@")
    names = {name.lower() for name, _ in request.invite.headers}
    assert not names & {"via", "contact", "cseq", "call-id", "authorization"}


async def test_a_quick_refusal_is_not_rung_first(worker: MediaWorker) -> None:
    busy = AdmissionDecision(accepted=False, status=486, code="application_rejected", reason="Busy Here")
    worker.link = DecidingLink(busy, delay_s=0.0)
    async with SipPeer() as peer:
        call = peer.invite(f"sip:+15550199@127.0.0.1:{worker.settings.sip.sip_port}")
        failed = await peer.wait_for(OutboundCallFailed, call=call.handle)
    assert (failed.status, failed.reason) == (486, "Busy Here")  # type: ignore[attr-defined]
    assert [response.status for response in peer.responses if response.status > 100] == [486]
