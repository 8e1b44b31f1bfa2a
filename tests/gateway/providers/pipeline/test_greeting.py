"""The pipeline's greeting recogniser (gateway/providers/pipeline/greeting.py) for answering-machine detection:
each utterance of the greeting is finalised after the endpoint's silence and its text handed on; the model
builds one from the profile's own STT component."""

from __future__ import annotations

import asyncio

import numpy as np

from gateway.providers.base import AgentProfile, ComponentSpec, PipelineSpec
from gateway.providers.pipeline.components import ComponentContext
from gateway.providers.pipeline.greeting import GreetingTranscriber
from gateway.providers.pipeline.model import PipelineModel
from gateway.providers.pipeline.synthetic import ScriptedStt, voice

FRAME = 480


def _frames(pcm: bytes) -> list[np.ndarray]:
    samples = np.frombuffer(pcm, dtype="<i2")
    return [samples[i : i + FRAME] for i in range(0, samples.size - FRAME + 1, FRAME)]


async def _texts(greeting: GreetingTranscriber, count: int) -> list[str]:
    got: list[str] = []
    async for text in greeting.texts():
        got.append(text)
        if len(got) == count:
            break
    return got


async def test_each_utterance_is_finalised_after_the_endpoint() -> None:
    stt = ScriptedStt(texts=("Hi!", "Please leave a message"))
    greeting = GreetingTranscriber(stt, endpoint_ms=300)
    silence = bytes(2 * 24_000 // 2)  # 0.5 s
    for pcm in (voice(400, seed=1), silence, voice(1200, seed=2), silence):
        for frame in _frames(pcm):
            greeting.feed(frame)
    assert await asyncio.wait_for(_texts(greeting, 2), 2) == ["Hi!", "Please leave a message"]
    await greeting.aclose()


async def test_silence_alone_finalises_nothing() -> None:
    stt = ScriptedStt(texts=("never",))
    greeting = GreetingTranscriber(stt, endpoint_ms=300)
    for frame in _frames(bytes(2 * 24_000)):
        greeting.feed(frame)
    assert stt.fed_bytes > 0 and stt._events.queue.empty()
    await greeting.aclose()


async def test_the_model_builds_one_from_the_profiles_stt() -> None:
    spec = PipelineSpec(
        stt=ComponentSpec(name="scripted", options={"texts": "You have reached Sam"}),
        llm=ComponentSpec(name="openai-compatible"),
        tts=ComponentSpec(name="synthetic"),
    )
    model = PipelineModel(spec, ComponentContext())
    greeting = await model.greeting_transcriber(AgentProfile(name="agent"))
    for pcm in (voice(600, seed=3), bytes(2 * 24_000 // 2)):
        for frame in _frames(pcm):
            greeting.feed(frame)
    assert await asyncio.wait_for(_texts(greeting, 1), 2) == ["You have reached Sam"]
    await greeting.aclose()
