"""The fake /v1/audio/speech server, proven by the openai SDK's own AsyncOpenAI streaming client."""

from __future__ import annotations

import openai
import pytest
from openai import AsyncOpenAI

from gateway.providers.fakes import speech
from gateway.providers.fakes.fake_openai_speech import FakeOpenAISpeechServer, SpeechOptions

pytestmark = pytest.mark.timeout(30)


async def test_sdk_streams_pcm_from_the_fake() -> None:
    text = "Your order shipped yesterday."
    async with FakeOpenAISpeechServer(SpeechOptions(pace=0, chunk_ms=40), api_key="sk-test") as fake:
        client = AsyncOpenAI(base_url=fake.base_url, api_key="sk-test")
        chunks: list[bytes] = []
        async with client.audio.speech.with_streaming_response.create(
            model="gpt-4o-mini-tts", voice="marin", input=text, response_format="pcm", speed=1.0
        ) as response:
            assert response.headers["content-type"] == "audio/pcm"
            async for chunk in response.iter_bytes():
                chunks.append(chunk)
        await client.close()
    assert b"".join(chunks) == speech.render(text)[0]
    (request,) = fake.requests
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.body == {
        "model": "gpt-4o-mini-tts",
        "voice": "marin",
        "input": text,
        "response_format": "pcm",
        "speed": 1.0,
    }


async def test_sdk_sees_openai_shaped_errors() -> None:
    async with FakeOpenAISpeechServer(api_key="right") as fake:
        wrong = AsyncOpenAI(base_url=fake.base_url, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as refused:
            await wrong.audio.speech.create(model="m", voice="v", input="hi", response_format="pcm")
        assert refused.value.code == "invalid_api_key"
        right = AsyncOpenAI(base_url=fake.base_url, api_key="right", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="pcm only"):
            await right.audio.speech.create(model="m", voice="v", input="hi", response_format="mp3")
        await wrong.close()
        await right.close()
    assert [r.status for r in fake.requests] == [401, 400]
