"""The OpenAI Realtime adapter end to end against the fake server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator

import orjson
import pytest
from websockets.asyncio.server import serve

from gateway.providers.base import (
    RESUME_NOTE,
    AgentProfile,
    AudioDone,
    AudioReceived,
    HistoryItem,
    ProviderDisconnected,
    ProviderErrored,
    ProviderNoticed,
    RealtimeSession,
    ResponseDone,
    ResponseStarted,
    SessionStarted,
    SpeechStarted,
    SpeechStopped,
    ToolCallRequested,
    ToolSpec,
    TranscriptReceived,
    TurnDetection,
)
from gateway.providers.errors import ProviderClosedError, ProviderConnectError
from gateway.providers.fake_server import FakeOptions, FakeRealtimeServer
from gateway.providers.openai import OpenAIConfig, OpenAIRealtimeModel, OpenAISession, build_url
from tests.gateway.providers.helpers import FRAME_BYTES, EventReader, noise_frames, silent_frames

pytestmark = pytest.mark.timeout(30)

PROFILE = AgentProfile(
    provider="openai",
    voice="marin",
    instructions="Be brief.",
    tools=(ToolSpec(name="get_weather", description="Weather by city", parameters={"type": "object"}),),
    turn_detection=TurnDetection(silence_duration_ms=200, prefix_padding_ms=300),
)


@pytest.fixture
async def fake() -> AsyncIterator[FakeRealtimeServer]:
    async with FakeRealtimeServer(FakeOptions()) as server:
        yield server


def model_for(url: str) -> OpenAIRealtimeModel:
    return OpenAIRealtimeModel(OpenAIConfig(url=url, api_key="test-key", setup_timeout_s=5.0))


async def open_session(url: str, **kwargs: object) -> tuple[OpenAISession, EventReader]:
    session = await model_for(url).connect(PROFILE, **kwargs)  # type: ignore[arg-type]
    return session, EventReader(session.events())


async def send_turn(session: OpenAISession, *, seed: int) -> bytes:
    """10 silent frames, 25 loud frames, 15 silent frames: one VAD turn. Returns what was sent."""
    frames = silent_frames(10) + noise_frames(25, seed=seed) + silent_frames(15)
    for frame in frames:
        await session.send_audio(frame)
    return b"".join(frames)


async def test_connect_configures_the_session(fake: FakeRealtimeServer) -> None:
    session, events = await open_session(fake.url)
    try:
        assert isinstance(session, RealtimeSession)
        started = await events.next()
        assert started == SessionStarted(session_id="sess_fake_1", resumed=False)
        record = fake.record(1)
        assert record.path == "/v1/realtime?model=gpt-realtime"
        assert record.headers["authorization"] == "Bearer test-key"
        assert "openai-beta" not in record.headers
        (update,) = record.events
        assert update["type"] == "session.update"
        session_config = update["session"]
        assert session_config["type"] == "realtime"
        assert session_config["instructions"] == "Be brief."
        assert session_config["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
        assert session_config["audio"]["output"] == {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "marin"}
        detection = session_config["audio"]["input"]["turn_detection"]
        assert detection["type"] == "server_vad"
        assert detection["silence_duration_ms"] == 200
        assert detection["create_response"] is True
        assert detection["interrupt_response"] is False
        assert session_config["audio"]["input"]["transcription"] == {"model": "gpt-4o-mini-transcribe"}
        assert session_config["tools"][0]["name"] == "get_weather"
    finally:
        await session.aclose()


async def test_echoed_audio_is_byte_identical_to_the_turn(fake: FakeRealtimeServer) -> None:
    session, events = await open_session(fake.url)
    try:
        sent = await send_turn(session, seed=1)
        speech = await events.until(SpeechStarted)
        assert speech.audio_start_ms == 200
        stopped = await events.until(SpeechStopped)
        # 25 loud frames from 200 ms end at 700 ms; 200 ms of quiet later the turn ends.
        assert stopped.audio_end_ms == 900
        started = await events.until(ResponseStarted)
        done = await events.until(ResponseDone)
        assert done.status == "completed"
        assert done.response_id == started.response_id
        audio = events.of(AudioReceived)
        assert audio and {a.response_id for a in audio} == {started.response_id}
        # The turn is everything from (start - prefix padding, here clamped to 0) to audio_end_ms.
        assert b"".join(a.pcm for a in audio) == sent[: 900 * 48]
        assert events.of(AudioDone)[0].item_id == audio[0].item_id
        finals = [t for t in events.of(TranscriptReceived) if t.final]
        assert {t.role for t in finals} == {"user", "assistant"}
        assert fake.record(1).audio == bytearray(sent)
    finally:
        await session.aclose()


async def test_the_turn_keeps_exactly_the_prefix_padding_whatever_the_append_size(fake: FakeRealtimeServer) -> None:
    session, events = await open_session(fake.url)
    try:
        frames = silent_frames(22) + noise_frames(25, seed=4) + silent_frames(13)
        sent = b"".join(frames)
        for k in range(0, len(frames), 5):  # 100 ms appends; speech starts in the middle of one (at 440 ms)
            await session.send_audio(b"".join(frames[k : k + 5]))
        assert (await events.until(SpeechStarted)).audio_start_ms == 440
        assert (await events.until(SpeechStopped)).audio_end_ms == 1140
        await events.until(ResponseDone)
        # 300 ms of prefix padding before the start, not whatever the append that carried the start brought along
        assert b"".join(a.pcm for a in events.of(AudioReceived)) == sent[(440 - 300) * 48 : 1140 * 48]
    finally:
        await session.aclose()


async def test_barge_in_cancels_and_truncates_at_the_sent_milliseconds() -> None:
    options = FakeOptions(mode="tone", reply_ms=3000, paced=True, chunk_ms=20)
    async with FakeRealtimeServer(options) as fake:
        session, events = await open_session(fake.url)
        try:
            await session.create_response()
            first = await events.until(AudioReceived)
            for _ in range(4):
                await events.until(AudioReceived)
            # The caller heard 100 ms of the item when they spoke up.
            await session.cancel_response()
            await session.truncate_item(first.item_id, content_index=first.content_index, audio_end_ms=100)
            done = await events.until(ResponseDone)
            assert done.status == "cancelled"
            assert done.status_details == "client_cancelled"
            await fake.wait_until(lambda: bool(fake.record(1).truncations))
            assert fake.record(1).truncations == [{"item_id": first.item_id, "audio_end_ms": 100}]
            assert fake.record(1).cancels == 1
            # Races the gateway must tolerate come back as notices, not errors.
            await session.cancel_response()
            notice = await events.until(ProviderNoticed)
            assert notice.code == "response_cancel_not_active"
            await session.truncate_item(first.item_id, content_index=0, audio_end_ms=60_000)
            notice = await events.until(ProviderNoticed)
            assert "already shorter than" in notice.message
            await session.create_response()
            await events.until(ResponseStarted)
            await session.create_response()
            notice = await events.until(ProviderNoticed)
            assert notice.code == "conversation_already_has_active_response"
            assert not events.of(ProviderErrored)
        finally:
            await session.aclose()


async def test_delete_item_reaches_the_server(fake: FakeRealtimeServer) -> None:
    session, events = await open_session(fake.url)
    try:
        await session.create_response()
        audio = await events.until(AudioReceived)
        await events.until(ResponseDone)
        await session.delete_item(audio.item_id)
        await fake.wait_until(lambda: fake.record(1).deletions == [audio.item_id])
    finally:
        await session.aclose()


async def test_tool_call_round_trip() -> None:
    options = FakeOptions(tool_name="get_weather", tool_arguments='{"city":"Oslo"}')
    async with FakeRealtimeServer(options) as fake:
        session, events = await open_session(fake.url)
        try:
            await send_turn(session, seed=2)
            call = await events.until(ToolCallRequested)
            assert (call.name, call.arguments) == ("get_weather", '{"city":"Oslo"}')
            assert (await events.until(ResponseDone)).status == "completed"
            await session.send_tool_result(call.call_id, '{"temp_c":5}', name=call.name)
            await session.create_response()
            await events.until(AudioReceived)
            transcript = await events.until(TranscriptReceived)
            while transcript.role != "assistant":
                transcript = await events.until(TranscriptReceived)
            assert transcript.text == 'tool said {"temp_c":5}'
            assert fake.record(1).tool_outputs == [{"call_id": call.call_id, "output": '{"temp_c":5}'}]
        finally:
            await session.aclose()


@pytest.mark.parametrize("nowait", [False, True], ids=["awaited", "nowait"])
async def test_dropped_connection_is_retryable(fake: FakeRealtimeServer, nowait: bool) -> None:
    session, events = await open_session(fake.url + "?drop_after_frames=5")
    try:
        for frame in noise_frames(6, seed=3):
            if nowait:
                session.send_audio_nowait(frame)
            else:
                await session.send_audio(frame)
        gone = await events.until(ProviderDisconnected)
        assert gone.retryable is True
        with pytest.raises(ProviderClosedError):
            if nowait:
                session.send_audio_nowait(bytes(FRAME_BYTES))
            else:
                await session.send_audio(bytes(FRAME_BYTES))
    finally:
        await session.aclose()


async def test_nowait_audio_arrives_in_order_with_awaited_sends(fake: FakeRealtimeServer) -> None:
    session, _events = await open_session(fake.url)
    try:
        frames = noise_frames(12, seed=5)
        for i, frame in enumerate(frames):
            if i % 3 == 2:
                await session.send_audio(frame)
            else:
                assert session.send_audio_nowait(frame) is True
        await fake.wait_until(lambda: len(fake.record(1).audio) == len(frames) * FRAME_BYTES)
        assert fake.record(1).audio == bytearray(b"".join(frames))
    finally:
        await session.aclose()


async def test_nowait_declines_while_an_awaited_send_is_under_way_or_waiting(fake: FakeRealtimeServer) -> None:
    session, _events = await open_session(fake.url)
    link = session._link
    try:
        first, queued, last = noise_frames(3, seed=6)
        async with link._send_lock:  # an awaited send under way (what it holds while the transport drains)
            waiting = asyncio.create_task(session.send_audio(queued))
            await asyncio.sleep(0)  # one turn of the loop: the task runs up to the lock, and waits for it there
            assert link._sends == 1 and not waiting.done()
            assert session.send_audio_nowait(first) is False  # it would jump ahead of the waiting send
        await waiting
        assert session.send_audio_nowait(last) is True
        await fake.wait_until(lambda: len(fake.record(1).audio) == 2 * FRAME_BYTES)
        assert fake.record(1).audio == bytearray(queued + last)
    finally:
        await session.aclose()


async def test_server_side_close_codes_decide_retry(fake: FakeRealtimeServer) -> None:
    session, events = await open_session(fake.url)
    try:
        await events.until(SessionStarted)
        await fake.inject(
            1, {"type": "error", "error": {"type": "invalid_request_error", "code": "bad", "message": "x"}}
        )
        errored = await events.until(ProviderErrored)
        assert (errored.code, errored.fatal) == ("bad", False)
        await fake._live[1].ws.close(1008, "policy")
        gone = await events.until(ProviderDisconnected)
        assert gone.retryable is False
        assert "1008" in gone.reason
    finally:
        await session.aclose()


async def test_session_expired_is_fatal_then_retryable() -> None:
    async with FakeRealtimeServer(FakeOptions(expire_after_s=0.2)) as fake:
        session, events = await open_session(fake.url)
        try:
            errored = await events.until(ProviderErrored)
            assert (errored.code, errored.fatal) == ("session_expired", True)
            gone = await events.until(ProviderDisconnected)
            assert gone == ProviderDisconnected(reason="session_expired", retryable=True)
        finally:
            await session.aclose()


async def test_second_session_created_means_state_lost(fake: FakeRealtimeServer) -> None:
    session, events = await open_session(fake.url)
    try:
        await events.until(SessionStarted)
        await fake.inject(1, {"type": "session.created", "session": {"type": "realtime"}})
        errored = await events.until(ProviderErrored)
        assert (errored.code, errored.fatal) == ("session_recreated", True)
        gone = await events.until(ProviderDisconnected)
        assert gone.retryable is True
    finally:
        await session.aclose()


async def test_injected_error_is_not_fatal() -> None:
    options = FakeOptions(error_after_frames=3, error_code="rate_limit_exceeded", error_message="slow down")
    async with FakeRealtimeServer(options) as fake:
        session, events = await open_session(fake.url)
        try:
            for frame in silent_frames(5):
                await session.send_audio(frame)
            errored = await events.until(ProviderErrored)
            assert errored == ProviderErrored(code="rate_limit_exceeded", message="slow down", fatal=False)
            await session.create_response()
            assert (await events.until(ResponseDone)).status == "completed"
        finally:
            await session.aclose()


async def test_history_is_replayed_with_the_resume_note(fake: FakeRealtimeServer) -> None:
    history = (
        HistoryItem(kind="message", role="user", text="What's the weather?"),
        HistoryItem(kind="function_call", call_id="c1", name="get_weather", arguments='{"city":"Oslo"}'),
        HistoryItem(kind="function_call_output", call_id="c1", output='{"temp_c":5}'),
        HistoryItem(kind="message", role="assistant", text="Five degrees."),
    )
    session, events = await open_session(fake.url, history=history)
    try:
        await events.until(SessionStarted)
        await fake.wait_until(lambda: len(fake.record(1).events) == 6)
        items = [e["item"] for e in fake.record(1).events[1:]]
        assert items[0] == {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "What's the weather?"}],
        }
        assert items[1] == {
            "type": "function_call",
            "call_id": "c1",
            "name": "get_weather",
            "arguments": '{"city":"Oslo"}',
        }
        assert items[2] == {"type": "function_call_output", "call_id": "c1", "output": '{"temp_c":5}'}
        assert items[3]["content"] == [{"type": "output_text", "text": "Five degrees."}]
        assert items[4] == {
            "type": "message",
            "role": "system",
            "content": [{"type": "input_text", "text": RESUME_NOTE}],
        }
    finally:
        await session.aclose()


async def test_g711_passthrough_echoes_mulaw(fake: FakeRealtimeServer) -> None:
    profile = AgentProfile(audio_format="pcmu", turn_detection=TurnDetection(silence_duration_ms=200))
    session = await model_for(fake.url).connect(profile)
    events = EventReader(session.events())
    try:
        quiet = bytes([0xFF]) * 160  # μ-law zero
        loud = bytes([0x00, 0x80] * 80)  # μ-law full scale, both signs
        sent = quiet * 10 + loud * 25 + quiet * 15
        for i in range(50):
            await session.send_audio(sent[i * 160 : (i + 1) * 160])
        await events.until(ResponseDone)
        assert b"".join(a.pcm for a in events.of(AudioReceived)) == sent[: 900 * 8]
        update = fake.record(1).events[0]["session"]
        assert update["audio"]["input"]["format"] == {"type": "audio/pcmu"}
    finally:
        await session.aclose()


async def test_aclose_ends_events_and_is_idempotent(fake: FakeRealtimeServer) -> None:
    session, events = await open_session(fake.url)
    await events.until(SessionStarted)
    before = {t for t in asyncio.all_tasks() if not t.done()}
    await session.aclose()
    await session.aclose()
    gone = await events.until(ProviderDisconnected)
    assert gone == ProviderDisconnected(reason="closed by client", retryable=False)
    with pytest.raises(ProviderClosedError):
        await session.send_text("hello")
    leftover = {t for t in before if not t.done() and t.get_name().startswith("openai-")}
    assert leftover == set()
    await fake.wait_until(lambda: fake.record(1).ended_at is not None)


async def test_connect_to_a_closed_port_is_retryable() -> None:
    async with FakeRealtimeServer() as fake:
        url = fake.url
    with pytest.raises(ProviderConnectError) as caught:
        await model_for(url).connect(PROFILE)
    assert caught.value.retryable is True


async def test_rejected_handshake_is_not_retryable() -> None:
    def reject(connection, request):  # type: ignore[no-untyped-def]
        return connection.respond(401, "bad key\n")

    async def never(ws):  # type: ignore[no-untyped-def]
        raise AssertionError("handshake must not complete")

    async with serve(never, "127.0.0.1", 0, process_request=reject) as server:
        port = server.sockets[0].getsockname()[1]
        with pytest.raises(ProviderConnectError) as caught:
            await model_for(f"ws://127.0.0.1:{port}/v1/realtime").connect(PROFILE)
    assert caught.value.retryable is False
    assert "401" in str(caught.value)


async def test_setup_error_aborts_connect() -> None:
    async def refuse(ws):  # type: ignore[no-untyped-def]
        await ws.send('{"type":"session.created","event_id":"e1","session":{"type":"realtime"}}')
        await ws.recv()
        error = {"type": "invalid_request_error", "code": "invalid_value", "message": "bad voice"}
        await ws.send(orjson.dumps({"type": "error", "event_id": "e2", "error": error}).decode())
        await ws.wait_closed()

    async with serve(refuse, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        with pytest.raises(ProviderConnectError) as caught:
            await model_for(f"ws://127.0.0.1:{port}/v1/realtime").connect(PROFILE)
    assert caught.value.retryable is False
    assert "bad voice" in str(caught.value)


def test_build_url_keeps_existing_query() -> None:
    url = build_url("wss://r.openai.azure.com/openai/v1/realtime?api-version=2025-08-28&model=old", "my-deploy")
    assert url == "wss://r.openai.azure.com/openai/v1/realtime?api-version=2025-08-28&model=my-deploy"


def test_azure_style_auth_header() -> None:
    model = OpenAIRealtimeModel(OpenAIConfig(api_key="k", auth_header="api-key", auth_scheme=""))
    assert model.headers() == {"api-key": "k"}
    assert OpenAIRealtimeModel(OpenAIConfig()).headers() == {}


async def test_records_prove_frame_order_across_a_reconnect(fake: FakeRealtimeServer) -> None:
    frames = noise_frames(10, seed=11)
    first, events = await open_session(fake.url + "?drop_after_frames=5")
    try:
        for frame in frames[:5]:
            await first.send_audio(frame)
        assert (await events.until(ProviderDisconnected)).retryable is True
    finally:
        await first.aclose()
    second, _ = await open_session(fake.url, history=(HistoryItem(kind="message", role="user", text="hi"),))
    try:
        for frame in frames[5:]:
            await second.send_audio(frame)
        await fake.wait_until(lambda: 2 in fake.records and fake.record(2).audio_bytes == 5 * FRAME_BYTES)
        assert bytes(fake.record(1).audio + fake.record(2).audio) == b"".join(frames)
    finally:
        await second.aclose()


async def test_a_delta_that_is_not_base64_is_reported_and_the_next_one_plays(fake: FakeRealtimeServer) -> None:
    """Provider audio is decoded strictly: a corrupt delta is a non-fatal protocol error, not noise to the caller."""
    session, events = await open_session(fake.url)
    try:
        await events.until(SessionStarted)
        at = {"response_id": "r1", "item_id": "i1", "output_index": 0, "content_index": 0}
        pcm = noise_frames(1, seed=9)[0]
        await fake.inject(1, {"type": "response.output_audio.delta", **at, "delta": "bm90IGF1ZGlv\n!!"})
        await fake.inject(
            1, {"type": "response.output_audio.delta", **at, "delta": base64.b64encode(pcm).decode("ascii")}
        )
        errored = await events.until(ProviderErrored)
        assert (errored.code, errored.fatal) == ("protocol_error", False)
        received = await events.until(AudioReceived)
        assert (received.item_id, received.pcm) == ("i1", pcm)
    finally:
        await session.aclose()


async def test_a_truncated_item_reports_only_the_words_heard_as_its_transcript() -> None:
    # The server drops a truncated item's transcript; the adapter reports the estimated heard prefix instead, so
    # the call's transcript (and a resume) never holds words the caller did not hear.
    text = "one two three four five six seven eight nine ten"
    async with FakeRealtimeServer(FakeOptions(mode="tone", reply_ms=3000)) as fake:
        session, events = await open_session(fake.url)
        try:
            await session.create_response(instructions=text)
            full = await events.until(TranscriptReceived)
            while not full.final:
                full = await events.until(TranscriptReceived)
            assert full.text == text
            await session.truncate_item(full.item_id, content_index=0, audio_end_ms=1000)
            cut = await events.until(TranscriptReceived)
            # 3000 ms over 48 characters (+1 per word gap): "four" starts at 857 ms, "five" at 1163 ms.
            assert (cut.item_id, cut.text, cut.final) == (full.item_id, "one two three four", True)
        finally:
            await session.aclose()
