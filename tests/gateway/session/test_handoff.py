"""Agent handoffs over the session core with fake providers: the transition (old agent -> new agent with the
conversation replayed), failure partway (the old agent keeps the call and is told), a tool call running across
the handoff (its result reaches the new agent as a message, never as a function output), API handoffs to
another provider kind, and resumes after a handoff."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway.providers.base import (
    AgentProfile,
    Capabilities,
    HistoryItem,
    ToolCallRequested,
    ToolSpec,
    TranscriptReceived,
    handoff_tool_name,
)
from gateway.providers.errors import ProviderConnectError
from gateway.session import CallSession
from gateway.session.errors import HandoffError, HandoffRefusedError, SessionStateError
from gateway.session.events import HandedOff, HandoffFailed, HandoffStarted, Resumed
from gateway.session.handoff import HandoffTarget
from gateway.session.state import CallState
from gateway.session.tools import ToolRegistry
from tests.gateway.session.fakes import (
    FakeCallControl,
    FakeClock,
    FakeModel,
    FakeRealtimeSession,
    call_tasks,
    drained,
    fast_config,
    of_type,
    tone_frame,
    wait_event,
)
from tests.gateway.session.test_tools import SlowTool

SUPPORT = AgentProfile(name="support", instructions="You are support.", handoffs=("billing",))
BILLING = AgentProfile(name="billing", instructions="You are billing.", voice="ash", handoffs=("support",))


class Targets:
    """The worker's side of the port: profiles by name, each served by its own fake model."""

    def __init__(self, **targets: HandoffTarget) -> None:
        self.targets = targets
        self.asked: list[str] = []

    def resolve(self, name: str) -> HandoffTarget:
        self.asked.append(name)
        target = self.targets.get(name)
        if target is None:
            raise HandoffRefusedError(f"no profile {name!r}")
        return target


def _session(
    model: FakeModel,
    targets: Targets,
    *,
    tools: ToolRegistry | None = None,
    profile: AgentProfile = SUPPORT,
    seen: list[object] | None = None,
) -> CallSession:
    return CallSession(
        on_handoff=None if seen is None else seen.append,
        call_id="c1",
        profile=profile,
        model=model,
        control=FakeCallControl(),
        config=fast_config(),
        tools=tools,
        clock=FakeClock(),
        handoffs=targets,
    )


def _conversation(fake: FakeRealtimeSession) -> None:
    fake.emit(
        TranscriptReceived(role="user", item_id="u1", text="I was charged twice.", final=True),
        TranscriptReceived(role="assistant", item_id="a1", text="Let me get billing for you.", final=True),
    )


def _texts(history: tuple[HistoryItem, ...]) -> list[tuple[str, str]]:
    return [(item.role, item.text) for item in history if item.kind == "message"]


async def test_the_agent_hands_off_and_the_new_agent_gets_the_conversation() -> None:
    support_model, billing_model = FakeModel(name="openai"), FakeModel(name="gemini")
    seen: list[object] = []
    targets = Targets(billing=HandoffTarget(profile=BILLING, model=billing_model))
    session = _session(support_model, targets, seen=seen)
    await session.start()
    old = support_model.last
    tool = next(t for t in old.profile.tools if t.name == "transfer_to_billing")
    assert tool.parameters["required"] == ["reason"], "each handoff is declared to the provider as a tool"
    _conversation(old)
    old.emit(ToolCallRequested(call_id="h1", name="transfer_to_billing", arguments='{"reason": "double charge"}'))
    handed = await wait_event(session, of_type(HandedOff))
    assert isinstance(handed, HandedOff) and (handed.from_profile, handed.to_profile) == ("support", "billing")
    assert handed.initiator == "agent" and handed.reason == "double charge" and handed.epoch == 2
    new = billing_model.last
    assert new.profile.instructions == "You are billing." and new.profile.voice == "ash"
    assert [t.name for t in new.profile.tools if t.name.startswith("transfer_to_")] == ["transfer_to_support"]
    texts = _texts(new.history)
    assert texts[:2] == [("user", "I was charged twice."), ("assistant", "Let me get billing for you.")]
    assert texts[-1][0] == "system" and "billing agent" in texts[-1][1] and "double charge" in texts[-1][1]
    assert all(item.kind == "message" for item in new.history), "the handoff call itself is not replayed"
    await new.wait_sent(lambda s: [e for e in s if e[0] == "create_response"])
    await old.changed.until(lambda: old.closed)
    assert old.of("tool_result") == [] and new.of("tool_result") == [], "nobody gets the handoff's output"
    assert session.profile.name == "billing" and session.state is CallState.ACTIVE
    session.push_inbound(tone_frame(0))
    await new.wait_sent(lambda s: [e for e in s if e[0] == "audio"])  # the caller's audio goes to the new agent
    lines = session.handoff_lines
    assert [(line.from_profile, line.to_profile, line.ok) for line in lines] == [("support", "billing", True)]
    assert [type(event) for event in seen] == [HandoffStarted, HandedOff], "the worker is told, in order"
    assert session.handoffs == 1, "and it is counted"
    await session.aclose()
    assert call_tasks() == []


async def test_a_provider_that_refuses_keeps_the_old_agent_and_tells_the_model() -> None:
    support_model, billing_model = FakeModel(), FakeModel()
    billing_model.script.append(ProviderConnectError("billing is down", retryable=False))
    session = _session(support_model, Targets(billing=HandoffTarget(profile=BILLING, model=billing_model)))
    await session.start()
    old = support_model.last
    old.emit(ToolCallRequested(call_id="h1", name="transfer_to_billing", arguments='{"reason": "x"}'))
    failed = await wait_event(session, of_type(HandoffFailed))
    assert isinstance(failed, HandoffFailed) and "billing is down" in failed.error
    await old.wait_sent(lambda s: [e for e in s if e[0] == "tool_result"])
    (_, call_id, output, _name) = old.of("tool_result")[0]
    assert call_id == "h1" and "the handoff to billing failed" in json.loads(output)["error"]
    assert session.profile.name == "support" and not old.closed and billing_model.sessions == []
    session.push_inbound(tone_frame(0))
    await old.wait_sent(lambda s: [e for e in s if e[0] == "audio"])
    assert [line.ok for line in session.handoff_lines] == [False]
    await session.aclose()
    assert call_tasks() == []


async def test_an_unknown_target_or_one_not_listed_is_refused_without_connecting() -> None:
    support_model, other_model = FakeModel(), FakeModel()
    other = HandoffTarget(profile=AgentProfile(name="sales"), model=other_model)
    session = _session(support_model, Targets(sales=other))
    await session.start()
    old = support_model.last
    old.emit(ToolCallRequested(call_id="h1", name="transfer_to_billing", arguments="{}"))
    await old.wait_sent(lambda s: [e for e in s if e[0] == "tool_result"])
    assert "no profile 'billing'" in json.loads(old.of("tool_result")[0][2])["error"]
    old.emit(ToolCallRequested(call_id="h2", name="transfer_to_sales", arguments="{}"))
    await old.wait_sent(lambda s: len([e for e in s if e[0] == "tool_result"]) == 2)
    assert "unknown tool 'transfer_to_sales'" in json.loads(old.of("tool_result")[1][2])["error"]
    assert other_model.connect_calls == [] and session.profile.name == "support"
    await session.aclose()


async def test_a_tool_running_during_the_handoff_reports_to_the_new_agent_as_a_message() -> None:
    slow = SlowTool("lookup", background_ok=False)
    registry = ToolRegistry([slow])
    support = AgentProfile(name="support", tools=(ToolSpec(name="lookup"),), handoffs=("billing",))
    billing = AgentProfile(name="billing", tools=(ToolSpec(name="lookup"),))
    support_model, billing_model = FakeModel(), FakeModel()
    session = _session(
        support_model,
        Targets(billing=HandoffTarget(profile=billing, model=billing_model)),
        tools=registry,
        profile=support,
    )
    await session.start()
    old = support_model.last
    old.emit(ToolCallRequested(call_id="t1", name="lookup", arguments='{"order": "42"}'))
    await asyncio.wait_for(slow.started.wait(), 5)
    old.emit(ToolCallRequested(call_id="h1", name="transfer_to_billing", arguments='{"reason": "refund"}'))
    await wait_event(session, of_type(HandedOff))
    new = billing_model.last
    replayed = _texts(new.history)
    assert ("system", 'Earlier, the agent called the tool lookup with {"order": "42"}.') in replayed
    assert not [item for item in new.history if item.kind != "message"], "no function item of the old agent"
    slow.release.set()
    result = await new.wait_sent(lambda s: [e for e in s if e[0] == "text" and "lookup" in e[1]])
    assert result[0][2] == "system" and '"order": "42"' in result[0][1] and "before the handoff" in result[0][1]
    assert new.of("tool_result") == [] and old.of("tool_result") == []
    assert slow.runs == 1
    transcript = [(e.kind, e.text) for e in session.transcript]
    assert ("message", result[0][1]) in transcript, "the result is in the conversation a resume replays"
    await session.aclose()
    assert call_tasks() == []


async def test_api_handoff_to_another_provider_kind_and_resume_on_it() -> None:
    support_model = FakeModel(name="openai", capabilities=Capabilities(max_connection_s=3600.0))
    gemini_model = FakeModel(name="gemini", capabilities=Capabilities(truncate=False, resume_handle=True))
    session = _session(support_model, Targets())
    await session.start()
    old = support_model.last
    _conversation(old)
    old.emit(ToolCallRequested(call_id="t0", name="send_dtmf", arguments='{"digits": "1"}'))
    await old.wait_sent(lambda s: [e for e in s if e[0] == "tool_result"])
    await drained(session, old)
    target = HandoffTarget(profile=BILLING, model=gemini_model)
    await session.hand_off(target, reason="operator")
    started = await wait_event(session, of_type(HandoffStarted))
    assert isinstance(started, HandoffStarted) and started.initiator == "api"
    new = gemini_model.last
    assert ("system", "The earlier send_dtmf call returned: " + old.of("tool_result")[0][2]) in _texts(new.history)
    new.drop("network")
    await wait_event(session, of_type(Resumed))
    assert len(gemini_model.sessions) == 2 and len(support_model.sessions) == 1, "resumes stay on the new provider"
    resumed = gemini_model.last
    assert resumed.profile.name == "billing"
    assert not [item for item in resumed.history if item.kind != "message"], "old calls stay retired on resume"
    assert any("billing agent" in text for _, text in _texts(resumed.history))
    await session.aclose()
    assert call_tasks() == []


async def test_handoff_is_refused_unless_the_call_is_active_and_a_failed_connect_raises() -> None:
    support_model, billing_model = FakeModel(), FakeModel()
    session = _session(support_model, Targets())
    target = HandoffTarget(profile=BILLING, model=billing_model)
    with pytest.raises(SessionStateError, match="cannot hand off while connecting"):
        await session.hand_off(target)
    await session.start()
    billing_model.script.append(ProviderConnectError("refused", retryable=False))
    with pytest.raises(HandoffError, match="handoff to 'billing' failed"):
        await session.hand_off(target, reason="test")
    assert session.profile.name == "support"
    await session.aclose()
    with pytest.raises(SessionStateError):
        await session.hand_off(target)


def test_handoff_tool_names_are_valid_function_names() -> None:
    assert handoff_tool_name("billing") == "transfer_to_billing"
    assert handoff_tool_name("de.billing team") == "transfer_to_de_billing_team"
    assert len(handoff_tool_name("x" * 100)) == 64
