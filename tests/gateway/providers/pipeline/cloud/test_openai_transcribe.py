"""The OpenAI transcription adapter: its events against the SDK's models, recognition against the fake."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from openai.types.realtime import RealtimeClientEvent
from pydantic import TypeAdapter

from gateway.providers.errors import ProviderConnectError
from gateway.providers.fakes import speech
from gateway.providers.fakes.fake_openai_transcribe import FakeOpenAITranscribeServer, TranscribeOptions
from gateway.providers.fakes.vendor_server import Faults
from gateway.providers.pipeline.cloud.openai_transcribe import (
    COMMIT,
    OpenAITranscribeConfig,
    TranscribeParser,
    append,
    connect_url,
    open_openai_transcribe,
    session_update,
)
from gateway.providers.pipeline.ports import SttFailed, SttFinal, SttPartial, SttSpeechStarted
from tests.gateway.providers.pipeline.cloud.helpers import assert_exact, until

pytestmark = pytest.mark.timeout(30)

CLIENT_EVENTS: TypeAdapter[Any] = TypeAdapter(RealtimeClientEvent)


def test_client_events_match_the_sdk_models() -> None:
    cfg = OpenAITranscribeConfig(api_key="sk-secret", language="en", prompt="Order numbers.")
    assert_exact(CLIENT_EVENTS, session_update(cfg))
    assert_exact(CLIENT_EVENTS, session_update(OpenAITranscribeConfig(turn_detection="none")))
    assert_exact(CLIENT_EVENTS, orjson.loads(append(b"\1\0\2\0")))
    assert_exact(CLIENT_EVENTS, COMMIT)
    assert connect_url(cfg) == "wss://api.openai.com/v1/realtime?intent=transcription"
    assert "sk-secret" not in repr(cfg)


def test_parser_accumulates_deltas_and_marks_finalized_turns() -> None:
    parser = TranscribeParser()
    assert parser.parse({"type": "input_audio_buffer.speech_started", "audio_start_ms": 420, "item_id": "a"}) == [
        SttSpeechStarted(at_ms=420)
    ]
    delta = "conversation.item.input_audio_transcription.delta"
    assert parser.parse({"type": delta, "item_id": "a", "delta": "check"}) == [SttPartial(text="check")]
    assert parser.parse({"type": delta, "item_id": "a", "delta": " my order"}) == [SttPartial(text="check my order")]
    completed = {"type": "conversation.item.input_audio_transcription.completed", "item_id": "a", "transcript": "x"}
    assert parser.parse(completed) == [SttFinal(text="x", speech_final=True)]
    parser.commits_pending = 1
    assert parser.parse(completed) == [SttFinal(text="x", speech_final=True, from_finalize=True)]
    parser.commits_pending = 1
    empty = {"type": "error", "error": {"code": "input_audio_buffer_commit_empty", "message": "too small"}}
    assert parser.parse(empty) == [SttFinal(text="", from_finalize=True)]
    (failed,) = parser.parse({"type": "error", "error": {"code": "server_error", "message": "oops"}})
    assert isinstance(failed, SttFailed) and failed.retryable
    failed_turn = {
        "type": "conversation.item.input_audio_transcription.failed",
        "item_id": "b",
        "content_index": 0,
        "error": {"message": "audio unreadable"},
    }
    assert parser.parse(failed_turn) == [SttFinal(text="", speech_final=True)]
    with pytest.raises(KeyError):
        parser.parse({"type": "conversation.item.input_audio_transcription.completed"})


async def test_server_vad_turn_and_a_finalized_turn() -> None:
    options = TranscribeOptions(transcripts=("check my order please", "thanks"))
    async with FakeOpenAITranscribeServer(options, api_key="sk") as fake:
        stt = await open_openai_transcribe(OpenAITranscribeConfig(url=fake.url, api_key="sk", silence_duration_ms=300))
        audio = b"\0" * 9600 + speech.render("Check my order, please.")[0] + b"\0" * 24000
        for first in range(0, len(audio), 960):
            stt.feed(audio[first : first + 960])
        events = await until(stt.events(), SttFinal)
        assert events[0] == SttSpeechStarted(at_ms=220)
        assert SttPartial(text="check my") in events
        assert events[-1] == SttFinal(text="check my order please", speech_final=True)
        stt.feed(speech.render("Thanks.")[0])
        stt.finalize()
        # the VAD is still inside the second turn: only our commit decides it
        final = (await until(stt.events(), SttFinal))[-1]
        await stt.aclose()
    assert final == SttFinal(text="thanks", speech_final=True, from_finalize=True)
    received = fake.record(1).received
    assert received[0]["session"]["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 300
    assert received[-1] == {"type": "input_audio_buffer.commit"}
    for message in received:
        assert_exact(CLIENT_EVENTS, message)


async def test_bad_key_is_not_retryable_and_a_drop_ends_the_events() -> None:
    async with FakeOpenAITranscribeServer(api_key="right") as fake:
        with pytest.raises(ProviderConnectError) as refused:
            await open_openai_transcribe(OpenAITranscribeConfig(url=fake.url, api_key="wrong"))
        assert not refused.value.retryable
        stt = await open_openai_transcribe(OpenAITranscribeConfig(url=fake.url, api_key="right"))
        (conn_id,) = fake.server.live  # the refused handshake never became a connection
        await fake.server.drop(conn_id)
        (failed,) = [e async for e in stt.events()]
        await stt.aclose()
    assert isinstance(failed, SttFailed) and failed.retryable


async def test_a_backlog_over_the_limit_fails_instead_of_growing() -> None:
    async with FakeOpenAITranscribeServer() as fake:
        stt = await open_openai_transcribe(OpenAITranscribeConfig(url=fake.url, backlog_limit_s=0.1))
        for _ in range(6):  # 6 x 20 ms fed synchronously: over the 100 ms bound before anything is sent
            stt.feed(b"\0" * 960)
        (failed,) = [e async for e in stt.events()]
        await stt.aclose()
    assert isinstance(failed, SttFailed) and "backlog" in failed.message


async def test_a_malformed_frame_ends_the_recogniser_retryable() -> None:
    async with FakeOpenAITranscribeServer(faults=Faults(bad_frame_after=2)) as fake:
        stt = await open_openai_transcribe(OpenAITranscribeConfig(url=fake.url))
        (failed,) = [e async for e in stt.events()]  # session.updated went out during setup, then garbage
        await stt.aclose()
    assert isinstance(failed, SttFailed) and failed.retryable and "malformed" in failed.message
    assert stt.malformed_frames == 1
