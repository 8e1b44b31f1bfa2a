"""pjsua2 (in its helper process) and baresip call each other: audio and RFC 4733 DTMF arrive."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.audio import align_and_correlate, read_wav, rms_dbfs
from tests.support.baresip import BaresipPhone
from tests.support.peers import require_binary, require_module
from tests.support.pjsua import PJSUA_TELEPHONE_EVENT_PT, PjsuaPhone
from tests.support.procs import ProcessGroup

pytestmark = [pytest.mark.peer, pytest.mark.timeout(60)]


@pytest.fixture(autouse=True)
def _peers() -> None:
    require_module("pjsua2", package="pjsua2-python")
    require_binary("baresip", package="baresip baresip-core")


async def test_pjsua_caller_speech_reaches_baresip_callee(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    callee = BaresipPhone(peer_procs, tmp_path, source_wav=speech_8k, name="callee", auto_answer=True, tail_silence=8)
    async with callee:
        caller = PjsuaPhone(
            peer_procs, tmp_path, mode="caller", uri=callee.sip_uri, play=speech_8k, hangup_on_eof=True, max_seconds=20
        )
        async with caller:
            await caller.wait_state("CONFIRMED", within=10)
            assert caller.negotiated_codec() == "PCMU"
            await callee.wait_established(within=5)
            await caller.wait_event("player_eof", within=15)
            await callee.wait_closed(within=10)
            assert await caller.wait_done(within=10) == 0
    sent = read_wav(speech_8k)
    heard = read_wav(callee.last_recording().decoded)
    assert rms_dbfs(heard.samples) > -40
    correlation, lag = align_and_correlate(sent.samples, heard.samples, sent.rate)
    print(f"pjsua -> baresip correlation={correlation:.3f} lag={lag}")
    assert correlation >= 0.9
    # What pjsua recorded is baresip's speech (callee plays the same sentence back at it).
    assert caller.recording is not None
    back = read_wav(caller.recording)
    assert back.rate == 8000
    back_correlation, _ = align_and_correlate(sent.samples, back.samples, 8000)
    print(f"baresip -> pjsua correlation={back_correlation:.3f}")
    assert back_correlation >= 0.9


async def test_baresip_dtmf_reaches_pjsua_callee(peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path) -> None:
    callee = PjsuaPhone(peer_procs, tmp_path, mode="callee", max_seconds=20)
    async with callee:
        caller = BaresipPhone(peer_procs, tmp_path, source_wav=speech_8k, name="caller", tail_silence=10)
        async with caller:
            await caller.dial(callee.sip_uri)
            await caller.wait_established(within=10)
            await callee.wait_state("CONFIRMED", within=5)
            await caller.send_dtmf("5*0#")
            await callee.wait_event("dtmf_received", within=10, nth=4)
            assert callee.received_dtmf() == "5*0#"
            await caller.hangup()
            await callee.wait_state("DISCONNECTED", within=10)
            assert await callee.wait_done(within=10) == 0


async def test_pjsua_dtmf_reaches_baresip_callee(peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path) -> None:
    callee = BaresipPhone(peer_procs, tmp_path, source_wav=speech_8k, name="callee", auto_answer=True, tail_silence=10)
    async with callee:
        caller = PjsuaPhone(
            peer_procs,
            tmp_path,
            mode="caller",
            uri=callee.sip_uri,
            dtmf=[(0.5, "1"), (0.9, "2"), (1.3, "3")],
            hangup_after=3.0,
        )
        async with caller:
            await caller.wait_event("dtmf_sent", within=10, nth=3)
            assert await callee.wait_dtmf("123", within=5) == "123"
            await caller.wait_state("DISCONNECTED", within=10)
            await callee.wait_closed(within=5)
    offer = caller.pjsip_log.read_text()
    assert f"a=rtpmap:{PJSUA_TELEPHONE_EVENT_PT} telephone-event/8000" in offer
