"""The session core against a misbehaving realtime provider, end to end: a baresip phone calls ``gateway run``
whose openai provider is ``gateway fake-provider`` (both real subprocesses, loopback only).

- a provider drop mid-call: the call resumes on a new connection and the provider receives every caller frame
  exactly once, in order, across the gap;
- barge-in: the agent's item is truncated at exactly the audio the caller was sent (measured in the phone's
  recording), never at what the provider delivered;
- a webhook tool that fails (HTTP 500, or a timeout) becomes an error output and the call goes on;
- a slow webhook tool is promoted to the background and its result is delivered only after the caller stopped
  talking.

Every client event the gateway sent in these calls is validated against the openai SDK's models.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.e2e.provider_harness import (
    FakeProvider,
    bursts,
    caller_wav,
    only_call,
    session_counters,
    start_fake_provider,
    start_gateway_on_fake,
    window_matches,
)
from tests.gateway.providers.helpers import check_client_event
from tests.support.audio import align_and_correlate, read_wav, resample
from tests.support.baresip import BaresipPhone
from tests.support.fixtures import require_speech_tools
from tests.support.peers import require_binary
from tests.support.procs import ProcessGroup

pytestmark = [pytest.mark.peer, pytest.mark.timeout(90)]

TURN_A = "Hello, I would like to check my order status, please."  # 4.1 s, longest inner pause 0.26 s
TURN_B = "My order number is four five six seven."  # 3.1 s
TURN_C = "Wait, one more thing please."  # 2.4 s
TONE_HZ = 440.0  # the fake's tone replies
FRAME_BYTES = 960  # 20 ms of 24 kHz PCM16


def _require_peers() -> None:
    require_binary("baresip", package="baresip baresip-core")
    require_speech_tools()


async def _all_client_events(fake: FakeProvider) -> dict[int, dict[str, Any]]:
    records = {summary["id"]: await fake.record(summary["id"]) for summary in await fake.records()}
    for detail in records.values():
        for event in detail["event_list"]:
            check_client_event(event)
    return records


def _types(detail: dict[str, Any]) -> list[str]:
    return [event["type"] for event in detail["event_list"]]


def _timeline(detail: dict[str, Any], direction: str, kind: str) -> list[dict[str, Any]]:
    return [entry for entry in detail["timeline"] if entry["dir"] == direction and entry["type"] == kind]


async def test_provider_drop_mid_call_loses_no_caller_frame(peer_procs: ProcessGroup, tmp_path: Path) -> None:
    _require_peers()
    # The first connection vanishes (no close frame) after 6.5 s of caller audio, in the middle of turn B;
    # the reconnect gets a healthy session.
    fake = await start_fake_provider(
        peer_procs, "--mode", "tone", "--reply-ms", "400", "--drop-after-frames", "325", "--fault-connections", "1"
    )
    gateway = await start_gateway_on_fake(peer_procs, tmp_path, fake)
    source = caller_wav(tmp_path / "caller.wav", [TURN_A, 1.3, TURN_B, 1.3, TURN_C, 2.0])
    phone = BaresipPhone(peer_procs, tmp_path, source_wav=source, codecs=("pcmu",))
    async with phone:
        await phone.dial(gateway.sip_uri)
        await phone.wait_established(within=15)
        await phone.wait_closed(within=40)
    counters = await session_counters(gateway)
    call = await only_call(gateway)
    records = await _all_client_events(fake)

    # The call survived the drop: one resume, the caller hung up (the WAV ended), nothing was dropped.
    assert call["end_reason"] == "caller_hangup"
    assert call["stats"]["resumes"] == 1
    assert (counters["resumes"], counters["epoch"], counters["frames_dropped"]) == (1, 2, 0)
    assert counters["frames_held"] > 0, "no caller frame was held while reconnecting"
    assert sorted(records) == [1, 2]
    first, second = records[1], records[2]
    assert first["close_code"] in (None, 1006)  # dropped without a close frame

    # Every frame the session handed the provider arrived once: connection 1 + connection 2 == frames sent.
    audio = [await fake.audio(1), await fake.audio(2)]
    assert first["audio_bytes"] == 325 * FRAME_BYTES
    assert len(audio[0]) + len(audio[1]) == counters["frames_to_provider"] * FRAME_BYTES
    assert 0 <= int(counters["frames_in"]) - int(counters["frames_to_provider"]) <= 5  # only the hang-up tail
    received = np.frombuffer(audio[0] + audio[1], dtype="<i2").astype(np.float64) / 32768.0

    # ... and in order with no gap or repeat: the concatenation is the phone's speech at one constant lag.
    sent = read_wav(phone.last_recording().encoded)
    reference = resample(sent.samples, sent.rate, 24_000)
    correlation, lag = align_and_correlate(reference, received, 24_000, max_slip_seconds=0)
    assert correlation >= 0.9, f"caller audio at the provider correlates {correlation:.3f} with what was sent"
    matches = window_matches(reference, received, 24_000, lag=lag)
    assert len(matches) >= 15
    drop_at_s = 325 * 0.02 - lag / 24_000  # where connection 1 ended, on the phone's timeline
    assert any(m.start_s > drop_at_s + 0.5 for m in matches), "no speech after the drop to check"
    misplaced = [m for m in matches if m.correlation < 0.9]
    assert not misplaced, f"windows not at the global lag {lag} (a frame lost or repeated before them): {misplaced}"
    # The measuring stick resolves one frame: this audio shifted by 20 ms correlates far worse.
    assert np.mean([m.slipped_correlation for m in matches]) < 0.6

    # The new connection was configured and re-seeded with the conversation before any audio.
    kinds = _types(second)
    assert kinds[0] == "session.update"
    first_audio = kinds.index("input_audio_buffer.append")
    replayed = [e["item"] for e in second["event_list"][1:first_audio] if e["type"] == "conversation.item.create"]
    assert [(item["role"], item["content"][0]["type"]) for item in replayed][:2] == [
        ("user", "input_text"),
        ("assistant", "output_text"),
    ]
    assert replayed[0]["content"][0]["text"].endswith("ms of caller audio]")  # the fake's transcript of turn A
    assert replayed[1]["content"][0]["text"] == "tone reply"
    assert replayed[-1]["role"] == "system"  # "continue, do not greet again"

    # The caller kept hearing the agent after the resume: every reply of both connections is in the recording.
    completed = [
        [e for e in _timeline(detail, "out", "response.done") if e["status"] == "completed"]
        for detail in (first, second)
    ]
    assert len(completed[1]) >= 1, "the new connection never answered"
    heard = read_wav(phone.last_recording().decoded)
    replies = bursts(heard)
    assert len(replies) == len(completed[0]) + len(completed[1]), replies
    for reply in replies:
        assert abs(reply.frequency_hz - TONE_HZ) < 10 and abs(reply.duration_ms - 400) <= 25, reply
