"""PipelineSession through PipelineModel: offline scripted STT and synthetic timed TTS, the fake chat server over
HTTP. Caller audio is paced in real time (20 ms frames), as the media tick sends it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from gateway.providers.base import (
    AgentProfile,
    AudioDone,
    AudioReceived,
    ComponentSpec,
    PipelineSpec,
    ProviderDisconnected,
    ProviderEvent,
    ResponseDone,
    ResponseStarted,
    SpeechStarted,
    SpeechStopped,
    ToolCallRequested,
    ToolSpec,
    TranscriptReceived,
)
from gateway.providers.fakes.fake_chat import FakeChatServer, ScriptedReply, ScriptedToolCall
from gateway.providers.pipeline.components import ComponentContext
from gateway.providers.pipeline.model import PipelineModel
from gateway.providers.pipeline.session import PipelineSession
from gateway.providers.pipeline.synthetic import voice
from tests.gateway.providers.pipeline.reader import Reader

SILENCE = bytes(960)


def spec(texts: str, *, timestamps: bool = True) -> PipelineSpec:
    return PipelineSpec(
        stt=ComponentSpec(name="scripted", options={"texts": texts}),
        llm=ComponentSpec(name="openai-compatible"),
        tts=ComponentSpec(name="synthetic", options={"ms_per_char": 50, "timestamps": timestamps}),
        endpoint_ms=300,
        max_endpoint_ms=1500,
        min_interrupt_ms=300,
    )


async def say(session: PipelineSession, ms: int, *, seed: int = 1) -> None:
    pcm = voice(ms, seed=seed)
    for offset in range(0, len(pcm) - 959, 960):
        session.send_audio_nowait(pcm[offset : offset + 960])
        await asyncio.sleep(0.02)


async def quiet(session: PipelineSession, ms: int) -> None:
    for _ in range(ms // 20):
        session.send_audio_nowait(SILENCE)
        await asyncio.sleep(0.02)


async def connect(fake: FakeChatServer, pipeline: PipelineSpec, **profile: Any) -> tuple[PipelineSession, Reader]:
    model = PipelineModel(pipeline, ComponentContext(llm_url=fake.url, llm_model="fake-llm"))
    session = await model.connect(AgentProfile(provider="pipeline", instructions="Be brief.", **profile))
    return session, Reader(session.events(), describe=_short)


async def test_a_turn_is_heard_answered_and_spoken_before_the_model_finishes() -> None:
    reply = ScriptedReply(text="Your order shipped. It arrives on Friday.", token_s=0.05)
    async with FakeChatServer([reply]) as fake:
        session, reader = await connect(fake, spec("where is my order"))
        await say(session, 400)
        started = await reader.until(SpeechStarted)
        await quiet(session, 400)
        stopped = await reader.until(SpeechStopped)
        user = await reader.until(TranscriptReceived, role="user")
        assert user.text == "where is my order" and user.item_id == started.item_id == stopped.item_id
        first_audio = await reader.until(AudioReceived)
        # The first clause was spoken while the model was still streaming the second.
        assert "It arrives" not in "".join(
            e.text for e in reader.seen if isinstance(e, TranscriptReceived) and e.role == "assistant"
        )
        final = await reader.until(TranscriptReceived, role="assistant", final=True)
        assert final.text == "Your order shipped. It arrives on Friday." and final.item_id == first_audio.item_id
        await reader.until(ResponseDone, status="completed")
        request = fake.requests[0].messages
        assert request == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "where is my order"},
        ]
        await session.aclose()
        await reader.until(ProviderDisconnected)


@pytest.mark.parametrize("timestamps", [True, False], ids=["tts-timestamps", "estimated"])
async def test_a_barge_in_keeps_exactly_the_heard_words_in_the_next_request(timestamps: bool) -> None:
    long = "One two three four five six seven eight nine ten eleven twelve thirteen fourteen."
    async with FakeChatServer([ScriptedReply(text=long), ScriptedReply(text="Sure.")]) as fake:
        session, reader = await connect(fake, spec("count for me|stop", timestamps=timestamps))
        await say(session, 300)
        await quiet(session, 400)
        audio = await reader.until(AudioReceived)
        # 50 ms per character and a one-character gap: "One" 0-150, "two" 200-350, "three" 400-650, ...
        await say(session, 500, seed=3)  # talks over the agent
        barge = await reader.until(SpeechStarted)
        # The synthetic voice delivers faster than real time: generation ended, the caller still hears it.
        assert any(isinstance(e, ResponseDone) and e.response_id == audio.response_id for e in reader.seen)
        await session.cancel_response()  # the core's own cancel: idempotent
        await session.truncate_item(audio.item_id, content_index=0, audio_end_ms=420)
        cut = await reader.until(TranscriptReceived, role="assistant", final=True, text="One two three")
        assert cut.item_id == audio.item_id and barge.item_id.startswith("user_")
        await quiet(session, 400)
        await reader.until(ResponseDone, status="completed")
        second = fake.requests[1].messages
        assert second[1:] == [
            {"role": "user", "content": "count for me"},
            {"role": "assistant", "content": "One two three"},
            {"role": "user", "content": "stop"},
        ]
        await session.aclose()


async def test_a_tool_call_is_requested_and_its_result_feeds_the_next_reply() -> None:
    tool = ToolSpec(name="order_status", parameters={"type": "object", "properties": {"order": {"type": "string"}}})
    script = [
        ScriptedReply(
            text="Let me check.", tool_calls=(ScriptedToolCall(name="order_status", arguments='{"order": "4572"}'),)
        ),
        ScriptedReply(text="It shipped."),
    ]
    async with FakeChatServer(script) as fake:
        session, reader = await connect(fake, spec("order four five seven two"), tools=(tool,))
        await say(session, 300)
        await quiet(session, 400)
        call = await reader.until(ToolCallRequested)
        assert call.name == "order_status" and json.loads(call.arguments) == {"order": "4572"}
        await reader.until(ResponseDone, status="completed")
        await session.send_tool_result(call.call_id, '{"status": "shipped"}')
        await session.create_response()
        await reader.until(TranscriptReceived, role="assistant", final=True, text="It shipped.")
        messages = fake.requests[1].messages
        assert messages[2]["tool_calls"][0]["id"] == call.call_id
        assert messages[3] == {"role": "tool", "tool_call_id": call.call_id, "content": '{"status": "shipped"}'}
        await session.aclose()


async def test_a_dropped_chat_stream_is_retried_once_before_anything_was_heard() -> None:
    script = [ScriptedReply(text="lost words here", drop_after_chunks=2), ScriptedReply(text="Hello again.")]
    async with FakeChatServer(script) as fake:
        session, reader = await connect(fake, spec("hi"))
        await session.create_response(instructions="Greet the caller.")
        await reader.until(ResponseStarted)
        final = await reader.until(TranscriptReceived, role="assistant", final=True)
        assert final.text == "Hello again." and len(fake.requests) == 2
        assert fake.requests[0].messages[-1] == {"role": "system", "content": "Greet the caller."}
        assert any(isinstance(e, AudioDone) for e in reader.seen)
        await reader.until(ResponseDone, status="completed")
        await session.aclose()


async def test_a_chat_endpoint_that_stays_down_fails_the_reply_not_the_call() -> None:
    async with FakeChatServer([ScriptedReply(status=503), ScriptedReply(status=503)]) as fake:
        session, reader = await connect(fake, spec("hi"))
        await session.create_response()
        done = await reader.until(ResponseDone)
        assert done.status == "failed" and len(fake.requests) == 2
        await session.send_text("still here")  # the session is still usable
        await session.aclose()


def _short(event: ProviderEvent) -> str:
    if isinstance(event, AudioReceived):
        return f"Audio({event.item_id}, {len(event.pcm)})"
    return repr(event)
