"""Wideband phones call ``gateway run`` over G.722 and hear themselves through the whole media path.

baresip (its g722 module, spandsp's codec) and pjsua2 (PJSIP's own G.722) each offer G722/8000 only, send 16 kHz
speech, and record what comes back at 16 kHz; the echo must correlate >= 0.9 with what they sent, and the call
record must say G722. pjsua2 also presses keys (RFC 4733 telephone-event/8000 beside PT 9), and baresip calls once
over SDES SRTP.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.gateway_proc import start_gateway
from tests.e2e.test_sip_echo import _echo_heard, _ended_call
from tests.support.audio import align_and_correlate, read_wav, speech_wav, with_silence, write_wav
from tests.support.baresip import BaresipPhone
from tests.support.fixtures import SPEECH, require_speech_tools
from tests.support.peers import require_binary, require_module
from tests.support.pjsua import PjsuaPhone
from tests.support.procs import ProcessGroup

pytestmark = [pytest.mark.peer, pytest.mark.timeout(120)]

RATE = 16000


@pytest.fixture
def speech_16k(tmp_path: Path) -> Path:
    """Spoken English, 16 kHz mono PCM16 (baresip's aufile does not resample: G.722 phones want 16 kHz)."""
    require_speech_tools()
    return speech_wav(SPEECH, tmp_path / "speech_16k.wav", rate=RATE, channels=1)


@pytest.mark.parametrize("mediaenc", [None, "srtp-mand"], ids=["rtp", "srtp"])
async def test_baresip_g722_hears_its_own_speech(
    peer_procs: ProcessGroup, tmp_path: Path, speech_16k: Path, mediaenc: str | None
) -> None:
    require_binary("baresip", package="baresip baresip-core")
    gateway = await start_gateway(peer_procs)
    phone = BaresipPhone(
        peer_procs, tmp_path, source_wav=speech_16k, codecs=("g722",), tail_silence=1.5, mediaenc=mediaenc
    )
    async with phone:
        await phone.dial(gateway.sip_uri)
        await phone.wait_established(within=15)
        await phone.wait_closed(within=40)
    sent = read_wav(speech_16k)
    heard = read_wav(phone.last_recording().decoded)
    assert heard.rate == RATE
    correlation, lag = align_and_correlate(sent.samples, heard.samples, RATE, max_slip_seconds=0.25)
    call = await _ended_call(gateway)
    assert correlation >= 0.9, _echo_heard(correlation, lag, call)
    assert call["codec"] == "G722"
    assert call["end_reason"] == "caller_hangup"
    stats = call["stats"]
    assert stats["rtp_packets_in"] > 100 and stats["rtp_packets_out"] > 100
    assert not stats.get("malformed")
    if mediaenc:
        assert call["srtp"].startswith("AES_CM_128_HMAC_SHA1")


async def test_pjsua_g722_echo_with_rfc4733_dtmf(peer_procs: ProcessGroup, tmp_path: Path, speech_16k: Path) -> None:
    require_module("pjsua2", package="pjsua2-python")
    gateway = await start_gateway(peer_procs)
    speech = read_wav(speech_16k)
    spoken_s = len(speech.samples) / speech.rate
    played = write_wav(tmp_path / "speech_then_keys.wav", with_silence(speech, tail=2.5).samples, speech.rate)
    phone = PjsuaPhone(
        peer_procs,
        tmp_path,
        mode="caller",
        uri=gateway.sip_uri,
        play=played,
        dtmf=[(spoken_s + 0.4, "4"), (spoken_s + 0.9, "2")],
        hangup_on_eof=True,
        codecs=("G722",),
        clock_rate=RATE,  # pjsua2's bridge, player and recorder at 16 kHz: nothing narrows the band on its side
    )
    async with phone:
        await phone.wait_state("CONFIRMED", within=15)
        await phone.wait_done(within=40)
    assert (phone.negotiated_codec() or "").upper().startswith("G722")
    heard = read_wav(phone.recording)
    assert heard.rate == RATE
    correlation, lag = align_and_correlate(speech.samples, heard.samples, RATE, max_slip_seconds=0.15)
    call = await _ended_call(gateway)
    assert correlation >= 0.9, _echo_heard(correlation, lag, call)
    assert call["codec"] == "G722"
    pressed = [line["text"] for line in call["transcript"] if line["role"] == "user" and "pressed" in line["text"]]
    assert [text.split("pressed ")[1][0] for text in pressed] == ["4", "2"]
