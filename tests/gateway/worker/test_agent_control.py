"""Live call control on a real session with a fake provider: /update's tools (built-ins and webhooks) reach the
new connection, /handoff moves the call to the command's profile, and what cannot be done is refused with 409's
CommandRejectedError while the agent keeps the call."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gateway.fleet.errors import CommandRejectedError
from gateway.fleet.models import (
    AgentCommand,
    AgentUpdateRequest,
    HandoffRequest,
    ProfileModel,
    ToolModel,
    WebhookSpec,
)
from gateway.providers.base import AgentProfile, RealtimeModel
from gateway.session import CallSession
from gateway.sip.caller_context import CallContext
from gateway.worker.agent_control import command_session
from gateway.worker.legs import LegState
from tests.gateway.session.fakes import FakeCallControl, FakeClock, FakeModel, fast_config


@dataclass
class _Leg:
    session: CallSession
    id: str = "c1"
    state: LegState = LegState.ACTIVE
    context: CallContext | None = None

    @property
    def live(self) -> bool:
        return True


async def _started(model: FakeModel) -> tuple[_Leg, CallSession]:
    session = CallSession(
        call_id="c1",
        profile=AgentProfile(name="support", provider="fake"),
        model=model,
        control=FakeCallControl(),
        config=fast_config(),
        clock=FakeClock(),
    )
    await session.start()
    return _Leg(session=session, context=CallContext(call_id="c1", caller_number="+15550111")), session


async def test_update_tools_reach_the_new_connection_and_unknown_ones_are_refused() -> None:
    model = FakeModel()
    leg, session = await _started(model)
    tools = [
        ToolModel(name="hang_up"),
        ToolModel(name="lookup", description="Look up", webhook=WebhookSpec(url="https://hooks.test/lookup")),
    ]
    await command_session(leg, AgentCommand(update=AgentUpdateRequest(tools=tools)), model_for=lambda _: model)  # type: ignore[arg-type]
    assert [tool.name for tool in model.last.profile.tools] == ["hang_up", "lookup"]
    assert model.last.profile.tools[1].description == "Look up"
    unknown = AgentCommand(update=AgentUpdateRequest(tools=[ToolModel(name="nope")]))
    with pytest.raises(CommandRejectedError, match="no implementation for tool"):
        await command_session(leg, unknown, model_for=lambda _: model)  # type: ignore[arg-type]
    assert len(model.sessions) == 2 and not model.last.closed, "the agent keeps its tools and connection"
    await session.aclose()


async def test_handoff_goes_to_the_commands_profile_on_its_provider() -> None:
    support_model, billing_model = FakeModel(name="fake"), FakeModel(name="other")
    leg, session = await _started(support_model)
    models: dict[str, RealtimeModel] = {"fake": support_model, "other": billing_model}  # type: ignore[dict-item]
    target = ProfileModel(name="billing", provider="other", instructions="Billing for {caller_number}.")
    command = AgentCommand(handoff=HandoffRequest(profile="billing", reason="ops"), target=target)
    await command_session(leg, command, model_for=models.__getitem__, context=leg.context)
    assert billing_model.last.profile.instructions == 'Billing for "+15550111".'
    assert session.profile.name == "billing"
    await support_model.last.changed.until(lambda: support_model.last.closed)
    with pytest.raises(CommandRejectedError, match="has no profile"):
        await command_session(leg, AgentCommand(handoff=HandoffRequest(profile="x")), model_for=models.__getitem__)
    broken = AgentCommand(handoff=HandoffRequest(profile="gone"), target=ProfileModel(name="gone", provider="none"))
    with pytest.raises(CommandRejectedError, match="provider 'none'"):
        await command_session(leg, broken, model_for=models.__getitem__)
    assert session.profile.name == "billing"
    await session.aclose()
