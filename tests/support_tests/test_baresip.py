"""baresip phones call each other on loopback: audio arrives intact, DTMF arrives as events."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.audio import align_and_correlate, read_wav, rms_dbfs
from tests.support.baresip import BaresipPhone
from tests.support.peers import require_binary
from tests.support.procs import ProcessGroup

pytestmark = [pytest.mark.peer, pytest.mark.timeout(60)]


@pytest.fixture(autouse=True)
def _baresip() -> None:
    require_binary("baresip", package="baresip baresip-core")


async def _call_and_compare(
    procs: ProcessGroup, tmp_path: Path, wav: Path, codecs: tuple[str, ...], *, use_envelope: bool
) -> tuple[float, int]:
    callee = BaresipPhone(
        procs, tmp_path, source_wav=wav, name="callee", codecs=codecs, auto_answer=True, tail_silence=3
    )
    caller = BaresipPhone(procs, tmp_path, source_wav=wav, name="caller", codecs=codecs)
    async with callee, caller:
        await caller.dial(callee.sip_uri)
        await caller.wait_established(within=10)
        await callee.wait_established(within=10)
        # The caller hangs up when its WAV ends; both sides then see the call closed.
        await caller.wait_closed(within=15)
        await callee.wait_closed(within=10)
    sent = read_wav(wav)
    heard = read_wav(callee.last_recording().decoded)
    assert heard.rate == sent.rate and heard.channels == sent.channels
    assert rms_dbfs(heard.samples) > -40, "the callee recorded (near) silence"
    return align_and_correlate(sent.samples, heard.samples, sent.rate, use_envelope=use_envelope)


async def test_pcmu_call_carries_speech(peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path) -> None:
    correlation, lag = await _call_and_compare(peer_procs, tmp_path, speech_8k, ("pcmu",), use_envelope=False)
    print(f"PCMU correlation={correlation:.3f} lag={lag}")
    assert correlation >= 0.9
    assert 0 <= lag < 8000 * 2


async def test_opus_stereo_call_carries_speech(
    peer_procs: ProcessGroup, tmp_path: Path, speech_48k_stereo: Path
) -> None:
    correlation, lag = await _call_and_compare(peer_procs, tmp_path, speech_48k_stereo, ("opus",), use_envelope=False)
    print(f"Opus correlation={correlation:.3f} lag={lag}")
    assert correlation >= 0.9
    assert 0 <= lag < 48000 * 2


async def test_dtmf_reaches_the_other_phone(peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path) -> None:
    callee = BaresipPhone(peer_procs, tmp_path, source_wav=speech_8k, name="callee", auto_answer=True, tail_silence=10)
    caller = BaresipPhone(peer_procs, tmp_path, source_wav=speech_8k, name="caller", tail_silence=10)
    async with callee, caller:
        await caller.dial(callee.sip_uri)
        await callee.wait_established(within=10)
        await caller.send_dtmf("12#*9")
        assert await callee.wait_dtmf("12#*9", within=10) == "12#*9"
        await caller.hangup()
        closed = await callee.wait_closed(within=10)
        assert closed.peer_uri == caller.sip_uri
