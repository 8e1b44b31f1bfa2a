"""A cloud-pipeline call through the vendors' fakes and the real session core, with a barge-in.

The session core (:class:`gateway.session.CallSession`, ticked every 20 ms as the worker does) runs the
``pipeline`` provider built from Deepgram (``fake_deepgram`` over a websocket), the chat model (``fake_chat`` over
HTTP) and ElevenLabs multi-context TTS (``fake_elevenlabs``, audio paced in real time with per-chunk character
alignment). The caller talks, the agent answers, the caller cuts in. The NEXT Chat Completions request must hold
exactly the words whose sound started before the milliseconds the core sent to the caller, and the core's own
transcript the same prefix. The expected words are computed from what the ElevenLabs fake was asked to say and its
documented speech layout (:mod:`gateway.providers.fakes.speech`), not from the pipeline's alignment parser.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import numpy as np
import pytest

from gateway.providers.base import AgentProfile, ComponentSpec, PipelineSpec
from gateway.providers.fakes import speech
from gateway.providers.fakes.fake_chat import FakeChatServer, ScriptedReply
from gateway.providers.fakes.fake_deepgram import DeepgramOptions, FakeDeepgramServer
from gateway.providers.fakes.fake_elevenlabs import ElevenLabsOptions, FakeElevenLabsServer
from gateway.providers.pipeline import components
from gateway.providers.pipeline.cloud.deepgram import DeepgramConfig, open_deepgram
from gateway.providers.pipeline.cloud.elevenlabs import ElevenLabsConfig, ElevenLabsTts
from gateway.providers.pipeline.components import ComponentContext
from gateway.providers.pipeline.model import PipelineModel
from gateway.providers.pipeline.synthetic import voice
from gateway.session import CallSession, SessionConfig, TransferOutcome
from gateway.session.control import WarmTransferStart
from gateway.session.events import BargedIn
from telcodecs.frames import Frame

pytestmark = pytest.mark.timeout(60)

REPLY = "Your order left our warehouse yesterday morning. The courier will deliver it on Friday before noon."


class _Control:
    async def hang_up(self, reason: str) -> None:
        return None

    async def transfer(self, target: str) -> TransferOutcome:
        return TransferOutcome(status="refused")

    async def send_dtmf(self, digits: str) -> None:
        return None

    async def hold(self, held: bool) -> None:
        return None

    async def warm_transfer(self, target: str, summary: str, briefing: str | None = None) -> WarmTransferStart:
        return WarmTransferStart(status="refused")


def expected_heard(jobs: list[str], audio_end_ms: int) -> str:
    """The fake speaks each flushed text in turn (a 30 ms lead before the first only); a word counts as heard
    once its sound started before ``audio_end_ms``."""
    text, cut, offset = "", 0, 0
    for index, job in enumerate(jobs):
        words, total_ms = speech.layout(job, lead_ms=speech.LEAD_MS if index == 0 else 0)
        for word in words:
            if offset + word.start_ms < audio_end_ms:
                cut = len(text) + word.char_end
        text += job
        offset += total_ms
    return text[:cut].strip()


async def test_a_cloud_pipeline_call_keeps_exactly_the_heard_words_after_a_barge_in() -> None:
    deepgram = FakeDeepgramServer(DeepgramOptions(transcripts=("where is my order", "stop please")))
    eleven = FakeElevenLabsServer(ElevenLabsOptions(chunk_ms=100, pace=1.0))
    chat = FakeChatServer([ScriptedReply(text=REPLY, token_s=0.01), ScriptedReply(text="Sure.")])
    async with deepgram, eleven, chat:

        async def stt(spec: ComponentSpec, context: ComponentContext) -> Any:
            return await open_deepgram(DeepgramConfig(url=deepgram.url, endpointing_ms=300))

        async def tts(spec: ComponentSpec, context: ComponentContext) -> Any:
            return ElevenLabsTts(ElevenLabsConfig(url=eleven.base_url, voice="test-voice"))

        components.register("stt", "e2e-deepgram", stt)
        components.register("tts", "e2e-elevenlabs", tts)
        spec = PipelineSpec(
            stt=ComponentSpec(name="e2e-deepgram"),
            llm=ComponentSpec(name="openai-compatible"),
            tts=ComponentSpec(name="e2e-elevenlabs"),
            endpoint_ms=400,
            min_interrupt_ms=400,
        )
        model = PipelineModel(spec, ComponentContext(llm_url=chat.url, llm_model="fake-llm"))
        session = CallSession(
            call_id="cloud-e2e",
            profile=AgentProfile(name="shop", provider="pipeline", instructions="Be brief."),
            model=model,
            control=_Control(),
            config=SessionConfig(),
        )
        await session.start()
        talk = np.frombuffer(voice(900, seed=4), dtype="<i2")
        frames = [talk[i : i + 480] for i in range(0, talk.size - 479, 480)]
        quiet = np.zeros(480, dtype=np.int16)
        # 0.9 s of speech, 2.4 s of silence (the agent answers), 0.9 s over the agent, then silence.
        script = frames + [quiet] * 120 + frames + [quiet] * 150
        loop = asyncio.get_running_loop()
        start = loop.time()
        agent_frames = 0
        for index, pcm in enumerate(script):
            delay = start + index * 0.02 - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            session.push_inbound(Frame(index=index, pcm=pcm))
            agent_frames += session.pull_outbound() is not None
        await chat.wait_for_requests(2, within_s=5.0)
        records, _gap = session.events.events_since(0)
        transcript = session.transcript
        await session.aclose()

    (barge,) = [r.event for r in records if isinstance(r.event, BargedIn)]
    (item,) = barge.items
    assert barge.trigger == "speech_started" and barge.cancelled
    assert 0 < item.sent_ms < item.received_ms + 1 and agent_frames > 0
    # What ElevenLabs was asked to say, flush by flush, for the interrupted item (its first context).
    jobs = [m["text"] for m in eleven.record(1).received if m.get("flush") and m.get("text", "").strip()]
    heard = expected_heard(jobs, item.audio_end_ms)
    assert heard and heard != REPLY, (heard, item)

    second = chat.requests[1].messages
    assert second[1:] == [
        {"role": "user", "content": "where is my order"},
        {"role": "assistant", "content": heard},
        {"role": "user", "content": "stop please"},
    ], second
    spoken = [(e.role, e.text) for e in transcript if e.kind == "message" and e.text]
    assert spoken[:3] == [("user", "where is my order"), ("assistant", heard), ("user", "stop please")]
    assert re.fullmatch(r"[\w ,.]+", heard)
