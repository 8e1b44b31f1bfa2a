"""The cloud components inside the pipeline session: Deepgram hears the caller, the chat fake answers, Cartesia or
ElevenLabs speaks, and a barge-in keeps exactly the words whose audio had started (from the vendor's timestamps).

Runs once the pipeline session (gateway.providers.pipeline.model) is part of the tree."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import pytest

pytest.importorskip("gateway.providers.pipeline.model")

from gateway.providers.base import (
    AgentProfile,
    AudioReceived,
    ComponentSpec,
    PipelineSpec,
    ProviderEvent,
    SpeechStarted,
    TranscriptReceived,
)
from gateway.providers.fakes import speech
from gateway.providers.fakes.fake_cartesia import CartesiaOptions, FakeCartesiaServer
from gateway.providers.fakes.fake_chat import FakeChatServer, ScriptedReply
from gateway.providers.fakes.fake_deepgram import DeepgramOptions, FakeDeepgramServer
from gateway.providers.fakes.fake_elevenlabs import ElevenLabsOptions, FakeElevenLabsServer
from gateway.providers.pipeline.components import ComponentContext
from gateway.providers.pipeline.model import PipelineModel

pytestmark = [pytest.mark.timeout(60), pytest.mark.filterwarnings("ignore::DeprecationWarning")]

E = TypeVar("E", bound=ProviderEvent)
FRAME = 960  # 20 ms at 24 kHz
REPLY = "One two three four five six seven eight nine ten eleven twelve."


class Reader:
    def __init__(self, events: AsyncIterator[ProviderEvent]) -> None:
        self._events = events
        self.seen: list[ProviderEvent] = []

    async def until(self, kind: type[E], *, within_s: float = 10.0, **match: Any) -> E:
        async with asyncio.timeout(within_s):
            async for event in self._events:
                self.seen.append(event)
                if isinstance(event, kind) and all(getattr(event, k) == v for k, v in match.items()):
                    return event
        raise AssertionError(f"events ended before {kind.__name__} {match}")


async def say(session: Any, text: str, *, quiet_ms: int) -> None:
    """Caller audio paced as the media tick sends it: the utterance, then silence."""
    pcm = speech.render(text)[0] + bytes(48 * quiet_ms)
    pcm += bytes(-len(pcm) % FRAME)
    for offset in range(0, len(pcm), FRAME):
        session.send_audio_nowait(pcm[offset : offset + FRAME])
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("voice", ["cartesia", "elevenlabs"])
async def test_a_call_through_deepgram_and_a_timestamped_voice_truncates_to_the_heard_words(voice: str) -> None:
    stt_fake = FakeDeepgramServer(DeepgramOptions(transcripts=("count for me", "stop")), api_key="dg")
    tts_fake: Any = (
        FakeCartesiaServer(CartesiaOptions(pace=0), api_key="ca")
        if voice == "cartesia"
        else FakeElevenLabsServer(ElevenLabsOptions(pace=0), api_key="xi")
    )
    chat = FakeChatServer([ScriptedReply(text=REPLY), ScriptedReply(text="Sure.")])
    async with stt_fake, tts_fake, chat:
        context = ComponentContext(
            keys={"deepgram": "dg", "cartesia": "ca", "elevenlabs": "xi"},
            urls={"deepgram": stt_fake.base_url, voice: tts_fake.base_url},
            llm_url=chat.url,
            llm_model="fake-llm",
        )
        spec = PipelineSpec(
            stt=ComponentSpec(name="deepgram", options={"endpointing_ms": 300}),
            llm=ComponentSpec(name="openai-compatible"),
            tts=ComponentSpec(name=voice),
            endpoint_ms=300,
            max_endpoint_ms=1500,
            min_interrupt_ms=300,
        )
        session = await PipelineModel(spec, context).connect(AgentProfile(provider="pipeline", voice="voice-1"))
        reader = Reader(session.events())
        await say(session, "Count for me.", quiet_ms=700)
        user = await reader.until(TranscriptReceived, role="user")
        assert user.text == "count for me"
        audio = await reader.until(AudioReceived)
        await say(session, "Stop right there, please.", quiet_ms=0)
        await reader.until(SpeechStarted)
        # The fake voice's layout: "One" 30-225 ms, "two" 265-460, "three" 500-785: 480 ms heard two words.
        await session.truncate_item(audio.item_id, content_index=0, audio_end_ms=480)
        cut = await reader.until(TranscriptReceived, role="assistant", final=True, item_id=audio.item_id)
        assert cut.text == "One two"
        await say(session, "", quiet_ms=700)
        await reader.until(TranscriptReceived, role="assistant", final=True, text="Sure.")
        assert chat.requests[1].messages[-2:] == [
            {"role": "assistant", "content": "One two"},
            {"role": "user", "content": "stop"},
        ]
        await session.aclose()
