"""The Chat Completions client (sans-I/O decoder and accumulator, httpx shell) and the fake chat server, with the
``openai`` SDK as the authority: its client streams from the fake, its models validate every chunk and request."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk
from openai.types.chat.completion_create_params import CompletionCreateParamsStreaming
from pydantic import TypeAdapter

from gateway.providers.base import ToolSpec
from gateway.providers.fakes.fake_chat import FakeChatServer, ScriptedReply, ScriptedToolCall, reply_chunks
from gateway.providers.pipeline.chat import (
    ChatConfig,
    ChunkAccumulator,
    OpenAICompatibleChat,
    SseDecoder,
    chat_request,
)
from gateway.providers.pipeline.ports import (
    ChatMessage,
    ChatToolCall,
    LlmEvent,
    LlmFailed,
    LlmFinished,
    TextDelta,
    ToolCallDone,
)

ORDER_TOOL = ToolSpec(
    name="order_status",
    description="Look up an order",
    parameters={"type": "object", "properties": {"order": {"type": "string"}}, "required": ["order"]},
)
HISTORY = (
    ChatMessage(role="system", content="Be brief."),
    ChatMessage(role="user", content="Where is order 4572?"),
    ChatMessage(
        role="assistant",
        content="Let me check.",
        tool_calls=(ChatToolCall(call_id="call_1", name="order_status", arguments='{"order": "4572"}'),),
    ),
    ChatMessage(role="tool", tool_call_id="call_1", content='{"status": "shipped"}'),
)
REQUEST_ADAPTER: TypeAdapter[Any] = TypeAdapter(CompletionCreateParamsStreaming)


def _strict_keys(value: Any, validated: Any) -> None:
    """TypedDict validation ignores unknown keys: compare key sets all the way down."""
    if isinstance(value, dict):
        assert set(value) == set(validated), f"unknown keys {set(value) ^ set(validated)}"
        for key in value:
            _strict_keys(value[key], validated[key])
    elif isinstance(value, list):
        for a, b in zip(value, validated, strict=True):
            _strict_keys(a, b)


def test_the_request_body_is_a_valid_streaming_request_with_no_unknown_keys() -> None:
    body = chat_request(HISTORY, (ORDER_TOOL,), model="gpt-4o-mini", temperature=0.2, max_tokens=200)
    validated = REQUEST_ADAPTER.validate_python(body)
    _strict_keys(body, validated)
    assert body["stream"] is True and body["tool_choice"] == "auto"
    assert body["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"order": "4572"}'
    assert body["messages"][3] == {"role": "tool", "tool_call_id": "call_1", "content": '{"status": "shipped"}'}


def test_a_misspelt_request_key_is_caught_by_the_key_comparison() -> None:
    body = chat_request(HISTORY, (), model="m")
    body["messages"][0]["contnet"] = "typo"
    with pytest.raises(AssertionError, match="unknown keys"):
        _strict_keys(body, REQUEST_ADAPTER.validate_python(body))


def test_every_fake_chunk_is_a_valid_chat_completion_chunk() -> None:
    reply = ScriptedReply(
        text="Let me check that order.",
        tool_calls=(ScriptedToolCall(name="order_status", arguments='{"order": "4572"}'),),
    )
    state = ChatCompletionStreamState()
    chunks = list(reply_chunks(reply, completion_id="c1", model="m", created=1))
    for chunk in chunks:
        model = ChatCompletionChunk.model_validate(chunk)
        assert model.model_dump(exclude_unset=True) == chunk
        state.handle_chunk(model)
    completion = state.get_final_completion()
    message = completion.choices[0].message
    assert message.content == "Let me check that order."
    assert message.tool_calls is not None and message.tool_calls[0].function.name == "order_status"
    assert json.loads(message.tool_calls[0].function.arguments) == {"order": "4572"}


def _accumulate(chunks: list[dict[str, Any]]) -> list[LlmEvent]:
    acc = ChunkAccumulator()
    events: list[LlmEvent] = []
    for chunk in chunks:
        events += acc.feed(chunk)
    return events + acc.end()


def test_the_accumulator_gives_text_then_complete_tool_calls_then_finished() -> None:
    reply = ScriptedReply(
        text="One moment.",
        tool_calls=(
            ScriptedToolCall(name="order_status", arguments='{"order": "4572"}', call_id="a"),
            ScriptedToolCall(name="transfer", arguments='{"to": "sales"}', call_id="b"),
        ),
    )
    events = _accumulate(list(reply_chunks(reply, completion_id="c", model="m", created=1)))
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "One moment."
    calls = [e.call for e in events if isinstance(e, ToolCallDone)]
    assert [(c.call_id, c.name, json.loads(c.arguments)) for c in calls] == [
        ("a", "order_status", {"order": "4572"}),
        ("b", "transfer", {"to": "sales"}),
    ]
    assert events[-1] == LlmFinished(finish_reason="tool_calls")


def test_parallel_calls_sharing_one_index_are_told_apart_by_id() -> None:
    def delta(**tool: Any) -> dict[str, Any]:
        return {"choices": [{"index": 0, "delta": {"tool_calls": [tool]}, "finish_reason": None}]}

    chunks = [
        delta(index=0, id="x", type="function", function={"name": "a", "arguments": '{"n":'}),
        delta(index=0, function={"arguments": " 1}"}),
        delta(index=0, id="y", type="function", function={"name": "b", "arguments": "{}"}),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]
    calls = [e.call for e in _accumulate(chunks) if isinstance(e, ToolCallDone)]
    assert [(c.call_id, c.name, c.arguments) for c in calls] == [("x", "a", '{"n": 1}'), ("y", "b", "{}")]


def test_truncated_tool_arguments_are_a_failure_not_a_call() -> None:
    chunks = [
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "x", "function": {"name": "a"}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"n": '}}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]
    events = _accumulate(chunks)
    assert len(events) == 1 and isinstance(events[0], LlmFailed) and "complete JSON" in events[0].message


def test_a_stream_without_finish_reason_failed() -> None:
    events = _accumulate([{"choices": [{"index": 0, "delta": {"content": "Hel"}}]}])
    assert events[0] == TextDelta(text="Hel")
    assert isinstance(events[-1], LlmFailed) and events[-1].retryable


@given(st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=40))
def test_the_sse_decoder_gives_the_same_events_however_the_bytes_are_cut(cuts: list[int]) -> None:
    stream = b'data: {"a": 1}\r\n\r\n: comment\n\ndata: x\ndata: y\n\nevent: e\ndata: [DONE]\r\r'
    decoder = SseDecoder()
    events: list[str] = []
    position = 0
    for cut in itertools_cycle(cuts, len(stream)):
        events += decoder.feed(stream[position : position + cut])
        position += cut
        if position >= len(stream):
            break
    assert events == ['{"a": 1}', "x\ny", "[DONE]"]


def itertools_cycle(cuts: list[int], total: int) -> list[int]:
    out: list[int] = []
    while sum(out) < total:
        out += cuts
    return out


async def test_the_openai_sdk_streams_text_and_tool_calls_from_the_fake() -> None:
    reply = ScriptedReply(
        text="Let me check that order.",
        tool_calls=(ScriptedToolCall(name="order_status", arguments='{"order": "4572"}'),),
    )
    async with FakeChatServer([reply]) as fake:
        client = openai.AsyncOpenAI(base_url=fake.url, api_key="test-key", max_retries=0)
        async with client.chat.completions.stream(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": "Where is order 4572?"}],
            tools=[
                {"type": "function", "function": {"name": "order_status", "parameters": dict(ORDER_TOOL.parameters)}}
            ],
        ) as stream:
            async for _event in stream:
                pass
            completion = await stream.get_final_completion()
        await client.close()
        assert fake.requests[0].headers["authorization"] == "Bearer test-key"
    message = completion.choices[0].message
    assert message.content == "Let me check that order."
    assert message.tool_calls is not None
    assert json.loads(message.tool_calls[0].function.arguments) == {"order": "4572"}
    assert completion.choices[0].finish_reason == "tool_calls"


async def _collect(chat: OpenAICompatibleChat, messages: tuple[ChatMessage, ...] = HISTORY) -> list[LlmEvent]:
    return [event async for event in chat.stream(messages, (ORDER_TOOL,))]


async def test_our_client_against_the_fake_records_a_valid_request_and_yields_the_reply() -> None:
    reply = ScriptedReply(text="It shipped yesterday.", token_s=0.001)
    async with FakeChatServer([reply]) as fake:
        chat = OpenAICompatibleChat(ChatConfig(url=fake.url, model="small", api_key="k"))
        events = await _collect(chat)
        await chat.aclose()
        body = dict(fake.requests[0].body)
    _strict_keys(body, REQUEST_ADAPTER.validate_python(body))
    assert body["model"] == "small" and len(body["messages"]) == 4
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "It shipped yesterday."
    assert events[-1] == LlmFinished(finish_reason="stop")


async def test_a_mid_stream_drop_and_an_http_error_are_retryable_failures() -> None:
    async with FakeChatServer(
        [ScriptedReply(text="a b c d e f", drop_after_chunks=3), ScriptedReply(status=503)]
    ) as fake:
        chat = OpenAICompatibleChat(ChatConfig(url=fake.url, model="m"))
        dropped = await _collect(chat)
        refused = await _collect(chat)
        await chat.aclose()
    assert isinstance(dropped[-1], LlmFailed) and dropped[-1].retryable
    assert [e.text for e in dropped if isinstance(e, TextDelta)] == ["a", " b"]
    assert isinstance(refused[-1], LlmFailed) and "HTTP 503" in refused[-1].message and refused[-1].retryable


async def test_a_refused_connection_is_a_retryable_failure() -> None:
    chat = OpenAICompatibleChat(ChatConfig(url="http://127.0.0.1:9/v1", model="m", connect_timeout_s=1.0))
    events = await _collect(chat)
    await chat.aclose()
    assert len(events) == 1 and isinstance(events[0], LlmFailed) and events[0].retryable


async def test_an_unauthorised_request_is_not_retryable() -> None:
    async with FakeChatServer([ScriptedReply(status=401)]) as fake:
        chat = OpenAICompatibleChat(ChatConfig(url=fake.url, model="m"))
        events = await _collect(chat)
        await chat.aclose()
    assert isinstance(events[0], LlmFailed) and not events[0].retryable


async def test_the_fake_runs_as_its_own_process_and_prints_its_url() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.providers.fakes.fake_chat",
        "--port",
        "0",
        "--reply",
        "Hi there.",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 20.0)).decode()
        url = line.removeprefix("listening ").strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        chat = OpenAICompatibleChat(ChatConfig(url=url, model="m"))
        events = await _collect(chat)
        await chat.aclose()
        assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Hi there."
    finally:
        process.terminate()
        await process.wait()
