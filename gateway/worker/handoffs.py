"""The worker's side of agent handoffs: profiles (wire form) made into the session's HandoffTargets.

A call's profile carries every profile reachable through its ``handoffs`` (``ProfileModel.handoff_profiles``,
filled by the control plane's config), so the agent's ``transfer_to_<name>`` resolves here without asking the
control plane; the ops API's handoff sends its target profile with the command. A target is rendered with the
call's context like the call's first profile, and served by the worker's model for its provider.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, replace
from typing import Any

from gateway.fleet.models import ProfileModel, WorkerEventType
from gateway.providers.base import AgentProfile, RealtimeModel
from gateway.session.config import WebhookToolConfig
from gateway.session.errors import HandoffRefusedError
from gateway.session.events import HandedOff, HandoffFailed, HandoffStarted
from gateway.session.handoff import HandoffTarget
from gateway.sip.caller_context import CallContext, render

ModelFor = Callable[[str], RealtimeModel]
HandoffEvent = HandoffStarted | HandedOff | HandoffFailed


def rendered_profile(model: ProfileModel, context: CallContext | None) -> AgentProfile:
    """The agent profile of ``model`` for this call: instructions and greeting rendered with its context."""
    agent = model.to_agent_profile()
    if context is None:
        return agent
    return replace(
        agent,
        instructions=render(agent.instructions, context),
        greeting=render(agent.greeting, context),
        call_context=context.as_parameters(),
    )


def webhook_tools(model: ProfileModel, context: CallContext | None) -> tuple[WebhookToolConfig, ...]:
    """The profile's webhook tools, each request carrying the call's context."""
    return tuple(
        WebhookToolConfig(
            name=tool.name,
            url=tool.webhook.url,
            description=tool.description,
            parameters=tool.parameters,
            timeout_s=tool.webhook.timeout_s,
            auth_header=("Authorization", tool.webhook.auth_header) if tool.webhook.auth_header else None,
            context=context.as_json() if context is not None else {},
        )
        for tool in model.tools
        if tool.webhook is not None
    )


class ProfileHandoffs:
    """HandoffTargets over the profiles a call may be handed to (gateway/session/handoff.py)."""

    def __init__(
        self, profiles: Mapping[str, ProfileModel], *, context: CallContext | None, model_for: ModelFor
    ) -> None:
        self._profiles = profiles
        self._context = context
        self._model_for = model_for

    def resolve(self, name: str) -> HandoffTarget:
        profile = self._profiles.get(name)
        if profile is None:
            raise HandoffRefusedError(f"no profile {name!r} to hand off to")
        return self.target(profile)

    def target(self, profile: ProfileModel) -> HandoffTarget:
        """``profile`` ready to take the call; its own handoffs resolve against its own reachable profiles."""
        agent = rendered_profile(profile, self._context)
        try:
            model = self._model_for(agent.provider)
        except Exception as exc:  # the factory's errors (ProviderConfigError, a bad setting) refuse this handoff only
            raise HandoffRefusedError(f"profile {profile.name!r}: provider {agent.provider!r}: {exc!r}") from None
        onward = None
        if profile.handoff_profiles:
            onward = ProfileHandoffs(profile.handoff_profiles, context=self._context, model_for=self._model_for)
        return HandoffTarget(
            profile=agent, model=model, webhook_tools=webhook_tools(profile, self._context), targets=onward
        )


_EVENT_TYPES: dict[type[HandoffEvent], WorkerEventType] = {
    HandoffStarted: "agent.handoff_started",
    HandedOff: "agent.handed_off",
    HandoffFailed: "agent.handoff_failed",
}


def handoff_report(event: HandoffEvent) -> tuple[WorkerEventType, dict[str, Any]]:
    """The event type on the control plane's stream and its data (the session event's fields)."""
    return _EVENT_TYPES[type(event)], asdict(event)
