"""Hold with a real phone (pjsua2): the caller's phone holds mid-answer, and the gateway holds the caller.

- Caller hold: while the fake provider's long tone reply plays, the phone re-INVITEs with a=sendonly, then takes
  the call off hold and cuts in. The phone receives no RTP during the hold; the truncate the provider gets after
  the barge-in is exactly the agent audio the phone heard (the tone in its recording, before and after the hold);
  the control plane shows the call held and publishes ``call.held`` / ``call.resumed``.
- Gateway hold (``POST /v1/calls/{id}/hold`` and ``/unhold``): the phone is offered a=sendonly, hears the hold
  audio meanwhile, and then a=sendrecv.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.ops_support import EventStream, poll
from tests.e2e.provider_harness import (
    FakeProvider,
    bursts,
    caller_wav,
    start_fake_provider,
    start_gateway_on_fake,
)
from tests.support.audio import read_wav, silence, tone, write_wav
from tests.support.fixtures import require_speech_tools
from tests.support.peers import require_module
from tests.support.pjsua import PjsuaEvent, PjsuaPhone
from tests.support.procs import ProcessGroup

pytestmark = [pytest.mark.peer, pytest.mark.timeout(120)]

TURN_C = "Wait, one more thing please."  # 2.4 s
TURN_B = "My order number is four five six seven."  # 3.1 s
TONE_HZ = 440.0
# Per stretch of tone: a packet the phone's jitter buffer conceals or drops at an edge (20 ms), plus the 5 ms
# envelope window of ``bursts`` at each of its two edges; two stretches. Runs measured 36-37 ms short.
HEARD_TOLERANCE_MS = 60


def _require_peers() -> None:
    require_module("pjsua2", package="pjsua2 (the test extra)")
    require_speech_tools()


async def _live_call(gateway: Any) -> dict[str, Any]:
    async def one() -> dict[str, Any] | None:
        calls = await gateway.api("GET", "/v1/calls")
        items = calls["items"] if isinstance(calls, dict) else calls
        live = [c for c in items if c["state"] not in ("ended",)]
        return live[0] if live else None

    return await poll(one, within=15, what="a live call")


def _media_states(phone: PjsuaPhone) -> list[PjsuaEvent]:
    return [e for e in phone.events if e.name == "media_state"]


async def _truncations(fake: FakeProvider) -> list[dict[str, Any]]:
    (summary,) = await fake.records()
    detail = await fake.record(summary["id"])
    return list(detail["truncations"])


async def test_the_callers_hold_pauses_the_agent_and_the_truncate_is_what_the_phone_heard(
    peer_procs: ProcessGroup, tmp_path: Path
) -> None:
    _require_peers()
    # A 20 s reply streamed at four times real time: at the hold the provider is still generating and has
    # delivered far more than the caller heard, so counting frames during the hold would be caught.
    fake = await start_fake_provider(
        peer_procs, "--mode", "tone", "--reply-ms", "20000", "--paced", "--pace", "4", "--chunk-ms", "100"
    )
    gateway = await start_gateway_on_fake(peer_procs, tmp_path, fake)
    # The caller speaks (the agent answers with the tone), is silent through the hold, then cuts in.
    source = caller_wav(tmp_path / "caller.wav", [TURN_C, 5.6, TURN_B, 1.0])
    phone = PjsuaPhone(
        peer_procs,
        tmp_path,
        mode="caller",
        uri=gateway.sip_uri,
        play=source,
        hold_at=4.5,
        unhold_at=6.5,
        hangup_after=9.8,
        codecs=("PCMU",),
        max_seconds=25,
    )
    async with EventStream(gateway.http, gateway.token, last_event_id=0, name="sse") as stream, phone:
        await phone.wait_state("CONFIRMED", within=15)
        hold = await phone.wait_event("hold_sent", within=15)
        call = await _live_call(gateway)
        held = await poll(
            lambda: _state_is(gateway, call["id"], "held"), within=10, what="the call shown held by the API"
        )
        assert held["state"] == "held"
        unhold = await phone.wait_event("unhold_sent", within=10)
        await stream.wait_for(lambda e: e.type == "call.held" and e.call_id == call["id"], within=10)
        await stream.wait_for(lambda e: e.type == "call.resumed" and e.call_id == call["id"], within=10)
        assert await phone.wait_done(within=30) == 0

    # No RTP reached the phone while it held the call: from the end of the hold's re-INVITE to the unhold.
    on_hold = [e for e in _media_states(phone) if hold.t <= e.t <= unhold.t]
    assert on_hold, "the phone saw no media update for its hold"
    assert unhold.get("rx_packets") == on_hold[-1].get("rx_packets") is not None, (on_hold, unhold)

    # The gateway's own account: the hold kept the queued agent audio, the resume played it on.
    output = gateway.process.output
    held_line = re.search(r"held by caller, (\d+) ms of agent audio kept, cancelled=(\S+)", output)
    assert held_line is not None and int(held_line.group(1)) > 1000 and held_line.group(2) != "None", output[-3000:]
    assert re.search(r"resumed by caller after [\d.]+ s, (\d+) ms of agent audio to play", output)

    (cut,) = await _truncations(fake)
    sent_ms = int(cut["audio_end_ms"])
    # The phone's recording: the tone before the hold and after it, nothing in between.
    heard = read_wav(phone.recording)  # type: ignore[arg-type]
    media_at = next(e.t for e in phone.events if e.name == "media_active")
    tones = [b for b in bursts(heard) if abs(b.frequency_hz - TONE_HZ) < 10]
    assert len(tones) == 2, tones
    hold_from, hold_to = hold.t - media_at, unhold.t - media_at
    assert tones[0].end_s < hold_from + 0.3 and tones[1].start_s > hold_to - 0.05, (tones, hold_from, hold_to)
    heard_ms = sum(b.duration_ms for b in tones)
    assert abs(heard_ms - sent_ms) <= HEARD_TOLERANCE_MS, (tones, sent_ms)
    assert 2000 < sent_ms < 6000, sent_ms
    print(f"hold: truncated at {sent_ms} ms; the phone heard {heard_ms:.0f} ms in {len(tones)} stretches")


async def _state_is(gateway: Any, call_id: str, state: str) -> dict[str, Any] | None:
    call: dict[str, Any] = await gateway.api("GET", f"/v1/calls/{call_id}")
    return call if call["state"] == state else None


HOLD_HZ = 660.0  # the hold audio of the gateway-hold test


async def test_the_gateway_holds_the_caller_with_hold_audio(peer_procs: ProcessGroup, tmp_path: Path) -> None:
    _require_peers()
    fake = await start_fake_provider(peer_procs, "--mode", "tone", "--reply-ms", "400")
    music = write_wav(tmp_path / "hold.wav", tone(HOLD_HZ, 0.5, 16000, amplitude=0.3), 16000)
    gateway = await start_gateway_on_fake(peer_procs, tmp_path, fake, env={"GATEWAY_HOLD_AUDIO_FILE": str(music)})
    quiet = write_wav(tmp_path / "quiet.wav", silence(12.0, 8000), 8000)  # the caller never speaks
    phone = PjsuaPhone(
        peer_procs, tmp_path, mode="caller", uri=gateway.sip_uri, play=quiet, hangup_after=7.0, codecs=("PCMU",)
    )
    async with EventStream(gateway.http, gateway.token, last_event_id=0, name="sse") as stream, phone:
        await phone.wait_state("CONFIRMED", within=15)
        call = await _live_call(gateway)
        async with gateway.client() as client:
            path = f"/v1/calls/{call['id']}"
            refused = await client.post(f"{path}/unhold")
            assert refused.status_code == 409 and "does not hold" in refused.text, refused.text
            assert (await client.post("/v1/calls/c-nosuchcall/hold")).status_code == 404
            assert (await client.post(f"{path}/hold")).status_code == 204
            held = await phone.wait_event("media_state", within=10, where=lambda e: e.get("status") == 3)
            again = await client.post(f"{path}/hold")
            assert again.status_code == 409 and "on hold already" in again.text, again.text
            await stream.wait_for(lambda e: e.type == "call.held" and e.call_id == call["id"], within=10)
            assert (await gateway.api("GET", path))["state"] == "held"
            await asyncio.sleep(2.0)  # the length of the hold is the scenario's, not a wait for something to settle
            assert (await client.post(f"{path}/unhold")).status_code == 204
            resumed = await phone.wait_event(
                "media_state", within=10, where=lambda e: e.t > held.t and e.get("status") == 1
            )
            await stream.wait_for(lambda e: e.type == "call.resumed" and e.call_id == call["id"], within=10)
        assert await phone.wait_done(within=30) == 0

    # The phone was offered a=sendonly (it answered recvonly: status REMOTE_HOLD, decoding only), then sendrecv.
    assert held.get("dir") == 2 and resumed.get("dir") == 3
    offers = re.findall(r"a=(sendonly|sendrecv|recvonly|inactive)", phone.pjsip_log.read_text(errors="replace"))
    assert "sendonly" in offers, offers
    # It heard the hold audio while held, and only then.
    heard = read_wav(phone.recording)  # type: ignore[arg-type]
    media_at = next(e.t for e in phone.events if e.name == "media_active")
    music_heard = [b for b in bursts(heard) if abs(b.frequency_hz - HOLD_HZ) < 10]
    assert music_heard, bursts(heard)
    start, end = held.t - media_at, resumed.t - media_at
    assert all(start - 0.1 <= b.start_s and b.end_s <= end + 0.2 for b in music_heard), (music_heard, start, end)
    assert sum(b.duration_ms for b in music_heard) > 0.8 * (end - start) * 1000
