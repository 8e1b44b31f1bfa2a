"""The rule agent answers through the ChatModel events and calls the session core's own tools."""

from __future__ import annotations

import json

import pytest

from gateway.providers.base import ToolSpec
from gateway.providers.pipeline.local.rules import RuleAgent, RuleAgentConfig, digits_in
from gateway.providers.pipeline.ports import ChatMessage, LlmEvent, LlmFinished, TextDelta, ToolCallDone
from gateway.session.config import SessionConfig
from gateway.session.tools import ToolRegistry


def _core_tools(**config: object) -> tuple[ToolSpec, ...]:
    """The specs the session core offers a provider: its built-ins (hang_up, transfer, send_dtmf)."""
    return ToolRegistry.from_config(SessionConfig(**config)).resolve(())  # type: ignore[arg-type]


async def _ask(agent: RuleAgent, said: str | None, tools: tuple[ToolSpec, ...] = ()) -> list[LlmEvent]:
    history = [ChatMessage(role="system", content="Be brief.")]
    if said is not None:
        history.append(ChatMessage(role="user", content=said))
    return [event async for event in agent.stream(history, tools or _core_tools())]


async def test_plain_speech_is_repeated() -> None:
    events = await _ask(RuleAgent(), "I would like to check my order status.")
    assert events == [TextDelta(text="You said: I would like to check my order status."), LlmFinished()]


async def test_no_caller_turn_yet_is_the_greeting() -> None:
    events = await _ask(RuleAgent(RuleAgentConfig(greeting="Hi there.")), None)
    assert events == [TextDelta(text="Hi there."), LlmFinished()]


@pytest.mark.parametrize("said", ["Thank you very much, goodbye.", "OK bye", "That's all, thanks", "Good bye."])
async def test_goodbye_calls_the_cores_end_call_tool(said: str) -> None:
    events = await _ask(RuleAgent(), said)
    assert events[0] == TextDelta(text="Goodbye, thank you for calling.")
    assert isinstance(events[1], ToolCallDone)
    call = events[1].call
    assert call.name == "hang_up" and call.name in {spec.name for spec in _core_tools()}
    assert json.loads(call.arguments) == {"reason": "the caller said goodbye"}
    assert events[2] == LlmFinished(finish_reason="tool_calls")


@pytest.mark.parametrize("said", ["Can you transfer me to a human agent please?", "A human please", "Operator!"])
async def test_asking_for_a_person_calls_the_transfer_tool(said: str) -> None:
    tools = _core_tools(transfer_targets=("sip:desk@example.invalid", "sip:other@example.invalid"))
    events = await _ask(RuleAgent(), said, tools)
    assert events[0] == TextDelta(text="Let me transfer you to a person.")
    assert isinstance(events[1], ToolCallDone)
    assert events[1].call.name == "transfer"
    assert json.loads(events[1].call.arguments) == {"target": "sip:desk@example.invalid"}  # the first allowed
    assert events[2] == LlmFinished(finish_reason="tool_calls")


async def test_a_configured_transfer_target_wins_and_a_missing_tool_means_words_only() -> None:
    agent = RuleAgent(RuleAgentConfig(transfer_target="+15550100"))
    events = await _ask(agent, "human please")
    assert isinstance(events[1], ToolCallDone)
    assert json.loads(events[1].call.arguments) == {"target": "+15550100"}
    only_dtmf = tuple(spec for spec in _core_tools() if spec.name == "send_dtmf")
    assert await _ask(agent, "goodbye", only_dtmf) == [
        TextDelta(text="Goodbye, thank you for calling."),
        LlmFinished(),
    ]


async def test_tool_call_ids_are_unique() -> None:
    agent = RuleAgent()
    ids = set()
    for _ in range(3):
        events = await _ask(agent, "bye")
        assert isinstance(events[1], ToolCallDone)
        ids.add(events[1].call.call_id)
    assert len(ids) == 3


async def test_digits_are_read_back() -> None:
    assert await _ask(RuleAgent(), "My order number is 4572.") == [
        TextDelta(text="I heard four, five, seven, two."),
        LlmFinished(),
    ]
    assert digits_in("five five five one two three four") == list("5551234")
    assert digits_in("oh I see, two oh one") == ["2", "0", "1"]


async def test_after_a_tool_result_it_acknowledges_or_apologises() -> None:
    agent = RuleAgent()
    history = [ChatMessage(role="user", content="bye"), ChatMessage(role="tool", content='{"ok": true}')]
    assert [e async for e in agent.stream(history, ())] == [TextDelta(text="Done."), LlmFinished()]
    failed = [*history[:1], ChatMessage(role="tool", content='{"error": "transfer rejected"}')]
    assert [e async for e in agent.stream(failed, ())] == [TextDelta(text="Sorry, that did not work."), LlmFinished()]
