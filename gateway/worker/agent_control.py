"""Live call control of a call's agent: say, inject, update, handoff (POST /v1/calls/{id}/say|inject|update|handoff).

Owns the translation from the fleet's :class:`AgentCommand` to the call's session, and from the session's
state errors to the fleet's: a call whose agent is not up (still ringing, resuming, ending) answers
CommandRejectedError (409 with the reason), an unknown call was already CallNotFoundError (404) in the registry.
A handoff or an update that cannot be made (unknown tool, the new provider refuses) is refused the same way;
the call keeps its agent.
"""

from __future__ import annotations

from dataclasses import replace

from gateway.fleet.errors import CommandRejectedError
from gateway.fleet.models import AgentCommand, AgentUpdateRequest, ProfileModel, ToolModel
from gateway.providers.base import AgentProfile, ToolSpec
from gateway.session.config import WebhookToolConfig
from gateway.session.errors import HandoffError, ProfileUpdateError, SessionStateError
from gateway.session.session import CallSession
from gateway.sip.caller_context import CallContext
from gateway.worker.handoffs import ModelFor, ProfileHandoffs, webhook_tools
from gateway.worker.legs import Leg


async def command_session(
    leg: Leg, command: AgentCommand, *, model_for: ModelFor, context: CallContext | None = None
) -> None:
    """Carry out ``command`` on ``leg``'s session; CommandRejectedError naming why it cannot."""
    session = leg.session
    if session is None or not leg.live:
        raise CommandRejectedError(f"call {leg.id}: its agent is not up ({leg.state.value})")
    try:
        if command.say is not None:
            session.say(command.say.text, interrupt=command.say.interrupt)
        elif command.inject is not None:
            inject = command.inject
            session.inject(inject.text, role=inject.role, respond=inject.respond)
        elif command.update is not None:
            await _update(session, command.update, context)
        elif command.handoff is not None:
            if command.target is None:
                raise CommandRejectedError(f"call {leg.id}: the handoff to {command.handoff.profile!r} has no profile")
            targets = ProfileHandoffs({}, context=context, model_for=model_for)
            target = targets.target(command.target)
            await session.hand_off(target, reason=command.handoff.reason, initiator="api")
    except (SessionStateError, ProfileUpdateError, HandoffError) as exc:
        raise CommandRejectedError(f"call {leg.id}: {exc}") from None


async def _update(session: CallSession, update: AgentUpdateRequest, context: CallContext | None) -> None:
    profile: AgentProfile = session.profile
    tools = update.tools
    await session.update_profile(
        replace(
            profile,
            instructions=update.instructions if update.instructions is not None else profile.instructions,
            voice=update.voice if update.voice is not None else profile.voice,
            tools=profile.tools if tools is None else tuple(_spec(tool) for tool in tools),
        ),
        webhook_tools=None if tools is None else _webhooks(tools, context),
    )


def _spec(tool: ToolModel) -> ToolSpec:
    return ToolSpec(name=tool.name, description=tool.description, parameters=tool.parameters)


def _webhooks(tools: list[ToolModel], context: CallContext | None) -> tuple[WebhookToolConfig, ...] | None:
    """The update's webhook tools (a registry of their own), or None: its tools are the current registry's."""
    found = webhook_tools(ProfileModel(tools=tools), context)
    return found or None
