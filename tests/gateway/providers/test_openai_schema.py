"""The openai SDK's pydantic models are the authority on the Realtime GA event schema.

Every client event the adapter sends and every server event the fake emits must validate against
``openai.types.realtime`` (discriminated on ``type``) and carry no key the SDK does not define.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect

from gateway.providers.base import AgentProfile, HistoryItem, ToolSpec, TurnDetection
from gateway.providers.fake_server import FakeOptions, FakeRealtimeServer
from gateway.providers.openai import OpenAIConfig, OpenAIRealtimeModel
from tests.gateway.providers.helpers import (
    check_client_event,
    check_server_event,
    noise_frames,
    silent_frames,
)

pytestmark = pytest.mark.timeout(30)

HISTORY = (
    HistoryItem(kind="message", role="system", text="Caller is a customer."),
    HistoryItem(kind="message", role="user", text="Weather?"),
    HistoryItem(kind="function_call", call_id="c1", name="get_weather", arguments="{}"),
    HistoryItem(kind="function_call_output", call_id="c1", output="sunny"),
    HistoryItem(kind="message", role="assistant", text="Sunny."),
)

PROFILES = [
    AgentProfile(tools=(ToolSpec(name="get_weather", description="d"),)),
    AgentProfile(audio_format="pcmu", turn_detection=TurnDetection(kind="semantic_vad")),
    AgentProfile(audio_format="pcma", turn_detection=TurnDetection(kind="none"), voice="cedar"),
]


@pytest.mark.parametrize("profile", PROFILES, ids=["pcm-server-vad", "pcmu-semantic", "pcma-no-vad"])
async def test_every_client_event_the_adapter_sends_is_valid(profile: AgentProfile) -> None:
    async with FakeRealtimeServer(FakeOptions(tool_name="get_weather")) as fake:
        config = OpenAIConfig(url=fake.url, api_key="k", interrupt_response=True)
        session = await OpenAIRealtimeModel(config).connect(profile, history=HISTORY)
        try:
            await session.send_audio(b"".join(silent_frames(2)))
            assert session.send_audio_nowait(b"".join(silent_frames(1)))
            await session.send_text("hello")
            await session.send_text("be terse", role="system")
            await session.create_response()
            await session.create_response(instructions="Greet the caller.")
            await session.cancel_response()
            await session.truncate_item("item_x", content_index=0, audio_end_ms=120)
            await session.delete_item("item_x")
            await session.send_tool_result("c2", '{"ok":true}', name="get_weather")
            expected = 1 + len(HISTORY) + 1 + 10
            await fake.wait_until(lambda: len(fake.record(1).events) == expected)
        finally:
            await session.aclose()
        sent = fake.record(1).events
        kinds = [event["type"] for event in sent]
        assert kinds[0] == "session.update"
        assert kinds[-10:] == [
            "input_audio_buffer.append",
            "input_audio_buffer.append",
            "conversation.item.create",
            "conversation.item.create",
            "response.create",
            "response.create",
            "response.cancel",
            "conversation.item.truncate",
            "conversation.item.delete",
            "conversation.item.create",
        ]
        for event in sent:
            check_client_event(event)


Steps = list[tuple[list[dict[str, Any]], str]]


async def _drive(
    url: str, steps: Steps, *, then: Callable[[list[dict[str, Any]]], Steps] | None = None
) -> list[dict[str, Any]]:
    """Per step, send its messages on one raw websocket, then collect server events through ``until``.

    ``then`` builds further steps from what was received so far (e.g. to truncate an item by its id).
    """
    received: list[dict[str, Any]] = []
    async with asyncio.timeout(10), connect(url, compression=None, proxy=None) as ws:
        pending = list(steps)
        while pending:
            messages, until = pending.pop(0)
            for message in messages:
                await ws.send(orjson.dumps(message).decode())
            while True:
                event = orjson.loads(await ws.recv())
                received.append(event)
                if event["type"] == until:
                    break
            if not pending and then is not None:
                pending, then = then(received), None
    return received


def _after_audio(received: list[dict[str, Any]]) -> Steps:
    item_id = next(e["item_id"] for e in received if e["type"] == "response.output_audio.delta")

    def truncate(ms: int, item: str = item_id) -> dict[str, Any]:
        return {"type": "conversation.item.truncate", "item_id": item, "content_index": 0, "audio_end_ms": ms}

    return [
        ([truncate(100)], "conversation.item.truncated"),
        ([truncate(99_999)], "error"),  # already shorter than
        ([truncate(1, "nope")], "error"),
        ([{"type": "conversation.item.delete", "item_id": item_id}], "conversation.item.deleted"),
        ([{"type": "conversation.item.retrieve", "item_id": "nope"}], "error"),
        ([{"type": "response.cancel"}], "error"),  # response_cancel_not_active
        ([{"type": "input_audio_buffer.commit"}], "conversation.item.input_audio_transcription.completed"),
        ([{"type": "input_audio_buffer.clear"}], "input_audio_buffer.cleared"),
        ([{"type": "response.audio.delta"}], "error"),  # a beta name: refused
        ([{"type": "response.create", "response": {"instructions": "bye"}}], "response.done"),
    ]


def _append(frames: list[bytes]) -> list[dict[str, Any]]:
    return [{"type": "input_audio_buffer.append", "audio": base64.b64encode(f).decode()} for f in frames]


SESSION_UPDATE = {
    "type": "session.update",
    "session": {
        "type": "realtime",
        "instructions": "x",
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": 24000},
                "turn_detection": {"type": "server_vad", "silence_duration_ms": 200, "interrupt_response": True},
                "transcription": {"model": "gpt-4o-mini-transcribe"},
            },
            "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "marin"},
        },
    },
}


@pytest.mark.parametrize("mode", ["echo", "tone", "speech-like"])
async def test_every_server_event_the_fake_emits_is_valid(mode: str) -> None:
    # Paced, so the second response.create surely lands while the first response is still playing.
    options = FakeOptions(mode=mode, reply_ms=300, paced=True, tool_name="lookup", tool_arguments='{"q":1}')  # type: ignore[arg-type]
    async with FakeRealtimeServer(options) as fake:
        turn = silent_frames(5) + noise_frames(10, seed=5) + silent_frames(12)
        user_text = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
        tool_output = {"type": "function_call_output", "call_id": "call_1_1", "output": "42"}
        steps: list[tuple[list[dict[str, Any]], str]] = [
            ([SESSION_UPDATE], "session.updated"),
            (_append(turn), "response.done"),  # the scripted tool call
            ([{"type": "conversation.item.create", "item": tool_output}], "conversation.item.done"),
            ([{"type": "conversation.item.create", "item": user_text}], "conversation.item.done"),
            ([{"type": "response.create"}], "response.created"),
            ([{"type": "response.create"}], "error"),  # conversation_already_has_active_response
            ([], "response.done"),
        ]
        received = await _drive(fake.url, steps, then=_after_audio)
    kinds = {e["type"] for e in received}
    kinds = {e["type"] for e in received}
    for expected in (
        "session.created",
        "session.updated",
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "input_audio_buffer.cleared",
        "conversation.item.added",
        "conversation.item.done",
        "conversation.item.input_audio_transcription.completed",
        "conversation.item.truncated",
        "conversation.item.deleted",
        "response.created",
        "response.output_item.added",
        "response.output_item.done",
        "response.function_call_arguments.done",
        "response.output_audio.delta",
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.done",
        "error",
    ):
        assert expected in kinds
    codes = {e["error"]["code"] for e in received if e["type"] == "error"}
    assert codes == {
        "conversation_already_has_active_response",
        "invalid_value",
        "item_truncate_invalid_item_id",
        "item_retrieve_invalid_item_id",
        "response_cancel_not_active",
    }
    for event in received:
        check_server_event(event)


async def test_cancelled_response_and_expiry_events_are_valid() -> None:
    options = FakeOptions(mode="tone", reply_ms=5000, paced=True, chunk_ms=20)
    async with FakeRealtimeServer(options) as fake:
        received: list[dict[str, Any]] = []
        async with connect(fake.url, compression=None, proxy=None) as ws:
            await ws.send(orjson.dumps({"type": "response.create"}).decode())
            while True:
                event = orjson.loads(await ws.recv())
                received.append(event)
                if event["type"] == "response.output_audio.delta":
                    break
            await ws.send(orjson.dumps({"type": "response.cancel"}).decode())
            while event["type"] != "response.done":
                event = orjson.loads(await ws.recv())
                received.append(event)
            assert event["response"]["status"] == "cancelled"
            await fake.expire(1)
            async for raw in ws:
                received.append(orjson.loads(raw))
            assert ws.close_code == 1001
    assert received[-1]["error"]["code"] == "session_expired"
    for event in received:
        check_server_event(event)
