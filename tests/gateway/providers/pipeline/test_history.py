"""The chat history a resumed call starts from, and the caller audio as the components hear it."""

from __future__ import annotations

import numpy as np

from gateway.providers.base import AgentProfile, ComponentSpec, HistoryItem, PipelineSpec, ResponseDone
from gateway.providers.fakes.fake_chat import FakeChatServer, ScriptedReply
from gateway.providers.pipeline._aio import Resampler
from gateway.providers.pipeline.components import ComponentContext
from gateway.providers.pipeline.history import ChatHistory
from gateway.providers.pipeline.model import PipelineModel
from gateway.providers.pipeline.ports import ChatMessage, ChatToolCall
from tests.gateway.providers.pipeline.test_session import Reader

TRANSCRIPT = (
    HistoryItem(kind="message", role="user", text="Where is order 4572?"),
    HistoryItem(kind="message", role="assistant", text="Let me check."),
    HistoryItem(kind="function_call", call_id="c1", name="order_status", arguments='{"order": "4572"}'),
    HistoryItem(kind="function_call_output", call_id="c1", output='{"status": "shipped"}'),
    HistoryItem(kind="message", role="assistant", text="It shipped."),
    HistoryItem(kind="message", role="system", text="Continue; do not greet again."),
)


def test_the_transcript_becomes_chat_messages_with_calls_on_their_assistant_turn() -> None:
    assert ChatHistory(TRANSCRIPT).messages(system="Be brief.") == [
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content="Where is order 4572?"),
        ChatMessage(
            role="assistant",
            content="Let me check.",
            tool_calls=(ChatToolCall(call_id="c1", name="order_status", arguments='{"order": "4572"}'),),
        ),
        ChatMessage(role="tool", tool_call_id="c1", content='{"status": "shipped"}'),
        ChatMessage(role="assistant", content="It shipped."),
        ChatMessage(role="system", content="Continue; do not greet again."),
    ]


def test_an_item_is_replaced_in_place_and_removed_when_nothing_was_heard() -> None:
    history = ChatHistory()
    history.append(ChatMessage(role="user", content="hi"), item_id="user_1")
    history.append(ChatMessage(role="assistant", content="Hello there, how are you?"), item_id="item_2")
    history.append(ChatMessage(role="user", content="fine"), item_id="user_3")
    history.set("item_2", ChatMessage(role="assistant", content="Hello there,"))
    assert [m.content for m in history.messages()] == ["hi", "Hello there,", "fine"]
    history.set("item_2", None)
    assert [m.content for m in history.messages()] == ["hi", "fine"]


async def test_a_resumed_session_sends_the_replayed_transcript_with_the_next_request() -> None:
    spec = PipelineSpec(
        stt=ComponentSpec(name="scripted"),
        llm=ComponentSpec(name="openai-compatible"),
        tts=ComponentSpec(name="synthetic"),
    )
    async with FakeChatServer([ScriptedReply(text="Anything else?")]) as fake:
        model = PipelineModel(spec, ComponentContext(llm_url=fake.url))
        session = await model.connect(AgentProfile(provider="pipeline", instructions="Be brief."), history=TRANSCRIPT)
        await session.create_response()
        await Reader(session.events()).until(ResponseDone)
        await session.aclose()
    messages = fake.requests[0].messages
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[2]["tool_calls"][0]["id"] == "c1" and messages[3]["role"] == "tool"
    assert messages[-1] == {"role": "system", "content": "Continue; do not greet again."}


def test_caller_frames_reach_a_16_khz_component_as_whole_frames_in_order() -> None:
    resampler = Resampler(16_000)
    t = np.arange(480 * 5) / 24_000
    tone = (np.sin(2 * np.pi * 440 * t) * 8000).astype("<i2").tobytes()
    out = b"".join(resampler.process(tone[i : i + 960]) for i in range(0, len(tone), 960))
    assert len(out) == 5 * 320 * 2
    assert Resampler(24_000).process(tone) == tone
