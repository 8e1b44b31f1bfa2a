"""The local stack in the pipeline provider: silero, Whisper, the rule agent and espeak-ng registered by name and
run by the real PipelineSession on espeak-spoken caller audio, paced in real time."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import numpy as np
import pytest

from gateway.providers.base import (
    AgentProfile,
    AudioReceived,
    ComponentSpec,
    PipelineSpec,
    ProviderEvent,
    ResponseDone,
    SpeechStarted,
    ToolCallRequested,
    TranscriptReceived,
)
from gateway.providers.pipeline import components
from gateway.providers.pipeline.components import ComponentContext
from gateway.providers.pipeline.local import factories
from gateway.providers.pipeline.model import PipelineModel
from gateway.providers.pipeline.session import PipelineSession
from gateway.session.config import SessionConfig
from gateway.session.tools import ToolRegistry
from tests.gateway.providers.pipeline.local.conftest import require_local_extra
from tests.gateway.providers.pipeline.local.speech import espeak, normalise, resample

pytestmark = [pytest.mark.peer, pytest.mark.timeout(120)]

E = TypeVar("E", bound=ProviderEvent)
LOCAL = PipelineSpec(
    stt=ComponentSpec(name="whisper"),
    llm=ComponentSpec(name="rules"),
    tts=ComponentSpec(name="espeak"),
    vad=ComponentSpec(name="silero"),
    endpoint_ms=500,
    max_endpoint_ms=8000,  # a decode on a machine other jobs load can take seconds; the turn must still end
)


class Reader:
    def __init__(self, events: AsyncIterator[ProviderEvent]) -> None:
        self._events = events
        self.seen: list[ProviderEvent] = []

    async def until(self, kind: type[E], *, within_s: float = 30.0, **match: Any) -> E:
        try:
            async with asyncio.timeout(within_s):
                async for event in self._events:
                    self.seen.append(event)
                    if isinstance(event, kind) and all(getattr(event, k) == v for k, v in match.items()):
                        return event
        except TimeoutError:
            pass
        raise AssertionError(f"no {kind.__name__} {match}; saw {[type(e).__name__ for e in self.seen]}")


async def speak(session: PipelineSession, text: str, *, then_ms: int) -> None:
    """espeak-ng en-us at 24 kHz, 20 ms frames in real time, then silence."""
    pcm, rate = espeak(text)
    audio = resample(pcm, rate, 24000)
    audio = np.concatenate([audio, np.zeros(-len(audio) % 480 + then_ms * 24, dtype=np.int16)])
    loop = asyncio.get_running_loop()
    at = loop.time()
    for offset in range(0, len(audio), 480):
        session.send_audio_nowait(audio[offset : offset + 480].tobytes())
        at += 0.02
        await asyncio.sleep(max(0.0, at - loop.time()))


def test_the_local_names_are_registered_with_their_options() -> None:
    assert {"whisper"} <= set(components.names("stt"))
    assert {"rules"} <= set(components.names("llm"))
    assert {"espeak"} <= set(components.names("tts"))
    assert {"silero"} <= set(components.names("vad"))
    components.check(LOCAL)
    bad = PipelineSpec(
        stt=ComponentSpec(name="whisper", options={"beam": 5}),
        llm=ComponentSpec(name="rules"),
        tts=ComponentSpec(name="espeak", options={"wpm": 170}),
    )
    assert components.problems(bad) == [
        "stt: whisper has no option beam (options: early_decode_ms, preroll_ms, vad_threshold)"
    ]


async def test_a_spoken_turn_is_answered_aloud_and_goodbye_calls_hang_up() -> None:
    require_local_extra()
    model = PipelineModel(LOCAL, ComponentContext())
    tools = ToolRegistry.from_config(SessionConfig()).resolve(())
    session = await model.connect(AgentProfile(provider="pipeline", instructions="Be brief.", tools=tools))
    reader = Reader(session.events())
    try:
        await speak(session, "My order number is four five seven two.", then_ms=1500)
        await reader.until(SpeechStarted)
        user = await reader.until(TranscriptReceived, role="user")
        assert normalise(user.text) == normalise("My order number is four five seven two.")
        audio = await reader.until(AudioReceived)
        final = await reader.until(TranscriptReceived, role="assistant", final=True)
        assert final.text == "I heard four, five, seven, two." and final.item_id == audio.item_id
        await reader.until(ResponseDone, status="completed")
        spoken = sum(len(e.pcm) for e in reader.seen if isinstance(e, AudioReceived))
        assert spoken / 48 > 1000  # more than a second of the agent's 24 kHz speech

        await speak(session, "Thank you very much, goodbye.", then_ms=1500)
        call = await reader.until(ToolCallRequested)
        assert call.name == "hang_up" and json.loads(call.arguments) == {"reason": "the caller said goodbye"}
        said = [e.text for e in reader.seen if isinstance(e, TranscriptReceived) and e.role == "assistant"]
        assert said[-1] == "Goodbye, thank you for calling."
    finally:
        await session.aclose()
        await factories.shared_espeak_engine().aclose()  # the worker's helper outlives calls, not the test
