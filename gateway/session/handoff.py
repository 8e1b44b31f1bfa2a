"""Agent handoffs: moving a live call from one agent profile to another, keeping the conversation.

A profile lists the profiles it may hand the caller to (``AgentProfile.handoffs``); each becomes a tool the
model can call, ``transfer_to_<name>`` with a ``reason``. The ops API hands off too. What this module owns:

- :class:`HandoffTarget` (a resolved profile with the model that serves it and its webhook tools) and the
  :class:`HandoffTargets` port the worker implements to resolve a name the agent asked for.
- :class:`Handoffs`, the per-call bookkeeping the session consults: the tools of the current agent (handoff
  tools first, then the agent's registry), which tool calls belong to a previous agent ("retired"), how the
  transcript is replayed to a new agent, and the handoffs made so far.

Rules (the session applies them; see CallSession.hand_off):
- All or nothing. The new provider session is connected while the old agent keeps the call; only a connected
  session replaces it. A refused target, an unresolvable tool or a failed connect leaves the old agent in place
  and, for a handoff the model asked for, its tool output says the handoff failed.
- A tool call keeps the agent it started under. Once a handoff succeeds every function call seen so far is
  retired: replayed to the new agent as a system message rather than a function item, and its output, when it
  comes, is given to the new agent as a system message, never as a function_call_output for a tool it may not
  have. The handoff tool call itself is replayed as nothing: the closing note says what happened.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

from gateway.providers.base import AgentProfile, HistoryItem, RealtimeModel, ToolSpec, handoff_tool_name
from gateway.session.config import SessionConfig, WebhookToolConfig
from gateway.session.errors import HandoffRefusedError
from gateway.session.events import HandedOff, HandoffFailed, HandoffStarted
from gateway.session.tools import Tool, ToolError, ToolInvocation, ToolRegistry

HandoffInitiator = Literal["agent", "api"]


@dataclass(frozen=True, slots=True, kw_only=True)
class HandoffTarget:
    """A profile ready to take a call: rendered for this call, the model that serves its provider, and the
    webhook tools it brings (built into a registry of its own when the session owns its registry)."""

    profile: AgentProfile
    model: RealtimeModel
    webhook_tools: tuple[WebhookToolConfig, ...] = ()
    # Resolves the new agent's own handoffs; None keeps the call's resolver.
    targets: HandoffTargets | None = None


class HandoffTargets(Protocol):
    """Resolves a profile name the agent asked for; HandoffRefusedError names why it cannot."""

    def resolve(self, name: str) -> HandoffTarget: ...


class NoHandoffTargets:
    """The default: no profile to hand off to."""

    def resolve(self, name: str) -> HandoffTarget:
        raise HandoffRefusedError(f"no profile {name!r} to hand off to")


@dataclass(frozen=True, slots=True, kw_only=True)
class HandoffLine:
    """One handoff of the call, as the call's record keeps it (``at_s``: seconds into the call)."""

    at_s: float
    from_profile: str
    to_profile: str
    reason: str
    initiator: HandoffInitiator
    ok: bool
    error: str = ""


#: Told of each handoff event as it is recorded (the worker reports them to the control plane). Must not block.
HandoffObserver = Callable[["HandoffStarted | HandedOff | HandoffFailed"], None]


def _not_observed(event: HandoffStarted | HandedOff | HandoffFailed) -> None:
    pass


#: ``(target name, reason, tool call id) -> tool output``: what a handoff tool asks of its session.
Perform = Callable[[str, str, str], Awaitable[str]]


class HandoffTool:
    """``transfer_to_<name>``: asks the session to hand the caller to ``name``; the output says how it went."""

    background_ok = False

    def __init__(self, target: str, perform: Perform) -> None:
        self.target = target
        self._perform = perform
        self.spec = ToolSpec(
            name=handoff_tool_name(target),
            description=f"Hand the caller over to the {target} agent, who takes the conversation from here. "
            "Tell the caller first.",
            parameters={
                "type": "object",
                "properties": {"reason": {"type": "string", "description": "Why the caller is handed over."}},
                "required": ["reason"],
            },
        )

    async def run(self, invocation: ToolInvocation) -> str:
        reason = str(invocation.arguments.get("reason") or "").strip()[:500]
        return await self._perform(self.target, reason, invocation.call_id)


def _failed_perform(target: str, reason: str, call_id: str) -> Awaitable[str]:
    raise ToolError("the call has ended")


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingHandoff:
    """A handoff under way: who to whom and why, the calls it will retire, the handoff's own tool call, and the
    note the new agent is given; it makes the handoff's events and its line in the record."""

    from_profile: str
    to_profile: str
    reason: str
    initiator: HandoffInitiator
    calls: frozenset[str] = frozenset()
    initiator_call: str = ""
    note: str = ""

    @property
    def names(self) -> tuple[str, str]:
        return self.from_profile, self.to_profile

    def started(self) -> HandoffStarted:
        return HandoffStarted(
            from_profile=self.from_profile, to_profile=self.to_profile, reason=self.reason, initiator=self.initiator
        )

    def handed_off(self, epoch: int) -> HandedOff:
        return HandedOff(
            from_profile=self.from_profile,
            to_profile=self.to_profile,
            reason=self.reason,
            initiator=self.initiator,
            epoch=epoch,
        )

    def failed(self, error: str) -> HandoffFailed:
        return HandoffFailed(
            from_profile=self.from_profile,
            to_profile=self.to_profile,
            reason=self.reason,
            initiator=self.initiator,
            error=error,
        )

    def line(self, at_s: float, *, error: str | None = None) -> HandoffLine:
        """Its line in the call's record: ok unless ``error``."""
        return HandoffLine(
            at_s=at_s,
            from_profile=self.from_profile,
            to_profile=self.to_profile,
            reason=self.reason,
            initiator=self.initiator,
            ok=error is None,
            error=error or "",
        )


@dataclass(slots=True, kw_only=True)
class Handoffs:
    """Handoff bookkeeping of one call (see the module docstring)."""

    registry: ToolRegistry  # the current agent's registry
    targets: HandoffTargets
    config: SessionConfig
    owns_registries: bool  # the session built its registry: a target's webhook tools get a registry of their own
    perform: Perform = _failed_perform
    observer: HandoffObserver = _not_observed
    lines: list[HandoffLine] = field(default_factory=list)
    _current: Mapping[str, HandoffTool] = field(default_factory=dict)
    _retired: set[str] = field(default_factory=set)
    _dropped_outputs: set[str] = field(default_factory=set)
    _opened: list[ToolRegistry] = field(default_factory=list)

    # ------------------------------------------------------------------------------- current agent

    def get(self, name: str) -> Tool | None:
        """The tool runner's lookup: the current agent's handoff tools, then its registry."""
        tool = self._current.get(name)
        return tool if tool is not None else self.registry.get(name)

    def tools_for(self, profile: AgentProfile, registry: ToolRegistry) -> tuple[ToolSpec, ...]:
        """What ``profile`` declares to its provider: its resolved tools and one handoff tool per target."""
        specs = registry.resolve(profile.tools)
        names = {spec.name for spec in specs}
        for target in profile.handoffs:
            name = handoff_tool_name(target)
            if name in names:
                raise HandoffRefusedError(f"profile {profile.name!r}: a tool is already named {name!r}")
            names.add(name)
        return (*specs, *(HandoffTool(t, self.perform).spec for t in profile.handoffs))

    def adopt(self, profile: AgentProfile, registry: ToolRegistry, targets: HandoffTargets | None = None) -> None:
        """``profile`` now has the call: its handoff tools are the ones the runner finds."""
        self.registry = registry
        if targets is not None:
            self.targets = targets
        self._current = {handoff_tool_name(t): HandoffTool(t, self._perform_now) for t in profile.handoffs}

    async def _perform_now(self, target: str, reason: str, call_id: str) -> str:
        return await self.perform(target, reason, call_id)

    def registry_for(self, webhook_tools: tuple[WebhookToolConfig, ...]) -> ToolRegistry:
        """The registry of an agent with ``webhook_tools``: the current one, or a new one when it brings webhook
        tools (and the session owns its registries)."""
        if not webhook_tools or not self.owns_registries:
            return self.registry
        registry = ToolRegistry.from_config(replace(self.config, webhook_tools=webhook_tools))
        self._opened.append(registry)
        return registry

    # -------------------------------------------------------------------------------- transitions

    def prepare(
        self,
        transcript_calls: Iterable[str],
        *,
        from_profile: str,
        target: AgentProfile,
        reason: str,
        initiator: HandoffInitiator,
        call_id: str,
    ) -> PendingHandoff:
        """What a handoff will retire and the closing note the new agent is given."""
        note = (
            f"You are now the {target.name} agent and take this phone call over from the {from_profile} agent"
            + (f" (reason: {reason})" if reason else "")
            + ". The conversation so far is above. Do not greet the caller again; continue from here."
        )
        return PendingHandoff(
            from_profile=from_profile,
            to_profile=target.name,
            reason=reason,
            initiator=initiator,
            calls=frozenset(transcript_calls),
            initiator_call=call_id,
            note=note,
        )

    def replay(self, items: tuple[HistoryItem, ...], pending: PendingHandoff | None = None) -> tuple[HistoryItem, ...]:
        """The transcript as a new agent gets it: calls of previous agents (and those ``pending`` retires) as
        system messages, the handoff call itself left out."""
        retired = self._retired | (pending.calls if pending is not None else frozenset())
        skip = {pending.initiator_call} if pending is not None and pending.initiator_call else set()
        skip |= self._dropped_outputs
        names: dict[str, str] = {}
        out: list[HistoryItem] = []
        for item in items:
            if item.kind == "message" or item.call_id not in retired:
                out.append(item)
            elif item.call_id in skip:
                continue
            elif item.kind == "function_call":
                names[item.call_id] = item.name
                out.append(_system(f"Earlier, the agent called the tool {item.name} with {item.arguments or '{}'}."))
            else:
                name = names.get(item.call_id, "tool")
                out.append(_system(f"The earlier {name} call returned: {item.output}"))
        return tuple(out)

    def commit(self, pending: PendingHandoff) -> None:
        """The new agent has the call."""
        self._retired |= pending.calls
        if pending.initiator_call:
            self._retired.add(pending.initiator_call)
            self._dropped_outputs.add(pending.initiator_call)

    # ---------------------------------------------------------------------------------- outputs

    def retired_output(self, call_id: str, name: str, output: str) -> str | None:
        """None when the output goes to the provider as a function output; else the text the current agent is
        given instead ("" for nothing: the handoff call's own output, which the closing note replaces)."""
        if call_id not in self._retired:
            return None
        if call_id in self._dropped_outputs:
            return ""
        return f"Result of the earlier {name} request (tool call {call_id}), made before the handoff: {output}"

    def record(self, line: HandoffLine) -> None:
        self.lines.append(line)

    def release(self) -> None:
        """The call has ended: drop the session's callback (reference cycles: ADR 0006)."""
        self.perform = _failed_perform
        self.observer = _not_observed

    async def aclose(self) -> None:
        opened, self._opened = self._opened, []
        for registry in opened:
            await registry.aclose()


def _system(text: str) -> HistoryItem:
    return HistoryItem(kind="message", role="system", text=text)


def handoff_output(*, ok: bool, target: str, error: str = "") -> str:
    """The handoff tool's output: on failure, what the (old) agent is told."""
    if ok:
        return json.dumps({"ok": True, "handed_off_to": target})
    return json.dumps({"error": f"the handoff to {target} failed: {error}. You keep the call; tell the caller."})
