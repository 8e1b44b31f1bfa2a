"""Early media with real phones (pjsua2): audio before the 200 OK, both ways (docs/operations.md, "Early media").

1. A route with ``early_media = "tone"``: the calling phone gets a 183 with SDP, receives the ringback tone's RTP
   (counted at its CONFIRMED, found at 425 Hz in its recording before the 200) and then the call goes on (the
   agent's greeting after the 200).
2. A route with ``early_media = "greeting"``: the agent's greeting (the fake provider's tone) plays in early media
   and the call is answered when it has played out, not at the route's cap.
1b. The same with a caller that requires 100rel (RFC 3262): the 180/183 come reliably, the phone PRACKs them.
3. An outbound call to a phone that answers 183 and plays a known tone pattern before its 200: the gateway receives
   it (the call's early frame count, and the caller channel of the call's recording before the answer) while the
   agent's greeting comes only after the 200.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile

from tests.e2e.ops_support import poll
from tests.e2e.provider_harness import bursts, start_fake_provider, start_gateway_on_fake
from tests.support.audio import Wav, read_wav, silence, tone, write_wav
from tests.support.peers import require_module
from tests.support.pjsua import PjsuaEvent, PjsuaPhone
from tests.support.procs import ProcessGroup

pytestmark = [pytest.mark.peer, pytest.mark.timeout(120)]

RINGBACK_HZ = 425.0
AGENT_HZ = 440.0  # the fake provider's tone replies
CALLEE_HZ = 700.0


async def _ended(gateway: Any) -> dict[str, Any]:
    async def one() -> dict[str, Any] | None:
        page = await gateway.api("GET", "/v1/calls", params={"state": "ended"})
        items = page["items"] if isinstance(page, dict) else page
        if not items:
            return None
        record: dict[str, Any] = await gateway.api("GET", f"/v1/calls/{items[0]['id']}")
        return record

    record: dict[str, Any] = await poll(one, within=15, what="the ended call")
    return record


def _state(phone: PjsuaPhone, code: int) -> PjsuaEvent:
    return next(e for e in phone.events if e.name == "call_state" and e.get("code") == code)


def _confirmed(phone: PjsuaPhone) -> PjsuaEvent:
    return next(e for e in phone.events if e.name == "call_state" and e.get("state") == "CONFIRMED")


async def _ring_and_answer(
    procs: ProcessGroup,
    tmp_path: Path,
    *,
    reply_ms: str,
    greeting: str,
    route_lines: tuple[str, ...],
    hangup_after: float,
    prack: str = "off",
) -> tuple[Any, PjsuaPhone]:
    """A pjsua2 caller (quiet, PCMU) on a route with early media, through to its hang-up: the gateway and phone."""
    require_module("pjsua2", package="pjsua2 (the test extra)")
    fake = await start_fake_provider(procs, "--mode", "tone", "--reply-ms", reply_ms)
    gateway = await start_gateway_on_fake(
        procs, tmp_path, fake, profile_lines=(f'greeting = "{greeting}"',), route_lines=route_lines
    )
    quiet = write_wav(tmp_path / "quiet.wav", silence(8.0, 8000), 8000)
    phone = PjsuaPhone(
        procs,
        tmp_path,
        mode="caller",
        uri=gateway.sip_uri,
        play=quiet,
        hangup_after=hangup_after,
        codecs=("PCMU",),
        prack=prack,
    )
    async with phone:
        await phone.wait_state("CONFIRMED", within=15)
        assert await phone.wait_done(within=20) == 0
    return gateway, phone


async def test_a_tone_route_rings_in_early_media_then_answers(peer_procs: ProcessGroup, tmp_path: Path) -> None:
    route = ('early_media = "tone"', "early_media_s = 2.0")
    gateway, phone = await _ring_and_answer(
        peer_procs, tmp_path, reply_ms="400", greeting="Hello.", route_lines=route, hangup_after=2.0
    )
    early, confirmed = _state(phone, 183), _confirmed(phone)
    assert 1.8 <= confirmed.t - early.t <= 2.6, (early, confirmed)
    # 2 s of early media at 20 ms a packet reached the phone before its 200 (its stream counts from the 183).
    assert 80 <= confirmed.get("rx_packets") <= 110, confirmed
    heard = read_wav(phone.recording)  # type: ignore[arg-type]
    media_at = next(e.t for e in phone.events if e.name == "media_active")
    assert media_at <= early.t + 0.2, "the phone's media started on the 183"
    rings = [b for b in bursts(heard) if abs(b.frequency_hz - RINGBACK_HZ) < 10]
    assert len(rings) == 1 and 900 <= rings[0].duration_ms <= 1100, bursts(heard)
    assert rings[0].end_s < confirmed.t - media_at, (rings, confirmed.t - media_at)
    # The call then goes on as any: the agent greets after the 200 (the fake provider's 400 ms tone).
    greeted = [b for b in bursts(heard) if abs(b.frequency_hz - AGENT_HZ) < 10]
    assert len(greeted) == 1 and greeted[0].start_s > confirmed.t - media_at, (greeted, confirmed.t - media_at)
    record = await _ended(gateway)
    assert record["end_reason"] == "caller_hangup" and 90 <= record["stats"]["early_media_frames_out"] <= 110, record
    assert re.search(r"early media tone for 2\.\d+ s: \d+ frames sent", gateway.process.output)
    pjsip_log = phone.pjsip_log.read_text(errors="replace")
    assert "SIP/2.0 183 Session Progress" in pjsip_log


async def test_a_caller_requiring_100rel_gets_a_reliable_183_prack_and_ringback(
    peer_procs: ProcessGroup, tmp_path: Path
) -> None:
    route = ('early_media = "tone"', "early_media_s = 2.0")
    gateway, phone = await _ring_and_answer(
        peer_procs, tmp_path, reply_ms="400", greeting="Hello.", route_lines=route, hangup_after=1.0, prack="mandatory"
    )
    pjsip_log = phone.pjsip_log.read_text(errors="replace")
    assert re.search(r"^Require:\s*100rel", pjsip_log, re.M | re.I), "the phone's INVITE requires 100rel"
    assert "SIP/2.0 420" not in pjsip_log
    # Our 18x came reliably (RSeq), the phone PRACKed and got 200 for its PRACK.
    assert re.search(r"^RSeq:\s*\d+", pjsip_log, re.M), "no RSeq in our 18x"
    assert re.search(r"^PRACK sip:", pjsip_log, re.M) and re.search(r"^CSeq:\s*\d+ PRACK", pjsip_log, re.M)
    assert re.search(r"SIP/2\.0 200 OK.*?CSeq:\s*\d+ PRACK", pjsip_log, re.S), "no 200 for the PRACK"
    early, confirmed = _state(phone, 183), _confirmed(phone)
    assert 1.8 <= confirmed.t - early.t <= 2.8, (early, confirmed)
    heard = read_wav(phone.recording)  # type: ignore[arg-type]
    media_at = next(e.t for e in phone.events if e.name == "media_active")
    rings = [b for b in bursts(heard) if abs(b.frequency_hz - RINGBACK_HZ) < 10]
    assert len(rings) == 1 and 900 <= rings[0].duration_ms <= 1100, bursts(heard)
    assert rings[0].end_s < confirmed.t - media_at, (rings, confirmed.t - media_at)
    record = await _ended(gateway)
    assert record["end_reason"] == "caller_hangup", record


async def test_a_greeting_route_plays_the_greeting_in_early_media(peer_procs: ProcessGroup, tmp_path: Path) -> None:
    route = ('early_media = "greeting"', "early_media_s = 8.0")
    _gateway, phone = await _ring_and_answer(
        peer_procs, tmp_path, reply_ms="1500", greeting="Welcome to the clinic.", route_lines=route, hangup_after=1.0
    )
    early, confirmed = _state(phone, 183), _confirmed(phone)
    waited = confirmed.t - early.t
    assert 1.5 <= waited < 4.0, f"answered {waited:.2f} s after the 183: on the greeting's end, not the 8 s cap"
    heard = read_wav(phone.recording)  # type: ignore[arg-type]
    media_at = next(e.t for e in phone.events if e.name == "media_active")
    greetings = [b for b in bursts(heard) if abs(b.frequency_hz - AGENT_HZ) < 10]
    assert len(greetings) == 1 and 1400 <= greetings[0].duration_ms <= 1600, bursts(heard)
    assert greetings[0].end_s < confirmed.t - media_at, (greetings, confirmed.t - media_at)
    assert confirmed.get("rx_packets") >= 75  # the greeting's packets came before the 200


async def test_an_outbound_calls_early_media_is_received_and_the_agent_waits_for_the_200(
    peer_procs: ProcessGroup, tmp_path: Path
) -> None:
    require_module("pjsua2", package="pjsua2 (the test extra)")
    fake = await start_fake_provider(peer_procs, "--mode", "tone", "--reply-ms", "600")
    gateway = await start_gateway_on_fake(
        peer_procs, tmp_path, fake, profile_lines=('greeting = "Hello."', 'record = "both"')
    )
    # The callee's "announcement" in early media: two 700 Hz bursts, then silence through and after its 200.
    pattern = np.concatenate(
        [tone(CALLEE_HZ, 0.5, 8000), silence(0.3, 8000)[:, 0], tone(CALLEE_HZ, 0.5, 8000), silence(8.0, 8000)[:, 0]]
    )
    announcement = write_wav(tmp_path / "announcement.wav", pattern, 8000)
    callee = PjsuaPhone(
        peer_procs,
        tmp_path,
        mode="callee",
        name="callee",
        play=announcement,
        early_media_s=2.0,
        hangup_after=2.0,
        codecs=("PCMU",),
    )
    async with callee, gateway.client() as api:
        response = await api.post("/v1/calls", json={"to": callee.sip_uri, "caller_id": "+15550199"})
        assert response.status_code == 201, response.text
        call_id = response.json()["id"]
        answered = await callee.wait_event("answered", within=15)
        assert await callee.wait_done(within=20) == 0
        record = await _ended(gateway)
        assert record["id"] == call_id
        assert 85 <= record["stats"]["early_media_frames_in"] <= 115, record["stats"]
        recording = await poll(
            lambda: _recording(gateway, call_id), within=15, what="the recording of the outbound call"
        )
        whole = await api.get(f"/v1/calls/{call_id}/recording")
        assert whole.status_code == 200
    data, rate = soundfile.read(io.BytesIO(whole.content), dtype="int16")
    assert recording["channels"] == 2
    caller, agent = Wav(samples=data[:, :1].copy(), rate=rate), Wav(samples=data[:, 1:].copy(), rate=rate)
    media_at = next(e.t for e in callee.events if e.name == "media_active")
    answered_at = answered.t - media_at  # the recording starts with the early media (the 183), as its player did
    heard = [b for b in bursts(caller) if abs(b.frequency_hz - CALLEE_HZ) < 10]
    assert len(heard) == 2 and all(400 <= b.duration_ms <= 600 for b in heard), bursts(caller)
    assert heard[1].end_s < answered_at, (heard, answered_at)
    spoke = [b for b in bursts(agent) if abs(b.frequency_hz - AGENT_HZ) < 10]
    assert spoke and spoke[0].start_s > answered_at - 0.1, (spoke, answered_at)
    assert answered.get("rx_packets") is not None  # the callee's stream ran from the 183


async def _recording(gateway: Any, call_id: str) -> dict[str, Any] | None:
    record: dict[str, Any] = await gateway.api("GET", f"/v1/calls/{call_id}")
    recording = record.get("recording")
    return recording if recording and recording.get("bytes") else None
