"""Real phones call ``gateway run`` with SDES SRTP media and hear themselves through the whole media path.

baresip (srtp.so, ``mediaenc=srtp-mand``: RTP/SAVP, or ``srtp``: RTP/AVP with a=crypto) and pjsua2 (libsrtp in
PJSIP, secure signalling not required) call over UDP SIP; their echoed speech must correlate >= 0.9 with what
they sent, the call record names the suite, and nothing the phone sent was refused. A plain RTP packet sent into
an SRTP call is counted and not played; a plain offer to a gateway that requires SRTP gets 488.
"""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pytest

from gateway.media.rtp import build_rtp
from telcodecs.g711 import ulaw_encode
from tests.e2e.gateway_proc import GatewayProcess, start_gateway
from tests.e2e.ops_support import metric_value, poll
from tests.e2e.test_sip_echo import _echo_heard, _ended_call
from tests.support.audio import align_and_correlate, read_wav
from tests.support.baresip import BaresipPhone
from tests.support.peers import require_binary, require_module
from tests.support.pjsua import PjsuaPhone
from tests.support.procs import ProcessGroup

pytestmark = [pytest.mark.peer, pytest.mark.timeout(120)]


async def _live_call(gateway: GatewayProcess) -> dict:
    async def live() -> dict | None:
        calls = await gateway.api("GET", "/v1/calls", params={"state": "active"})
        items = calls["items"] if isinstance(calls, dict) else calls
        return items[0] if items else None

    found = await poll(live, within=10, what="the live call")
    assert found is not None
    return found


async def _srtp_dropped(gateway: GatewayProcess, reason: str) -> float:
    async with gateway.client() as client:
        text = (await client.get("/metrics")).text
    return metric_value(text, "gateway_srtp_dropped_total", {"reason": reason}) or 0.0


@pytest.mark.parametrize("mediaenc", ["srtp-mand", "srtp"])  # RTP/SAVP; RTP/AVP with a=crypto (OSRTP)
async def test_baresip_hears_its_own_speech_over_srtp(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path, mediaenc: str
) -> None:
    require_binary("baresip", package="baresip baresip-core")
    gateway = await start_gateway(peer_procs, env={"GATEWAY_SRTP": "required"})
    phone = BaresipPhone(
        peer_procs, tmp_path, source_wav=speech_8k, codecs=("pcmu",), tail_silence=1.5, mediaenc=mediaenc
    )
    async with phone:
        await phone.dial(gateway.sip_uri)
        await phone.wait_established(within=15)
        live = await _live_call(gateway)
        during_call = await _unencrypted_rtcp_while_live(gateway)
        await phone.wait_closed(within=40)
    sent = read_wav(speech_8k)
    heard = read_wav(phone.last_recording().decoded)
    correlation, lag = align_and_correlate(sent.samples, heard.samples, 8000, max_slip_seconds=0.25)
    call = await _ended_call(gateway)
    assert correlation >= 0.9, _echo_heard(correlation, lag, call)
    assert live["srtp"] in ("AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32"), live
    assert call["srtp"] == live["srtp"] and call["codec"] == "PCMU"
    assert call["end_reason"] == "caller_hangup" and call["stats"]["rtp_packets_in"] > 100
    for reason in ("srtp_auth_failed", "srtp_replay", "srtp_plaintext", "srtcp_auth_failed"):
        assert await _srtp_dropped(gateway, reason) == 0.0, reason
    # baresip 1.0 sends its RTCP BYE (reason "Adjo") in the clear a few ms after its SIP BYE, once its SRTP is
    # torn down; when it reaches the call's port before the gateway releases it, it is counted, rightly, as
    # unencrypted SRTCP. While the call was up, none was.
    assert during_call == 0.0
    assert await _srtp_dropped(gateway, "srtcp_unencrypted") <= 1.0


async def _unencrypted_rtcp_while_live(gateway: GatewayProcess) -> float:
    """The srtcp_unencrypted count last read while the call was still listed active, read until it is not."""
    seen: list[float] = []

    async def ended() -> bool:
        value = await _srtp_dropped(gateway, "srtcp_unencrypted")  # read before the listing: then it was live
        calls = await gateway.api("GET", "/v1/calls", params={"state": "active"})
        if calls["items"] if isinstance(calls, dict) else calls:
            seen.append(value)
            return False
        return True

    await poll(ended, within=40, what="the call's end", every=0.25)
    assert seen, "the call ended before its SRTCP count was read"
    return seen[-1]


async def test_a_plain_packet_into_an_srtp_call_is_counted_not_played(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    require_binary("baresip", package="baresip baresip-core")
    gateway = await start_gateway(peer_procs, env={"GATEWAY_SRTP": "required", "GATEWAY_RTP_STRICT_SOURCE": "false"})
    phone = BaresipPhone(
        peer_procs, tmp_path, source_wav=speech_8k, codecs=("pcmu",), tail_silence=1.5, mediaenc="srtp-mand"
    )
    async with phone:
        await phone.dial(gateway.sip_uri)
        await phone.wait_established(within=15)
        live = await _live_call(gateway)
        # Plain RTP from an address the gateway does not know, to every RTP port of its range (the call holds one):
        # with GATEWAY_RTP_STRICT_SOURCE=false a plain packet that were taken would latch and be played.
        loud = ulaw_encode(np.full(160, 32000, np.int16))  # full scale: louder than anything in the speech
        first, last = gateway.rtp_range
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for port in range(first + first % 2, last, 2):
                packet = build_rtp(payload_type=0, sequence_number=port, timestamp=160, ssrc=0xBAD, payload=loud)
                sock.sendto(packet, ("127.0.0.1", port))

        async def counted() -> float | None:
            value = await _srtp_dropped(gateway, "srtp_plaintext")
            return value if value >= 1 else None

        assert await poll(counted, within=10, what="the plain packet counted") == 1.0
        await phone.wait_closed(within=40)
    heard = read_wav(phone.last_recording().decoded)
    sent = read_wav(speech_8k)
    assert np.abs(sent.samples).max() < 29000
    assert np.abs(heard.samples).max() < 30000  # the full-scale plain frame was never played back
    correlation, lag = align_and_correlate(sent.samples, heard.samples, 8000, max_slip_seconds=0.25)
    assert correlation >= 0.9, _echo_heard(correlation, lag, await _ended_call(gateway))
    assert live["srtp"]


async def test_a_plain_offer_to_a_gateway_that_requires_srtp_gets_488(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    require_binary("baresip", package="baresip baresip-core")
    gateway = await start_gateway(peer_procs, env={"GATEWAY_SRTP": "required"})
    phone = BaresipPhone(peer_procs, tmp_path, source_wav=speech_8k, codecs=("pcmu",))
    async with phone:
        await phone.dial(gateway.sip_uri)
        closed = await phone.wait_closed(within=15)
    assert "488" in (closed.param or ""), closed
    async with gateway.client() as client:
        text = (await client.get("/metrics")).text
    # Refused before admission, the call is in no listing; the worker counts why it ended.
    assert metric_value(text, "gateway_calls_total", {"end_reason": "srtp_refused"}) == 1.0


async def test_pjsua_hears_its_own_speech_over_srtp(peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path) -> None:
    require_module("pjsua2", package="pjsua2-python")
    gateway = await start_gateway(peer_procs, env={"GATEWAY_SRTP": "required"})
    phone = PjsuaPhone(
        peer_procs, tmp_path, mode="caller", uri=gateway.sip_uri, play=speech_8k, hangup_on_eof=True, srtp="mandatory"
    )
    async with phone:
        await phone.wait_state("CONFIRMED", within=15)
        live = await _live_call(gateway)
        await phone.wait_done(within=40)
    heard = read_wav(phone.recording)
    correlation, lag = align_and_correlate(read_wav(speech_8k).samples, heard.samples, 8000, max_slip_seconds=0.25)
    assert correlation >= 0.9, _echo_heard(correlation, lag, await _ended_call(gateway))
    assert live["srtp"] in ("AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32"), live
    assert await _srtp_dropped(gateway, "srtp_auth_failed") == 0.0
