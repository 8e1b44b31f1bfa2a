"""A peer's REFER through a real worker on loopback (gateway/worker/referred.py): phone A calls the echo agent and
transfers the call to phone B (both our own UA core, so every NOTIFY is read by a second implementation). B gets
the INVITE with the Replaces and Referred-By, the agent is heard on B, A is told 100 then 200; a busy B leaves the
call with A and the agent; a route without ``refer = "accept"`` declines with 603."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from gateway.fleet.models import ReferPolicyModel
from gateway.observability import SIP_REFERS_TOTAL
from gateway.sip.events import CallEnded, CallOffered, OutboundCallAnswered, TransferFailed, TransferProgressed
from gateway.sip.uac import send_in_dialog
from gateway.worker.legs import LegState
from gateway.worker.referred import REFERRER_BYE_GRACE_S, TRANSFERRED_NOTE
from gateway.worker.sip_leg import CallLeg
from gateway.worker.worker import MediaWorker
from tests.gateway.worker.sip_peer import PeerCall, SipPeer, echo_worker
from tests.gateway.worker.test_worker import best_correlation, speechlike

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def worker() -> AsyncIterator[MediaWorker]:
    async with echo_worker(worker_id="w-referred", rtp_timeout_s=10.0, srtp="off") as w:
        yield w


async def _call(worker: MediaWorker, peer: SipPeer) -> tuple[PeerCall, CallLeg]:
    call = peer.invite(f"sip:agent@127.0.0.1:{worker.settings.sip.sip_port}")
    answered = await peer.wait_for(OutboundCallAnswered, call=call.handle)
    peer.answered(call, answered.body)  # type: ignore[attr-defined]
    [leg] = [leg for leg in worker.legs.values() if leg.live]
    assert isinstance(leg, CallLeg)
    return call, leg


def _refer(peer: SipPeer, call: PeerCall, refer_to: str) -> None:
    """A REFER with this exact Refer-To (our UA's refer() writes a plain one); its NOTIFYs are tracked."""
    core = peer.endpoint._core
    c = core.calls[call.handle]
    c.refer_pending = True
    headers = (("Refer-To", refer_to), ("Referred-By", f"<sip:a@127.0.0.1:{peer.port}>"))
    send_in_dialog(core, c, "REFER", peer.transport.now(), headers=headers)
    peer.transport.pump()


async def _progress(peer: SipPeer, call: PeerCall, count: int) -> list[tuple[int, bool]]:
    seen = []
    for _ in range(count):
        event = await peer.wait_for(TransferProgressed, call=call.handle)
        seen.append((event.status, event.final))  # type: ignore[attr-defined]
    return seen


async def _echo_correlation(peer: SipPeer, call: PeerCall, seed: int) -> float:
    """Speech to the agent, then silence while its echo comes back: how well what came back matches."""
    sent = speechlike(1.5, seed=seed)
    await peer.stream(call, sent)
    await peer.stream(call, np.zeros(8000, np.int16), frames=15)
    return best_correlation(sent, peer.heard(call))


def _refers(outcome: str) -> float:
    return SIP_REFERS_TOTAL.labels("w-referred", outcome)._value.get()  # type: ignore[no-any-return]


async def test_accepted_refer_moves_the_agent_to_the_target(worker: MediaWorker) -> None:
    referred_before = _refers("referred")
    async with SipPeer() as a, SipPeer() as b:
        call_a, leg = await _call(worker, a)
        leg.refer_policy = ReferPolicyModel(mode="accept", allow=(f"sip:*@127.0.0.1:{b.port}",))
        first_dialog = leg.sip
        replaces = "abc%40pbx%3Bto-tag%3D1%3Bfrom-tag%3D2"
        _refer(a, call_a, f"<sip:human@127.0.0.1:{b.port}?Replaces={replaces}>")
        assert await _progress(a, call_a, 2) == [(202, False), (100, False)]
        offered = await b.wait_for(CallOffered)
        assert isinstance(offered, CallOffered)
        headers = dict(offered.headers)
        assert headers["Replaces"] == "abc@pbx;to-tag=1;from-tag=2"
        assert headers["Referred-By"] == f"<sip:a@127.0.0.1:{a.port}>"
        call_b = b.answer(offered)
        assert await _progress(a, call_a, 1) == [(200, True)]
        # A referrer that stays after the 200 NOTIFY is sent our BYE once the grace is over.
        ended = await a.wait_for(CallEnded, call=call_a.handle, within=REFERRER_BYE_GRACE_S + 2)
        assert ended.by == "remote" and leg.live  # type: ignore[attr-defined]

        # The agent (the echo) now talks to B: B's own voice comes back on B's call, under the same call id.
        assert await _echo_correlation(b, call_b, 11) > 0.9
        assert leg.live and leg.sip != first_dialog and leg.state is LegState.ACTIVE
        assert [(r.outcome, r.status, r.replaces, r.trunk) for r in leg.referrals] == [("referred", 200, True, None)]
        assert leg.session is not None  # the agent was told, in its conversation, that the call moved
        notes = [e.text for e in leg.session.transcript if e.role == "system" and "transferred this call" in e.text]
        assert notes == [TRANSFERRED_NOTE.format(target=f"sip:human@127.0.0.1:{b.port}")]
        assert _refers("referred") == referred_before + 1
        b.hang_up(call_b)
        for _ in range(100):
            if not leg.live:
                break
            await asyncio.sleep(0.05)
        assert leg.end_reason == "caller_hangup"


async def test_busy_target_leaves_the_call_with_the_agent(worker: MediaWorker) -> None:
    async with SipPeer() as a, SipPeer() as b:
        call_a, leg = await _call(worker, a)
        leg.refer_policy = ReferPolicyModel(mode="accept")
        first_dialog = leg.sip
        a.endpoint.refer(call_a.handle, a.transport.now(), target_uri=f"sip:human@127.0.0.1:{b.port}")
        a.transport.pump()
        assert await _progress(a, call_a, 2) == [(202, False), (100, False)]
        offered = await b.wait_for(CallOffered)
        b.endpoint.reject(offered.call, b.transport.now(), status=486)  # type: ignore[attr-defined]
        b.transport.pump()
        failed = await a.wait_for(TransferFailed, call=call_a.handle)
        assert (failed.status, failed.reason) == (486, "Busy Here")  # type: ignore[attr-defined]
        assert await _echo_correlation(a, call_a, 5) > 0.9  # the agent is still with A
        assert [(r.outcome, r.status) for r in leg.referrals] == [("failed", 486)]
        assert leg.live and leg.sip == first_dialog


async def test_refer_outside_the_route_policy_is_declined_603(worker: MediaWorker) -> None:
    async with SipPeer() as a:
        call_a, leg = await _call(worker, a)
        assert leg.refer_policy is not None and leg.refer_policy.mode == "off"  # the default: declined
        a.endpoint.refer(call_a.handle, a.transport.now(), target_uri="sip:human@127.0.0.1:9")
        a.transport.pump()
        failed = await a.wait_for(TransferFailed, call=call_a.handle)
        assert (failed.status, failed.reason) == (603, "Transfer not allowed")  # type: ignore[attr-defined]
        leg.refer_policy = ReferPolicyModel(mode="accept", allow=("10.0.0.*",))
        a.endpoint.refer(call_a.handle, a.transport.now(), target_uri="sip:human@127.0.0.1:9")
        a.transport.pump()
        failed = await a.wait_for(TransferFailed, call=call_a.handle)
        assert (failed.status, failed.reason) == (603, "Transfer target not allowed")  # type: ignore[attr-defined]
        assert await _echo_correlation(a, call_a, 9) > 0.9 and leg.live
        assert [r.outcome for r in leg.referrals] == ["declined", "declined"]
        assert np.all([r.status == 603 for r in leg.referrals])


async def test_referrer_hanging_up_after_202_leaves_the_call_to_the_transfer(worker: MediaWorker) -> None:
    async with SipPeer() as a, SipPeer() as b:
        call_a, leg = await _call(worker, a)
        leg.refer_policy = ReferPolicyModel(mode="accept")
        a.endpoint.refer(call_a.handle, a.transport.now(), target_uri=f"sip:human@127.0.0.1:{b.port}")
        a.transport.pump()
        assert await _progress(a, call_a, 2) == [(202, False), (100, False)]
        offered = await b.wait_for(CallOffered)
        a.hang_up(call_a)  # a blind transfer: the referrer does not wait for the outcome
        await a.wait_for(CallEnded, call=call_a.handle)
        assert leg.live  # the agent holds the call for the target
        call_b = b.answer(offered)  # type: ignore[arg-type]
        assert await _echo_correlation(b, call_b, 13) > 0.9
        assert [r.outcome for r in leg.referrals] == ["referred"] and leg.live


async def test_a_tel_target_is_called_through_the_trunk() -> None:
    async with SipPeer() as trunk:
        settings = {"trunk": f"127.0.0.1:{trunk.port}", "srtp": "off"}
        async with echo_worker(worker_id="w-referred", rtp_timeout_s=10.0, **settings) as worker, SipPeer() as a:
            call_a, leg = await _call(worker, a)
            leg.refer_policy = ReferPolicyModel(mode="accept", allow=("tel:+1555*",))
            a.endpoint.refer(call_a.handle, a.transport.now(), target_uri="tel:+15550111")
            a.transport.pump()
            offered = await trunk.wait_for(CallOffered)
            assert offered.request_uri == f"sip:+15550111@127.0.0.1:{trunk.port}"  # type: ignore[attr-defined]
            trunk.endpoint.reject(offered.call, trunk.transport.now(), status=404)  # type: ignore[attr-defined]
            trunk.transport.pump()
            failed = await a.wait_for(TransferFailed, call=call_a.handle)
            assert failed.status == 404 and leg.live  # type: ignore[attr-defined]
            assert [(r.outcome, r.trunk) for r in leg.referrals] == [("failed", "default")]  # GATEWAY_TRUNK's


async def test_a_tel_target_takes_the_trunk_of_the_calls_route(tmp_path: Path) -> None:
    """Two trunks in the routes file; the call's route names b (AdmissionDecision.trunk): the target goes to b."""
    async with SipPeer() as carrier_a, SipPeer() as carrier_b:
        config = tmp_path / "gateway.toml"
        config.write_text(
            f'[trunks.a]\naddress = "127.0.0.1:{carrier_a.port}"\n\n'
            f'[trunks.b]\naddress = "127.0.0.1:{carrier_b.port}"\n'
        )
        async with (
            echo_worker(worker_id="w-referred", rtp_timeout_s=10.0, srtp="off", config=str(config)) as worker,
            SipPeer() as a,
        ):
            call_a, leg = await _call(worker, a)
            leg.refer_policy, leg.trunk = ReferPolicyModel(mode="accept"), "b"
            a.endpoint.refer(call_a.handle, a.transport.now(), target_uri="tel:+15550111")
            a.transport.pump()
            offered = await carrier_b.wait_for(CallOffered)
            assert offered.request_uri == f"sip:+15550111@127.0.0.1:{carrier_b.port}"  # type: ignore[attr-defined]
            assert not carrier_a.requests
            carrier_b.endpoint.reject(offered.call, carrier_b.transport.now(), status=486)  # type: ignore[attr-defined]
            carrier_b.transport.pump()
            failed = await a.wait_for(TransferFailed, call=call_a.handle)
            assert failed.status == 486 and leg.live  # type: ignore[attr-defined]
            # The REFER's call names the trunk it was dialled through; the call itself came from no trunk's sources.
            assert [(r.outcome, r.status, r.trunk) for r in leg.referrals] == [("failed", 486, "b")]
            assert (await leg.snapshot()).trunk is None
