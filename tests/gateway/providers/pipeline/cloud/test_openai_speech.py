"""The OpenAI-compatible speech adapter: its request against the SDK's params, its audio against the fake."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.audio.speech_create_params import SpeechCreateParams
from pydantic import TypeAdapter

from gateway.providers.fakes import speech
from gateway.providers.fakes.fake_openai_speech import FakeOpenAISpeechServer, SpeechOptions
from gateway.providers.pipeline.cloud.openai_speech import (
    OpenAISpeechConfig,
    OpenAISpeechTts,
    PcmFramer,
    failure_of,
    speech_request,
)
from gateway.providers.pipeline.ports import TtsAudio, TtsDone, TtsFailed
from tests.gateway.providers.pipeline.cloud.helpers import drain, until

pytestmark = pytest.mark.timeout(30)

PARAMS: TypeAdapter[Any] = TypeAdapter(SpeechCreateParams)


def test_request_matches_the_sdk_params_key_for_key() -> None:
    cfg = OpenAISpeechConfig(api_key="sk-secret", instructions="Warm and brief.", speed=1.25)
    body = speech_request(cfg, "Hello there. ", voice="cedar")
    assert PARAMS.validate_python(body) == body  # a TypedDict drops unknown keys: equality proves there are none
    assert body["response_format"] == "pcm" and body["voice"] == "cedar"
    assert set(speech_request(OpenAISpeechConfig(), "x")) == {"model", "input", "voice", "response_format"}
    assert "sk-secret" not in repr(cfg)


def test_framer_and_failures() -> None:
    framer = PcmFramer()
    assert framer.feed(b"\1\2\3") == b"\1\2"
    assert framer.feed(b"\4") == b"\3\4"
    bad_key = failure_of(401, b'{"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}}')
    assert bad_key == TtsFailed(message="openai speech: HTTP 401: Incorrect API key provided", retryable=False)
    assert failure_of(429, b"slow down").retryable and failure_of(503, b"").retryable


async def test_clauses_are_spoken_in_order_then_done() -> None:
    clauses = ("Sure, your order ", "shipped yesterday. ", "It arrives Friday.")
    async with FakeOpenAISpeechServer(SpeechOptions(chunk_ms=50), api_key="sk") as fake:
        tts = OpenAISpeechTts(OpenAISpeechConfig(url=fake.base_url, api_key="sk"))
        stream = await tts.open("item-1")
        assert stream.timestamps is False
        for clause in clauses:
            await stream.push(clause)
        await stream.flush()
        events = await drain(stream.events())
        await tts.aclose()
    assert isinstance(events[-1], TtsDone)
    audio = b"".join(e.pcm for e in events if isinstance(e, TtsAudio))
    assert audio == b"".join(speech.render(c)[0] for c in clauses)
    assert [r.body["input"] for r in fake.requests] == list(clauses)
    for request in fake.requests:  # the bodies as they went over the wire
        assert PARAMS.validate_python(request.body) == request.body


async def test_cancel_stops_audio() -> None:
    async with FakeOpenAISpeechServer(SpeechOptions(pace=1.0, chunk_ms=40)) as fake:
        tts = OpenAISpeechTts(OpenAISpeechConfig(url=fake.base_url))
        stream = await tts.open("item-1")
        await stream.push("A long sentence that takes well over a second to speak out loud.")
        await stream.push("And another one that never gets spoken.")
        await until(stream.events(), TtsAudio)
        await stream.cancel()
        assert await drain(stream.events(), within_s=2) == []
        await fake.wait_until(lambda: fake.requests[0].finished)
        await tts.aclose()
    full = len(speech.render("A long sentence that takes well over a second to speak out loud.")[0])
    assert fake.requests[0].ended_at is None and fake.requests[0].audio_bytes < full
    assert len(fake.requests) == 1  # the second clause was never requested


async def test_bad_key_not_retryable_and_a_drop_mid_answer_retryable() -> None:
    async with FakeOpenAISpeechServer(api_key="right") as fake:
        tts = OpenAISpeechTts(OpenAISpeechConfig(url=fake.base_url, api_key="wrong"))
        stream = await tts.open("item-1")
        await stream.push("Hello.")
        (failed,) = await drain(stream.events())
        await tts.aclose()
    assert isinstance(failed, TtsFailed) and not failed.retryable and "401" in failed.message
    async with FakeOpenAISpeechServer(SpeechOptions(chunk_ms=20, drop_after_bytes=4800)) as fake:
        tts = OpenAISpeechTts(OpenAISpeechConfig(url=fake.base_url))
        stream = await tts.open("item-1")
        await stream.push("A sentence long enough to be cut off.")
        events = await drain(stream.events())
        await tts.aclose()
    assert isinstance(events[-1], TtsFailed) and events[-1].retryable
    assert sum(len(e.pcm) for e in events if isinstance(e, TtsAudio)) == 4800
