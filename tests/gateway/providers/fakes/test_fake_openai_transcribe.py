"""The fake OpenAI Realtime transcription session, proven by the openai SDK's own realtime client."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest
from openai import AsyncOpenAI
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

from gateway.providers.fakes import speech
from gateway.providers.fakes.fake_openai_transcribe import FakeOpenAITranscribeServer, TranscribeOptions
from tests.gateway.providers.pipeline.cloud.helpers import assert_exact

pytestmark = pytest.mark.timeout(30)

SERVER_EVENTS: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)


async def test_sdk_realtime_client_transcribes_a_turn() -> None:
    audio = b"\0" * 9600 + speech.render("Check my order, please.")[0] + b"\0" * 24000
    async with FakeOpenAITranscribeServer(
        TranscribeOptions(transcripts=("check my order please",)), api_key="sk"
    ) as fake:
        client = AsyncOpenAI(api_key="sk", websocket_base_url=fake.base_url)
        async with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
            await conn.session.update(
                session={
                    "type": "transcription",
                    "audio": {
                        "input": {
                            "format": {"type": "audio/pcm", "rate": 24000},
                            "transcription": {"model": "gpt-4o-mini-transcribe", "language": "en"},
                            "turn_detection": {"type": "server_vad", "silence_duration_ms": 300},
                        }
                    },
                }
            )
            for first in range(0, len(audio), 4800):
                await conn.input_audio_buffer.append(audio=base64.b64encode(audio[first : first + 4800]).decode())
            kinds = []
            async with asyncio.timeout(10):
                async for event in conn:
                    kinds.append(event.type)
                    if event.type == "conversation.item.input_audio_transcription.completed":
                        completed = event
                        break
        await client.close()
    assert kinds[:2] == ["session.created", "session.updated"]
    assert kinds[2] == "input_audio_buffer.speech_started"
    assert completed.transcript == "check my order please"
    record = fake.record(1)
    assert record.query == {"intent": "transcription"}
    assert bytes(record.audio) == audio
    for message in record.sent:
        assert_exact(SERVER_EVENTS, message)
