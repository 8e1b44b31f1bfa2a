"""The Gemini Live adapter against a tiny BidiGenerateContent server on 127.0.0.1.

Client messages are checked against ``google.genai.types`` (extra="forbid" there, so unknown keys fail).
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import orjson
import pytest
from google.genai import types
from websockets.asyncio.server import ServerConnection, serve

from gateway.providers.base import (
    AgentProfile,
    AudioDone,
    AudioReceived,
    ConnectionExpiring,
    HistoryItem,
    ProviderDisconnected,
    ProviderErrored,
    RealtimeSession,
    ResponseDone,
    ResponseInterrupted,
    ResponseStarted,
    ResumeHandleUpdated,
    SessionStarted,
    ToolCallRequested,
    ToolCallsCancelled,
    ToolSpec,
    TranscriptReceived,
)
from gateway.providers.errors import ProviderConnectError
from gateway.providers.gemini import Downsampler24To16, GeminiConfig, GeminiLiveModel, GeminiSession
from tests.gateway.providers.helpers import EventReader

pytestmark = pytest.mark.timeout(30)

PROFILE = AgentProfile(
    provider="gemini",
    model="gemini-test",
    voice="Kore",
    instructions="Be brief.",
    tools=(ToolSpec(name="get_weather", description="Weather", parameters={"type": "object", "properties": {}}),),
)


class FakeGemini:
    """Answers ``setup`` with ``setupComplete`` (or a scripted close) and records every client message."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.headers: dict[str, str] = {}
        self.ws: ServerConnection | None = None
        self.reject_setup: tuple[int, str] | None = None
        self._arrived = asyncio.Condition()

    async def handle(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        self.headers = {k.lower(): v for k, v in ws.request.headers.raw_items()}
        self.ws = ws
        async for raw in ws:
            message = orjson.loads(raw)
            async with self._arrived:
                self.received.append(message)
                self._arrived.notify_all()
            if "setup" in message:
                if self.reject_setup:
                    await ws.close(*self.reject_setup)
                    return
                await ws.send(b'{"setupComplete": {}}')  # Gemini sends JSON in binary frames

    async def send(self, message: dict[str, Any]) -> None:
        assert self.ws is not None
        await self.ws.send(orjson.dumps(message))

    async def wait_for(self, key: str, *, count: int = 1) -> list[dict[str, Any]]:
        async with asyncio.timeout(5), self._arrived:
            await self._arrived.wait_for(lambda: len(self.of(key)) >= count)
        return self.of(key)

    def of(self, key: str) -> list[dict[str, Any]]:
        return [m[key] for m in self.received if key in m]


@pytest.fixture
async def gemini() -> AsyncIterator[tuple[FakeGemini, str]]:
    fake = FakeGemini()
    async with serve(fake.handle, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        yield fake, f"ws://127.0.0.1:{port}/ws/BidiGenerateContent"


async def open_session(url: str, **kwargs: Any) -> tuple[GeminiSession, EventReader]:
    model = GeminiLiveModel(GeminiConfig(url=url, api_key="g-key", setup_timeout_s=5))
    session = await model.connect(PROFILE, **kwargs)
    return session, EventReader(session.events())


def _audio(seed: int, samples: int = 2400) -> bytes:
    return np.random.default_rng(seed).integers(-9000, 9000, samples, dtype=np.int16).astype("<i2").tobytes()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def test_setup_message_and_schema(gemini: tuple[FakeGemini, str]) -> None:
    fake, url = gemini
    session, events = await open_session(url)
    try:
        assert isinstance(session, RealtimeSession)
        assert await events.next() == SessionStarted(session_id="gemini_1", resumed=False)
        assert fake.headers["x-goog-api-key"] == "g-key"
        (setup,) = fake.of("setup")
        assert setup["model"] == "models/gemini-test"
        assert setup["generationConfig"]["responseModalities"] == ["AUDIO"]
        voice = setup["generationConfig"]["speechConfig"]["voiceConfig"]["prebuiltVoiceConfig"]["voiceName"]
        assert voice == "Kore"
        assert setup["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
        assert setup["tools"][0]["functionDeclarations"][0]["name"] == "get_weather"
        assert setup["realtimeInputConfig"]["automaticActivityDetection"]["disabled"] is False
        assert setup["sessionResumption"] == {}
        assert setup["contextWindowCompression"] == {"slidingWindow": {}}
        assert setup["inputAudioTranscription"] == {} and setup["outputAudioTranscription"] == {}
        # Schema authority. This SDK version models realtimeInputConfig on the connect config, not on
        # LiveClientSetup, so it is checked on its own type.
        rest = {k: v for k, v in setup.items() if k != "realtimeInputConfig"}
        types.LiveClientSetup.model_validate_json(orjson.dumps(rest))
        types.RealtimeInputConfig.model_validate_json(orjson.dumps(setup["realtimeInputConfig"]))
    finally:
        await session.aclose()


@pytest.mark.parametrize("nowait", [False, True], ids=["awaited", "nowait"])
async def test_audio_in_is_resampled_to_16k(gemini: tuple[FakeGemini, str], nowait: bool) -> None:
    fake, url = gemini
    session, _ = await open_session(url)
    try:
        frames = [_audio(i, 480) for i in range(5)]
        for frame in frames:
            if nowait:
                assert session.send_audio_nowait(frame) is True
            else:
                await session.send_audio(frame)
        sent = await fake.wait_for("realtimeInput", count=5)
        for message in sent:
            types.LiveClientRealtimeInput.model_validate_json(orjson.dumps(message))
            assert message["audio"]["mimeType"] == "audio/pcm;rate=16000"
        received = b"".join(base64.b64decode(m["audio"]["data"]) for m in sent)
        expected = Downsampler24To16().process(np.frombuffer(b"".join(frames), dtype="<i2"))
        assert received == expected.astype("<i2").tobytes()
        assert len(received) == 5 * 320 * 2
    finally:
        await session.aclose()


async def test_model_turns_become_responses_with_stable_ids(gemini: tuple[FakeGemini, str]) -> None:
    fake, url = gemini
    session, events = await open_session(url)
    try:
        chunks = [_audio(1), _audio(2)]
        await fake.send({"serverContent": {"inputTranscription": {"text": "hello "}}})
        await fake.send({"serverContent": {"inputTranscription": {"text": "there"}}})
        for chunk in chunks:
            part = {"inlineData": {"mimeType": "audio/pcm;rate=24000", "data": _b64(chunk)}}
            await fake.send({"serverContent": {"modelTurn": {"parts": [part]}}})
        await fake.send({"serverContent": {"outputTranscription": {"text": "Hi!"}}})
        await fake.send({"serverContent": {"generationComplete": True}})
        await fake.send({"serverContent": {"turnComplete": True}})
        done = await events.until(ResponseDone)
        assert done.status == "completed"
        started = events.of(ResponseStarted)[0]
        audio = events.of(AudioReceived)
        assert [a.pcm for a in audio] == chunks
        assert {a.item_id for a in audio} == {a.response_id for a in audio} == {started.response_id}
        assert events.of(AudioDone) == [AudioDone(response_id=started.response_id, item_id=started.response_id)]
        finals = [(t.role, t.text) for t in events.of(TranscriptReceived) if t.final]
        assert finals == [("user", "hello there"), ("assistant", "Hi!")]
        part = {"inlineData": {"mimeType": "audio/pcm;rate=24000", "data": _b64(_audio(3))}}
        await fake.send({"serverContent": {"modelTurn": {"parts": [part]}}})
        assert (await events.until(ResponseStarted)).response_id != started.response_id
    finally:
        await session.aclose()


async def test_interrupted_ends_the_turn(gemini: tuple[FakeGemini, str]) -> None:
    fake, url = gemini
    session, events = await open_session(url)
    try:
        part = {"inlineData": {"mimeType": "audio/pcm;rate=24000", "data": _b64(_audio(4))}}
        await fake.send({"serverContent": {"modelTurn": {"parts": [part]}}})
        await fake.send({"serverContent": {"interrupted": True}})
        await events.until(ResponseInterrupted)
        done = await events.until(ResponseDone)
        assert (done.status, done.status_details) == ("cancelled", "interrupted")
        # Nothing to do for truncate/delete/cancel: Gemini cut its own context. No message goes out.
        before = len(fake.received)
        await session.cancel_response()
        await session.truncate_item(done.response_id, content_index=0, audio_end_ms=100)
        await session.delete_item(done.response_id)
        await session.send_text("marker")
        await fake.wait_for("clientContent")
        assert len(fake.received) == before + 1
    finally:
        await session.aclose()


async def test_tool_call_round_trip_and_cancellation(gemini: tuple[FakeGemini, str]) -> None:
    fake, url = gemini
    session, events = await open_session(url)
    try:
        call = {"id": "f1", "name": "get_weather", "args": {"city": "Oslo"}}
        await fake.send({"toolCall": {"functionCalls": [call]}})
        requested = await events.until(ToolCallRequested)
        assert requested == ToolCallRequested(call_id="f1", name="get_weather", arguments='{"city":"Oslo"}')
        await session.send_tool_result("f1", '{"temp_c":5}')
        await session.send_tool_result("f2", "plain text", name="other")
        responses = await fake.wait_for("toolResponse", count=2)
        for response in responses:
            types.LiveClientToolResponse.model_validate_json(orjson.dumps(response))
        assert responses[0] == {"functionResponses": [{"id": "f1", "name": "get_weather", "response": {"temp_c": 5}}]}
        assert responses[1]["functionResponses"][0]["response"] == {"output": "plain text"}
        await fake.send({"toolCallCancellation": {"ids": ["f1"]}})
        assert await events.until(ToolCallsCancelled) == ToolCallsCancelled(call_ids=("f1",))
    finally:
        await session.aclose()


async def test_resumption_update_and_go_away(gemini: tuple[FakeGemini, str]) -> None:
    fake, url = gemini
    session, events = await open_session(url)
    try:
        await fake.send({"sessionResumptionUpdate": {"newHandle": "h-1", "resumable": True}})
        await fake.send({"sessionResumptionUpdate": {"resumable": False}})
        assert await events.until(ResumeHandleUpdated) == ResumeHandleUpdated(handle="h-1", resumable=True)
        await fake.send({"goAway": {"timeLeft": "1.5s"}})
        assert await events.until(ConnectionExpiring) == ConnectionExpiring(time_left_s=1.5)
        assert fake.ws is not None
        await fake.ws.close(1000)
        assert await events.until(ProviderDisconnected) == ProviderDisconnected(reason="goAway", retryable=True)
        assert len(events.of(ResumeHandleUpdated)) == 1
    finally:
        await session.aclose()


async def test_resume_with_handle_skips_history(gemini: tuple[FakeGemini, str]) -> None:
    fake, url = gemini
    history = (HistoryItem(kind="message", role="user", text="hi"),)
    session, events = await open_session(url, history=history, resume_handle="h-1")
    try:
        assert await events.next() == SessionStarted(session_id="gemini_1", resumed=True)
        assert fake.of("setup")[0]["sessionResumption"] == {"handle": "h-1"}
        await session.send_text("after")
        (content,) = await fake.wait_for("clientContent")
        assert content["turns"][0]["parts"] == [{"text": "after"}]  # no history replay went before it
    finally:
        await session.aclose()


async def test_history_replay_without_handle(gemini: tuple[FakeGemini, str]) -> None:
    fake, url = gemini
    history = (
        HistoryItem(kind="message", role="user", text="Weather?"),
        HistoryItem(kind="function_call", call_id="c1", name="get_weather", arguments='{"city":"Oslo"}'),
        HistoryItem(kind="function_call_output", call_id="c1", output='{"temp_c":5}'),
        HistoryItem(kind="message", role="assistant", text="Five degrees."),
    )
    session, _ = await open_session(url, history=history)
    try:
        (content,) = await fake.wait_for("clientContent")
        types.LiveClientContent.model_validate_json(orjson.dumps(content))
        assert content["turnComplete"] is False
        assert [t["role"] for t in content["turns"]] == ["user", "model", "user", "model", "user"]
        assert content["turns"][1]["parts"][0]["functionCall"] == {
            "id": "c1",
            "name": "get_weather",
            "args": {"city": "Oslo"},
        }
        response = content["turns"][2]["parts"][0]["functionResponse"]
        assert response == {"id": "c1", "name": "get_weather", "response": {"temp_c": 5}}
        assert content["turns"][4]["parts"][0]["text"] == PROFILE.resume_note
        await session.create_response(instructions="Say hello.")
        contents = await fake.wait_for("clientContent", count=2)
        types.LiveClientContent.model_validate_json(orjson.dumps(contents[1]))
        assert contents[1] == {"turnComplete": True, "turns": [{"role": "user", "parts": [{"text": "Say hello."}]}]}
    finally:
        await session.aclose()


@pytest.mark.parametrize(("code", "retryable"), [(1008, False), (1007, False), (1011, True)])
async def test_setup_refused_by_close_code(gemini: tuple[FakeGemini, str], code: int, retryable: bool) -> None:
    fake, url = gemini
    fake.reject_setup = (code, "setup refused")
    with pytest.raises(ProviderConnectError) as caught:
        await open_session(url)
    assert caught.value.retryable is retryable
    assert "setup refused" in str(caught.value)


async def test_g711_profiles_are_refused() -> None:
    with pytest.raises(ProviderConnectError):
        await GeminiLiveModel(GeminiConfig(url="ws://127.0.0.1:9")).connect(AgentProfile(audio_format="pcmu"))


async def test_audio_that_is_not_base64_is_reported_and_the_turn_goes_on(gemini: tuple[FakeGemini, str]) -> None:
    """A corrupt inlineData part is a non-fatal protocol error; the next good part still plays."""
    fake, url = gemini
    session, events = await open_session(url)
    try:
        bad = {"inlineData": {"mimeType": "audio/pcm;rate=24000", "data": "not base64 at all!"}}
        good = {"inlineData": {"mimeType": "audio/pcm;rate=24000", "data": _b64(_audio(5))}}
        await fake.send({"serverContent": {"modelTurn": {"parts": [bad]}}})
        await fake.send({"serverContent": {"modelTurn": {"parts": [good]}}})
        errored = await events.until(ProviderErrored)
        assert (errored.code, errored.fatal) == ("protocol_error", False)
        assert (await events.until(AudioReceived)).pcm == _audio(5)
    finally:
        await session.aclose()
