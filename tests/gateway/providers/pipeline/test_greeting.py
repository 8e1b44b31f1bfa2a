"""The pipeline's greeting recogniser (gateway/providers/pipeline/greeting.py) for answering-machine detection:
each utterance of the greeting is finalised after the endpoint's silence and its text handed on; the model
builds one from the profile's own STT component, or from its ``amd_stt``, and GreetingRecognisers builds an
``amd_stt`` for a profile of any provider."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from gateway.providers.base import AgentProfile, ComponentSpec, PipelineSpec
from gateway.providers.errors import ProviderConnectError
from gateway.providers.pipeline import components
from gateway.providers.pipeline.components import ComponentContext, Registration
from gateway.providers.pipeline.greeting import GreetingRecognisers, GreetingTranscriber
from gateway.providers.pipeline.model import PipelineModel
from gateway.providers.pipeline.synthetic import ScriptedStt, voice
from gateway.providers.registry import ProviderSettings, greeting_recognisers

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


async def _heard(greeting: GreetingTranscriber) -> list[str]:
    for pcm in (voice(600, seed=4), bytes(2 * 24_000 // 2)):
        for frame in _frames(pcm):
            greeting.feed(frame)
    try:
        return await asyncio.wait_for(_texts(greeting, 1), 2)
    finally:
        await greeting.aclose()


async def test_the_profiles_amd_stt_wins_over_the_pipelines_stt() -> None:
    spec = PipelineSpec(
        stt=ComponentSpec(name="scripted", options={"texts": "the pipeline's own"}),
        llm=ComponentSpec(name="openai-compatible"),
        tts=ComponentSpec(name="synthetic"),
    )
    amd_stt = ComponentSpec(name="scripted", options={"texts": "Leave a message"})
    model = PipelineModel(spec, ComponentContext())
    assert await _heard(await model.greeting_transcriber(AgentProfile(name="a", amd_stt=amd_stt))) == [
        "Leave a message"
    ]


async def test_recognisers_are_built_from_amd_stt_for_a_realtime_profile() -> None:
    recognisers = GreetingRecognisers(ComponentContext())
    profile = AgentProfile(
        name="agent", provider="openai", amd_stt=ComponentSpec(name="scripted", options={"texts": "Not available"})
    )
    assert await _heard(await recognisers.greeting_transcriber(profile)) == ["Not available"]
    with pytest.raises(ProviderConnectError, match="profile 'bare' names no amd_stt"):
        await recognisers.greeting_transcriber(AgentProfile(name="bare", provider="openai"))


async def test_a_recogniser_that_cannot_be_built_is_a_connect_error(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(spec: ComponentSpec, context: ComponentContext) -> Any:
        raise RuntimeError("model file missing")

    components.load_plugins()
    registration = Registration(kind="stt", name="broken", factory=broken, options=frozenset())
    monkeypatch.setitem(components._REGISTRY, ("stt", "broken"), registration)
    recognisers = GreetingRecognisers(ComponentContext())
    for name, problem in (("broken", "RuntimeError: model file missing"), ("gone", "unknown stt component 'gone'")):
        profile = AgentProfile(name="agent", provider="echo", amd_stt=ComponentSpec(name=name))
        with pytest.raises(ProviderConnectError, match=f"amd_stt {name}: .*{problem}"):
            await recognisers.greeting_transcriber(profile)


def test_the_workers_recognisers_get_the_pipelines_keys_and_urls() -> None:
    settings = ProviderSettings(deepgram_api_key="dg-secret", pipeline_urls="deepgram=ws://127.0.0.1:1")
    context = greeting_recognisers(settings).context
    assert context.urls == {"deepgram": "ws://127.0.0.1:1"} and context.key("deepgram") == "dg-secret"
