"""SDES SRTP calls through a real worker on loopback: a scripted phone (our UA core + libsrtp) calls the echo agent
over SRTP; the echo must correlate with what was sent, refused packets are counted and never played, each mode
answers what it should (488 with a reason), a re-offer rekeys, an outbound call offers OSRTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest

from gateway.media.rtp import build_rtp
from gateway.media.srtp import SrtpContext
from gateway.observability import REGISTRY
from gateway.sip.events import (
    CallOffered,
    OutboundCallAnswered,
    OutboundCallFailed,
    ReinviteAnswered,
)
from gateway.sip.sdes import crypto_lines
from gateway.sip.sdp import parse_sdp
from gateway.worker.worker import MediaWorker
from telcodecs.g711 import ulaw_encode
from tests.gateway.worker.sip_peer import SipPeer, echo_worker
from tests.gateway.worker.test_worker import best_correlation, speechlike
from tests.support.audio import align_and_correlate

pytestmark = pytest.mark.timeout(60)
SUITES = ("AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32")


@pytest.fixture
async def worker(request: pytest.FixtureRequest) -> AsyncIterator[MediaWorker]:
    async with echo_worker(worker_id="w-srtp", rtp_timeout_s=5.0, **getattr(request, "param", {})) as w:
        yield w


def _target(worker: MediaWorker) -> str:
    return f"sip:agent@127.0.0.1:{worker.settings.sip.sip_port}"


def _sample(name: str, **labels: str) -> float:
    value = REGISTRY.get_sample_value(name, labels)
    return value or 0.0


async def _answered(peer: SipPeer, call) -> bytes:  # type: ignore[no-untyped-def]
    event = await peer.wait_for(OutboundCallAnswered, call=call.handle)
    peer.answered(call, event.body)  # type: ignore[attr-defined]
    return event.body  # type: ignore[attr-defined,no-any-return]


@pytest.mark.parametrize("worker", [{"srtp": "required"}, {}], indirect=True, ids=["required", "optional"])
@pytest.mark.parametrize("suite", SUITES)
async def test_an_srtp_call_echoes_the_callers_audio(worker: MediaWorker, suite: str) -> None:
    async with SipPeer() as peer:
        # The phone offers a suite we do not take first: the gateway skips it and takes the next (RFC 4568 §5.1.2).
        call = peer.invite(_target(worker), srtp=("F8_128_HMAC_SHA1_80", suite))
        body = await _answered(peer, call)
        media = parse_sdp(body).media[0]
        assert media.proto == "RTP/SAVP"
        [(_, line)] = crypto_lines(media)
        assert (line.tag, line.suite) == (2, suite)  # type: ignore[union-attr]
        assert call.srtp is not None
        sent = speechlike(2.0)
        await peer.stream(call, sent)
        await peer.stream(call, np.zeros(8000, np.int16), frames=15)  # let the echo drain
        [leg] = list(worker.legs.values())
        snapshot = worker.snapshot_of(leg)
        assert snapshot.srtp == suite and snapshot.codec == "PCMU"
        assert leg.cost == worker.capacity_used() == 1.2  # a G.711 call plus srtp_call_cost
        assert snapshot.stats.rtp_packets_in >= 100 and snapshot.stats.rtp_lost == 0
        assert worker.engine.stats(leg.id, worker.clock_now()).dropped == {}
        peer.hang_up(call)
        await asyncio.wait_for(leg.task, timeout=5)  # type: ignore[arg-type]
        assert call.srtp_refused == []  # every packet of the gateway's authenticated
        correlation = best_correlation(sent, peer.heard(call))
        assert correlation > 0.9, correlation
    assert worker.legs == {} and worker.ports.in_use == frozenset()


async def test_refused_packets_are_counted_never_played_and_the_call_goes_on(worker: MediaWorker) -> None:
    before = {
        reason: _sample("gateway_srtp_dropped_total", worker="w-srtp", reason=reason)
        for reason in ("srtp_plaintext", "srtp_auth_failed", "srtp_replay")
    }
    async with SipPeer() as peer:
        call = peer.invite(_target(worker), srtp=(SUITES[0],))
        await _answered(peer, call)
        assert call.srtp is not None
        sent = speechlike(1.0)
        await peer.stream(call, sent[:4000])
        loud = np.full(160, 20000, np.int16)  # a full-scale frame: it would show in the echo if it were played
        plain = build_rtp(payload_type=0, sequence_number=5, timestamp=800, ssrc=0x1234, payload=ulaw_encode(loud))
        forger = SrtpContext(call.srtp.config)  # the phone's key, its own sender state
        protected = forger.protect(
            build_rtp(payload_type=0, sequence_number=3000, timestamp=9000, ssrc=0x1234, payload=ulaw_encode(loud))
        )
        tampered = bytearray(protected)
        tampered[30] ^= 0x55
        assert call.last_sent is not None
        for data in (plain, plain, bytes(tampered), call.last_sent):  # the last: a replay of one the gateway had
            peer.send_raw(call, data)
        await peer.stream(call, sent[4000:])
        await peer.stream(call, np.zeros(8000, np.int16), frames=15)
        [leg] = list(worker.legs.values())
        dropped = worker.engine.stats(leg.id, worker.clock_now()).dropped
        assert dropped == {"srtp_plaintext": 2, "srtp_auth_failed": 1, "srtp_replay": 1}
        worker.export_counters()
        for reason, count in (("srtp_plaintext", 2), ("srtp_auth_failed", 1), ("srtp_replay", 1)):
            assert _sample("gateway_srtp_dropped_total", worker="w-srtp", reason=reason) - before[reason] == count
        assert _sample("gateway_rtp_dropped_total", worker="w-srtp", reason="srtp_plaintext") == 0.0
        peer.hang_up(call)
        await asyncio.wait_for(leg.task, timeout=5)  # type: ignore[arg-type]
        heard = peer.heard(call)
        assert np.abs(heard).max() < 19000  # none of the loud frames came back
        correlation = best_correlation(sent, heard)
        assert correlation > 0.9, correlation


async def _refused(worker: MediaWorker, **invite: object) -> OutboundCallFailed:
    async with SipPeer() as peer:
        call = peer.invite(_target(worker), **invite)  # type: ignore[arg-type]
        failed = await peer.wait_for(OutboundCallFailed, call=call.handle)
    assert worker.ports.in_use == frozenset()
    return failed  # type: ignore[return-value]


@pytest.mark.parametrize("worker", [{"srtp": "required"}], indirect=True)
async def test_required_refuses_a_plain_offer_with_488(worker: MediaWorker) -> None:
    failed = await _refused(worker)
    assert (failed.status, failed.reason) == (488, "SRTP: SRTP is required here and the offer has no a=crypto")


@pytest.mark.parametrize("worker", [{"srtp": "required"}], indirect=True)
async def test_required_takes_an_osrtp_offer_as_srtp(worker: MediaWorker) -> None:
    async with SipPeer() as peer:
        call = peer.invite(_target(worker), srtp=(SUITES[1],), srtp_profile="RTP/AVP")
        body = await _answered(peer, call)
        assert parse_sdp(body).media[0].proto == "RTP/AVP" and call.srtp is not None
        await peer.stream(call, speechlike(0.5))
        [leg] = list(worker.legs.values())
        assert worker.snapshot_of(leg).srtp == SUITES[1]
        peer.hang_up(call)
        await asyncio.wait_for(leg.task, timeout=5)  # type: ignore[arg-type]
        assert len(peer.heard(call)) > 0 and call.srtp_refused == []


@pytest.mark.parametrize("worker", [{"srtp": "off"}], indirect=True)
async def test_off_refuses_savp_with_488_and_answers_osrtp_plainly(worker: MediaWorker) -> None:
    async with SipPeer() as peer:  # one phone for both calls: a second would repeat the first's Call-ID (seeded)
        refused = peer.invite(_target(worker), srtp=(SUITES[0],))
        failed = await peer.wait_for(OutboundCallFailed, call=refused.handle)
        assert (failed.status, failed.reason) == (  # type: ignore[attr-defined]
            488,
            "SRTP: the offer's audio is RTP/SAVP only and SRTP is off here",
        )
        call = peer.invite(_target(worker), srtp=(SUITES[0],), srtp_profile="RTP/AVP")
        body = await _answered(peer, call)
        assert b"a=crypto" not in body and call.srtp is None
        [leg] = list(worker.legs.values())
        assert worker.snapshot_of(leg).srtp == ""
        assert leg.cost == 1.0  # plain RTP: no srtp_call_cost
        peer.hang_up(call)
        await asyncio.wait_for(leg.task, timeout=5)  # type: ignore[arg-type]


async def test_bad_crypto_only_gets_488_naming_the_line(worker: MediaWorker) -> None:
    body = (
        b"v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
        b"m=audio 40000 RTP/SAVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
        b"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:c2hvcnQ=\r\n"
    )
    failed = await _refused(worker, body=body)
    assert (failed.status, failed.reason) == (
        488,
        "SRTP: no usable a=crypto: a=crypto:1 key of 5 octets, AES_CM_128_HMAC_SHA1_80 needs 30",
    )


async def test_a_reoffer_with_a_new_key_rekeys_the_inbound_side_only(worker: MediaWorker) -> None:
    async with SipPeer() as peer:
        call = peer.invite(_target(worker), srtp=(SUITES[0],))
        first_answer = await _answered(peer, call)
        sent = speechlike(2.0)
        await peer.stream(call, sent[:8000])
        peer.rekey(call, bytes(range(1, 31)))
        answered = await peer.wait_for(ReinviteAnswered, call=call.handle)
        # The gateway keeps its own key (same suite): its outbound context, replay window and ROC carry on.
        [(_, ours_before)] = crypto_lines(parse_sdp(first_answer).media[0])
        [(_, ours_after)] = crypto_lines(parse_sdp(answered.body).media[0])  # type: ignore[attr-defined]
        assert ours_after == ours_before
        peer.rekeyed(call, answered.body)  # type: ignore[attr-defined]
        await peer.stream(call, sent[8000:])
        await peer.stream(call, np.zeros(8000, np.int16), frames=15)
        [leg] = list(worker.legs.values())
        assert worker.engine.stats(leg.id, worker.clock_now()).dropped == {}
        peer.hang_up(call)
        await asyncio.wait_for(leg.task, timeout=5)  # type: ignore[arg-type]
        assert call.srtp_refused == []
        # The phone stops sending for the re-INVITE's round trip, its timestamps running on as if it had not: the
        # gateway's jitter buffer conceals the gap and re-buffers (an underrun), so the echo of the second half
        # comes a few frames later than one alignment of the whole would have it. Each half is judged alone.
        heard = peer.heard(call)
        before, before_lag = align_and_correlate(sent[:8000], heard, 8000)
        after, after_lag = align_and_correlate(sent[8000:], heard, 8000)
        assert before > 0.9 and after > 0.9, (before, after)
        assert after_lag >= before_lag + 8000, (before_lag, after_lag)  # in order, nothing heard twice


async def test_an_outbound_call_offers_osrtp_and_uses_the_answers_key(worker: MediaWorker) -> None:
    from gateway.fleet.models import AdmissionDecision, OriginateRequest

    async with SipPeer() as callee:
        await worker.originate(
            OriginateRequest(to=f"sip:callee@127.0.0.1:{callee.port}"),
            AdmissionDecision(accepted=True, call_id="c-out", route="default"),
        )
        offered = await callee.wait_for(CallOffered)
        media = parse_sdp(offered.body).media[0]  # type: ignore[attr-defined]
        # Until the answer names codec and SRTP, the call takes the dearest it could be: Opus with SRTP.
        assert worker.legs["c-out"].cost == worker.settings.costs.opus_call_cost + worker.settings.costs.srtp_call_cost
        assert media.proto == "RTP/AVP"  # RFC 8643: a plain callee ignores the crypto lines
        assert [(p.tag, p.suite) for _, p in crypto_lines(media)] == [(1, SUITES[0]), (2, SUITES[1])]  # type: ignore[union-attr]
        call = callee.answer(offered, srtp_tag=2)  # type: ignore[arg-type]
        assert call.srtp is not None
        await callee.stream(call, speechlike(1.0))
        leg = worker.legs["c-out"]
        assert worker.snapshot_of(leg).srtp == SUITES[1] and leg.cost == 1.2
        callee.hang_up(call)
        await asyncio.wait_for(leg.task, timeout=5)  # type: ignore[arg-type]
        assert call.srtp_refused == [] and len(callee.heard(call)) > 4000
        assert worker.engine.dropped.get("srtp_auth_failed", 0) == 0
