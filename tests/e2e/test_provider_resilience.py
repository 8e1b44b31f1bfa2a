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

import asyncio
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.session.toolrunner import INTERIM_OUTPUT
from telcodecs.g711 import ulaw_decode
from tests.e2e.provider_harness import (
    FakeProvider,
    WebhookRequest,
    WebhookServer,
    WebhookToolSpec,
    barge_in_lines,
    bursts,
    caller_wav,
    followed_windows,
    only_call,
    resume_lines,
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


# What the phone heard against what the gateway counted as sent: one 20 ms frame (the phone's own jitter
# buffer may conceal one late packet, which plays on as tone), plus the 5 ms envelope window of ``bursts``.
HEARD_TOLERANCE_MS = 25


async def test_provider_drop_mid_call_loses_no_caller_frame(peer_procs: ProcessGroup, tmp_path: Path) -> None:
    _require_peers()
    # The first connection vanishes (no close frame) after 6.6 s of caller audio, in the middle of turn B;
    # the reconnect gets a healthy session, after a slow (0.4 s) handshake during which caller frames are held.
    fake = await start_fake_provider(
        peer_procs,
        *("--mode", "tone", "--reply-ms", "400", "--session-delay-s", "0.4"),
        *("--drop-after-frames", "330", "--fault-connections", "1"),
    )
    gateway = await start_gateway_on_fake(peer_procs, tmp_path, fake)
    source = caller_wav(tmp_path / "caller.wav", [TURN_A, 1.0, TURN_B, 1.0, TURN_C, 1.5])
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
    ((cause, attempt, held),) = resume_lines(gateway)
    assert (cause, attempt) == ("dropped", 1)
    assert held >= 15, f"only {held} caller frames were held over a reconnect that took more than 0.4 s"
    assert sorted(records) == [1, 2]
    first, second = records[1], records[2]
    assert first["close_code"] in (None, 1006)  # dropped without a close frame

    # Every frame the session handed the provider arrived once: connection 1 + connection 2 == frames sent.
    audio = [await fake.audio(1), await fake.audio(2)]
    # Dropped after the append that reached 330 frames: more when that append carried a backlog the session
    # wrote at once (after the gateway was descheduled for a moment).
    first_frames = first["audio_bytes"] // FRAME_BYTES
    assert first["audio_bytes"] % FRAME_BYTES == 0 and 330 <= first_frames <= 340
    assert len(audio[0]) + len(audio[1]) == counters["frames_to_provider"] * FRAME_BYTES
    assert 0 <= int(counters["frames_in"]) - int(counters["frames_to_provider"]) <= 5  # only the hang-up tail
    received = np.frombuffer(audio[0] + audio[1], dtype="<i2").astype(np.float64) / 32768.0

    # ... and in order with no gap or repeat: the concatenation is the phone's speech at one constant lag.
    sent = read_wav(phone.last_recording().encoded)
    reference = resample(sent.samples, sent.rate, 24_000)
    # A jitter-buffer slip on the caller's leg (a late packet concealed, a frame dropped) also shifts the audio;
    # the caller leg's playout counters say whether the network side or the reconnect moved it.
    playout = {key: call["stats"][key] for key in ("rtp_lost", "late", "concealed", "underruns", "discarded")}
    caller_leg_slipped = playout["concealed"] + playout["discarded"]  # frames its jitter buffer moved
    # One lag for the whole call, unless the caller's leg says it slipped: then windows may follow its slips, as
    # far as the frames it counted.
    reach = min(caller_leg_slipped, 10)
    slip_s = 0.02 * reach + 0.005 if reach else 0.0
    correlation, lag = align_and_correlate(reference, received, 24_000, max_slip_seconds=slip_s)
    assert correlation >= 0.9, (
        f"caller audio at the provider correlates {correlation:.3f} with what was sent; caller playout {playout}"
    )
    matches = window_matches(reference, received, 24_000, lag=lag)
    assert len(matches) >= 15
    drop_at_s = first_frames * 0.02 - lag / 24_000  # where connection 1 ended, on the phone's timeline
    assert any(m.start_s > drop_at_s + 0.5 for m in matches), "no speech after the drop to check"
    misplaced = [m for m in matches if m.correlation < 0.9]
    if misplaced and caller_leg_slipped:
        # The caller leg's own jitter buffer moved the audio (a late packet concealed, a frame discarded in a
        # pause: its counters say so), which is not the reconnect's doing. Follow its slips: they may move no
        # more frames, and spoil no more windows (the one each falls in), than the caller leg counted, and
        # neither may fall across the drop.
        followed = followed_windows(reference, received, 24_000, lag=lag, reach_frames=reach)
        slips = [(a, b) for a, b in itertools.pairwise(followed) if a.lag != b.lag]
        spoiled = [w for w in followed if w.correlation < 0.9]
        moved = sum(abs(b.lag - a.lag) for a, b in slips) // (FRAME_BYTES // 2)
        assert moved <= caller_leg_slipped and len(spoiled) <= caller_leg_slipped, (slips, spoiled, playout)
        across = [(a, b) for a, b in slips if a.start_s <= drop_at_s <= b.start_s + 0.4]
        across += [(w, w) for w in spoiled if w.start_s <= drop_at_s <= w.start_s + 0.4]
        assert not across, f"a frame lost or repeated across the reconnect: {across}; caller playout {playout}"
        misplaced = []
    assert not misplaced, (
        f"windows not at the global lag {lag} (a frame lost or repeated before them): {misplaced}; "
        f"caller playout {playout}"
    )
    # The measuring stick resolves one frame: this audio shifted by 20 ms correlates far worse.
    assert np.mean([m.slipped_correlation for m in matches if m.correlation >= 0.9]) < 0.6

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


async def test_barge_in_truncates_at_exactly_the_audio_sent(peer_procs: ProcessGroup, tmp_path: Path) -> None:
    _require_peers()
    # A 6 s reply streamed at twice real time: when the caller cuts in, the provider has delivered far more
    # than the caller has heard, so a truncate at the received (or wall-clock) position would be caught.
    fake = await start_fake_provider(
        peer_procs, "--mode", "tone", "--reply-ms", "6000", "--paced", "--pace", "2", "--chunk-ms", "100"
    )
    gateway = await start_gateway_on_fake(peer_procs, tmp_path, fake)
    source = caller_wav(tmp_path / "caller.wav", [TURN_C, 1.9, TURN_B, 1.0])
    phone = BaresipPhone(peer_procs, tmp_path, source_wav=source, codecs=("pcmu",))
    async with phone:
        await phone.dial(gateway.sip_uri)
        await phone.wait_established(within=15)
        await phone.wait_closed(within=30)
    counters = await session_counters(gateway)
    records = await _all_client_events(fake)
    assert sorted(records) == [1] and counters["resumes"] == 0
    detail = records[1]

    # The gateway owns barge-in: the server was told not to cancel on its own, and the gateway cancelled.
    update = detail["event_list"][0]
    assert update["type"] == "session.update"
    assert update["session"]["audio"]["input"]["turn_detection"]["interrupt_response"] is False
    (cut,) = barge_in_lines(gateway)
    assert (cut.trigger, cut.cancelled) == ("speech_started", True)
    ((item_id, (sent_ms, received_ms)),) = cut.items.items()
    assert received_ms > sent_ms + 500, "the provider was not ahead of the caller: the test proves nothing"

    kinds = _types(detail)
    cancel_at = kinds.index("response.cancel")
    truncate_at = kinds.index("conversation.item.truncate")
    assert cancel_at < truncate_at and kinds.count("response.cancel") == 1
    truncate = detail["event_list"][truncate_at]
    assert truncate == {
        "type": "conversation.item.truncate",
        "item_id": item_id,
        "content_index": 0,
        "audio_end_ms": sent_ms,
    }
    assert detail["truncations"] == [{"item_id": item_id, "audio_end_ms": sent_ms}]  # accepted by the fake
    cancelled = [e for e in _timeline(detail, "out", "response.done") if e["status"] == "cancelled"]
    assert len(cancelled) == 1 and cancelled[0]["response_id"] == cut.response_id

    # Never past what the provider had sent when the truncate arrived (100 ms per delta).
    truncate_seen = next(e["t"] for e in _timeline(detail, "in", "conversation.item.truncate"))
    deltas = [e for e in _timeline(detail, "out", "response.output_audio.delta") if e["item_id"] == item_id]
    provider_sent_ms = 100 * sum(1 for e in deltas if e["t"] <= truncate_seen)
    assert sent_ms < provider_sent_ms

    # Independently: the phone heard audio_end_ms of that reply before it stopped (within a frame).
    heard = read_wav(phone.last_recording().decoded)
    first_reply = bursts(heard)[0]
    assert abs(first_reply.frequency_hz - TONE_HZ) < 10
    assert abs(first_reply.duration_ms - sent_ms) <= HEARD_TOLERANCE_MS, (first_reply, sent_ms)


@pytest.mark.parametrize("failure", ["http_500", "timeout"])
async def test_a_failing_webhook_tool_does_not_end_the_call(
    peer_procs: ProcessGroup, tmp_path: Path, failure: str
) -> None:
    _require_peers()

    async def answer(request: WebhookRequest) -> tuple[int, dict[str, Any]]:
        if failure == "timeout":
            await asyncio.Event().wait()  # never answers; the tool's 1 s timeout gives up first
        return 500, {"detail": "order database is down"}

    async with WebhookServer(answer) as hook:
        fake = await start_fake_provider(
            peer_procs,
            *("--mode", "tone", "--reply-ms", "400"),
            *("--tool-name", "lookup_order", "--tool-arguments", '{"order": "4567"}'),
        )
        tool = WebhookToolSpec(name="lookup_order", url=hook.url, timeout_s=1.0)
        gateway = await start_gateway_on_fake(peer_procs, tmp_path, fake, tools=(tool,))
        source = caller_wav(tmp_path / "caller.wav", [TURN_C, 2.0])
        phone = BaresipPhone(peer_procs, tmp_path, source_wav=source, codecs=("pcmu",))
        async with phone:
            await phone.dial(gateway.sip_uri)
            await phone.wait_established(within=15)
            (request,) = await hook.wait_requests(1, within=15)
            await phone.wait_closed(within=30)
    counters = await session_counters(gateway)
    call = await only_call(gateway)
    records = await _all_client_events(fake)
    assert sorted(records) == [1]
    detail = records[1]

    # The fake's scripted call reached the webhook once, with the provider's call id for deduplication.
    calls = [e for e in _timeline(detail, "out", "response.function_call_arguments.done")]
    assert len(calls) == 1
    call_id = calls[0]["call_id"]
    assert request.body["tool_call_id"] == call_id and request.headers["idempotency-key"] == call_id
    assert request.body["arguments"] == {"order": "4567"}

    # The failure became an error output, then the gateway asked for a reply.
    expected = "lookup_order answered HTTP 500" if failure == "http_500" else "lookup_order timed out after 1 s"
    assert detail["tool_outputs"] == [{"call_id": call_id, "output": json.dumps({"error": expected})}]
    kinds = _types(detail)
    output_at = next(
        i
        for i, e in enumerate(detail["event_list"])
        if e["type"] == "conversation.item.create" and e["item"]["type"] == "function_call_output"
    )
    assert "response.create" in kinds[output_at + 1 :]

    # The call went on: the agent's reply after the failure was heard, the caller hung up, no resume.
    replies = [e for e in _timeline(detail, "out", "response.done") if e["status"] == "completed"]
    assert len(replies) == 2  # the function call, then the spoken reply to its error output
    heard = bursts(read_wav(phone.last_recording().decoded))
    assert len(heard) == 1 and abs(heard[0].frequency_hz - TONE_HZ) < 10 and abs(heard[0].duration_ms - 400) <= 25
    assert call["end_reason"] == "caller_hangup"
    assert call["stats"]["tool_calls"] == 1
    assert (counters["tool_calls"], counters["tool_errors"], counters["resumes"]) == (1, 1, 0)


async def test_a_promoted_tool_result_is_spoken_after_the_caller_stops(
    peer_procs: ProcessGroup, tmp_path: Path
) -> None:
    _require_peers()
    release = asyncio.Event()

    async def answer(request: WebhookRequest) -> tuple[int, dict[str, Any]]:
        await release.wait()  # held until the caller is in the middle of the next turn
        return 200, {"status": "shipped", "eta": "tomorrow"}

    async with WebhookServer(answer) as hook:
        fake = await start_fake_provider(
            peer_procs,
            *("--mode", "tone", "--reply-ms", "400"),
            *("--tool-name", "lookup_order", "--tool-arguments", '{"order": "4567"}'),
        )
        tool = WebhookToolSpec(name="lookup_order", url=hook.url, timeout_s=20.0)
        gateway = await start_gateway_on_fake(
            peer_procs, tmp_path, fake, tools=(tool,), env={"GATEWAY_TOOL_GRACE_S": "0.5"}
        )
        source = caller_wav(tmp_path / "caller.wav", [TURN_C, 1.0, TURN_B, 3.5])
        phone = BaresipPhone(peer_procs, tmp_path, source_wav=source, codecs=("pcmu",))
        async with phone:
            await phone.dial(gateway.sip_uri)
            await phone.wait_established(within=15)
            await hook.wait_requests(1, within=15)
            # The tool is slower than the grace period: the provider gets the interim output first.
            await fake.wait_for_record(1, lambda d: bool(d["tool_outputs"]), within=5, what="interim tool output")
            # Let the tool finish while the caller is talking (the fake's VAD heard turn B start).
            await fake.wait_for_record(
                1,
                lambda d: len(_timeline(d, "out", "input_audio_buffer.speech_started")) >= 2,
                within=10,
                what="the caller's second turn",
            )
            release.set()
            (request,) = await hook.wait_requests(1, within=5)
            await phone.wait_closed(within=30)
    counters = await session_counters(gateway)
    call = await only_call(gateway)
    records = await _all_client_events(fake)
    assert sorted(records) == [1]
    detail = records[1]

    call_id = _timeline(detail, "out", "response.function_call_arguments.done")[0]["call_id"]
    assert detail["tool_outputs"] == [{"call_id": call_id, "output": INTERIM_OUTPUT}]
    assert json.loads(INTERIM_OUTPUT)["status"] == "pending"

    # The webhook answered while the caller was speaking (between the fake's speech_started and _stopped).
    started = _timeline(detail, "out", "input_audio_buffer.speech_started")
    stopped = _timeline(detail, "out", "input_audio_buffer.speech_stopped")
    assert len(started) >= 2 and len(stopped) >= 2
    assert request.answered_at is not None and started[1]["t"] < request.answered_at < stopped[1]["t"]

    # The result arrived as a text item plus a response request, only after the caller stopped talking.
    results = [
        entry
        for entry in _timeline(detail, "in", "conversation.item.create")
        if "Result of the earlier lookup_order request" in json.dumps(detail["event_list"][entry["index"]])
    ]
    assert len(results) == 1, "the background result was not delivered exactly once"
    result = results[0]
    item = detail["event_list"][result["index"]]["item"]
    assert item["type"] == "message" and item["role"] == "system"
    assert call_id in item["content"][0]["text"] and '"shipped"' in item["content"][0]["text"]
    assert result["t"] > stopped[1]["t"], "the result was delivered while the caller was still talking"
    later = detail["timeline"][detail["timeline"].index(result) :]
    assert any(e["dir"] == "in" and e["type"] == "response.create" for e in later)
    assert any(e["dir"] == "out" and e["type"] == "response.done" and e["status"] == "completed" for e in later)

    assert call["end_reason"] == "caller_hangup"
    assert (counters["tool_calls"], counters["tools_promoted"], counters["tool_errors"]) == (1, 1, 0)


async def test_a_g711_profile_talks_g711_to_the_provider(peer_procs: ProcessGroup, tmp_path: Path) -> None:
    _require_peers()
    # audio_format = "pcmu": the provider is told audio/pcmu and must get (and send) 8 kHz mu-law, while the
    # session keeps its 24 kHz frames; barge-in milliseconds stay in the provider's time base.
    fake = await start_fake_provider(peer_procs, "--mode", "tone", "--reply-ms", "2000", "--paced")
    gateway = await start_gateway_on_fake(peer_procs, tmp_path, fake, audio_format="pcmu")
    source = caller_wav(tmp_path / "caller.wav", [TURN_C, 1.4, TURN_C, 1.0])
    phone = BaresipPhone(peer_procs, tmp_path, source_wav=source, codecs=("pcmu",))
    async with phone:
        await phone.dial(gateway.sip_uri)
        await phone.wait_established(within=15)
        await phone.wait_closed(within=30)
    counters = await session_counters(gateway)
    records = await _all_client_events(fake)
    assert sorted(records) == [1]
    detail = records[1]
    update = detail["event_list"][0]["session"]["audio"]
    assert update["input"]["format"] == update["output"]["format"] == {"type": "audio/pcmu"}

    # The caller's speech arrived as mu-law at 8 kHz: 160 bytes per frame, and it is the phone's speech.
    at_provider = await fake.audio(1)
    assert len(at_provider) == counters["frames_to_provider"] * 160
    decoded = ulaw_decode(at_provider).astype(np.float64) / 32768.0
    sent = read_wav(phone.last_recording().encoded)
    # Content and format here (the length above counts the frames): windows follow the caller leg's jitter-buffer
    # slips, which a phone descheduled for a moment makes.
    correlation, _ = align_and_correlate(sent.samples, decoded, 8000, max_slip_seconds=0.25)
    assert correlation >= 0.9, f"mu-law at the provider correlates {correlation:.3f} with the phone's speech"

    # The agent's mu-law tone reached the phone as a 440 Hz tone, cut where the caller spoke again, and the
    # truncate names the milliseconds the phone heard.
    (cut,) = barge_in_lines(gateway)
    ((item_id, (sent_ms, _)),) = cut.items.items()
    assert detail["truncations"] == [{"item_id": item_id, "audio_end_ms": sent_ms}]
    first_reply = bursts(read_wav(phone.last_recording().decoded))[0]
    assert abs(first_reply.frequency_hz - TONE_HZ) < 10
    assert abs(first_reply.duration_ms - sent_ms) <= HEARD_TOLERANCE_MS, (first_reply, sent_ms)
