"""Tools the agent may call: the Tool protocol, the registry that resolves a profile's tools, the built-ins
(``hang_up``, ``transfer``, ``send_dtmf``, ``hold_caller``, ``resume_caller``, ``warm_transfer``, and the
conversational briefing's ``connect_caller`` and ``decline_transfer``) and HTTP webhook tools.

A tool returns its output as text (JSON by convention). It raises :class:`ToolError` for a failure the agent
should be told about; the session turns that, any other exception and a timeout into ``{"error": ...}`` output
(see :mod:`gateway.session.toolrunner`). Webhook tools POST ``{call_id, tool_call_id, name, arguments}`` and send
the provider's call id as ``Idempotency-Key`` so a server can deduplicate too.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
from opentelemetry.trace import Status, StatusCode

from gateway.providers.base import ToolSpec
from gateway.session.config import SessionConfig, WebhookToolConfig
from gateway.session.control import BriefingControl, CallControl
from gateway.session.errors import ToolResolutionError
from gateway.tracing import client_span

_DTMF_DIGITS = re.compile(r"^[0-9*#A-Da-d]{1,32}$")


class ToolError(Exception):
    """A tool failed in a way the agent should hear about (the message becomes ``{"error": message}``)."""


class ToolActions(Protocol):
    """What a tool may do to its call."""

    @property
    def control(self) -> CallControl: ...

    async def wait_agent_quiet(self, timeout_s: float) -> bool:
        """Wait (bounded) until the agent's current audio has been played out; False on timeout."""
        ...

    def end_call(self, reason: str) -> None:
        """Hang up and end the session (asynchronously; safe from inside the tool's own task)."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolInvocation:
    session_id: str  # the telephone call
    call_id: str  # the provider's tool call id
    name: str
    arguments: Mapping[str, Any]
    actions: ToolActions


class Tool(Protocol):
    @property
    def spec(self) -> ToolSpec: ...

    @property
    def background_ok(self) -> bool:
        """True when a slow run may be promoted to the background after the grace period."""
        ...

    async def run(self, invocation: ToolInvocation) -> str: ...


def _ok(**fields: Any) -> str:
    return json.dumps({"ok": True, **fields})


class HangUpTool:
    """Ends the call once the agent's current audio has been played (bounded by ``drain_timeout_s``)."""

    background_ok = False

    def __init__(self, *, drain_timeout_s: float) -> None:
        self._drain_timeout_s = drain_timeout_s
        self.spec = ToolSpec(
            name="hang_up",
            description="End the phone call. Say goodbye first; the call ends when you have finished speaking.",
            parameters={
                "type": "object",
                "properties": {"reason": {"type": "string", "description": "Why the call ends."}},
            },
        )

    async def run(self, invocation: ToolInvocation) -> str:
        await invocation.actions.wait_agent_quiet(self._drain_timeout_s)
        invocation.actions.end_call("agent_hang_up")
        return _ok(status="ending", reason=str(invocation.arguments.get("reason") or ""))


class TransferTool:
    """Blind-transfers the caller; when the transfer is refused or fails the call is hung up with that reason."""

    background_ok = False

    def __init__(self, *, allowed_targets: tuple[str, ...], drain_timeout_s: float) -> None:
        self._allowed = allowed_targets
        self._drain_timeout_s = drain_timeout_s
        target: dict[str, Any] = {"type": "string", "description": "Number or SIP URI to transfer the caller to."}
        if allowed_targets:
            target["enum"] = list(allowed_targets)
        self.spec = ToolSpec(
            name="transfer",
            description="Transfer the caller to another number or person. Tell the caller before you do.",
            parameters={"type": "object", "properties": {"target": target}, "required": ["target"]},
        )

    async def run(self, invocation: ToolInvocation) -> str:
        target = str(invocation.arguments.get("target") or "").strip()
        if not target:
            raise ToolError("transfer needs a target")
        if self._allowed and target not in self._allowed:
            raise ToolError(f"transfer target {target!r} is not allowed; allowed: {', '.join(self._allowed)}")
        actions = invocation.actions
        await actions.wait_agent_quiet(self._drain_timeout_s)
        outcome = await actions.control.transfer(target)
        if outcome.status == "accepted":
            actions.end_call("transferred")
            return _ok(status="transferred", target=target)
        actions.end_call(f"transfer_{outcome.status}")
        return json.dumps({"error": f"transfer {outcome.status}", "sip_status": outcome.sip_status})


class SendDtmfTool:
    """Plays DTMF digits to the caller (RFC 4733), e.g. to drive an IVR on the other side."""

    background_ok = False

    def __init__(self) -> None:
        self.spec = ToolSpec(
            name="send_dtmf",
            description="Send keypad tones (0-9, *, #, A-D) on the call.",
            parameters={
                "type": "object",
                "properties": {"digits": {"type": "string", "pattern": "^[0-9*#A-D]+$"}},
                "required": ["digits"],
            },
        )

    async def run(self, invocation: ToolInvocation) -> str:
        digits = str(invocation.arguments.get("digits") or "")
        if not _DTMF_DIGITS.match(digits):
            raise ToolError(f"digits must be 1-32 of 0-9 * # A-D, got {digits!r}")
        await invocation.actions.control.send_dtmf(digits.upper())
        return _ok(status="sent", digits=digits.upper())


class HoldTool:
    """``hold_caller``: the caller is put on hold with the hold audio once the agent has finished speaking (the
    agent keeps working; what it says meanwhile plays after the resume); ``resume_caller`` takes them off it."""

    background_ok = False

    def __init__(self, *, held: bool, drain_timeout_s: float) -> None:
        self._held = held
        self._drain_timeout_s = drain_timeout_s
        description = (
            "Put the caller on hold (they hear hold music and cannot hear you) while you work on something for "
            "them. Tell them first. Call resume_caller to take them off hold."
            if held
            else "Take the caller off hold: they hear you again."
        )
        self.spec = ToolSpec(
            name="hold_caller" if held else "resume_caller",
            description=description,
            parameters={"type": "object", "properties": {}},
        )

    async def run(self, invocation: ToolInvocation) -> str:
        if self._held:
            await invocation.actions.wait_agent_quiet(self._drain_timeout_s)
        await invocation.actions.control.hold(self._held)
        return _ok(status="held" if self._held else "resumed")


class WarmTransferTool:
    """``warm_transfer``: a human is dialled and briefed while the caller waits on hold, then joined with the caller,
    and the agent leaves the call (gateway/worker/warm.py). Returns once the human's phone rings; if they are not
    reached, the caller comes back and the agent is told with a note."""

    background_ok = False

    def __init__(self, *, allowed_targets: tuple[str, ...], drain_timeout_s: float) -> None:
        self._allowed = allowed_targets
        self._drain_timeout_s = drain_timeout_s
        target: dict[str, Any] = {
            "type": "string",
            "description": "Number, SIP URI or queue name of the person to bring in.",
        }
        if allowed_targets:
            target["enum"] = list(allowed_targets)
        summary = {
            "type": "string",
            "description": "What the person should know before they take the call: who the caller is, what they "
            "need, what was done. Said to them before the caller is connected.",
        }
        briefing = {
            "type": "string",
            "enum": ["spoken", "conversation"],
            "description": "spoken: the summary is said to them, then the caller is connected; conversation: they "
            "can ask about the call first, and may decline it (you are then told why). Default: the gateway's.",
        }
        self.spec = ToolSpec(
            name="warm_transfer",
            description="Bring a human colleague into the call: the caller waits on hold while you brief them, then "
            "the two are connected and you leave the call. Tell the caller first.",
            parameters={
                "type": "object",
                "properties": {"target": target, "summary": summary, "briefing": briefing},
                "required": ["target", "summary"],
            },
        )

    async def run(self, invocation: ToolInvocation) -> str:
        target = str(invocation.arguments.get("target") or "").strip()
        summary = str(invocation.arguments.get("summary") or "").strip()
        if not target:
            raise ToolError("warm_transfer needs a target")
        if self._allowed and target not in self._allowed:
            raise ToolError(f"warm_transfer target {target!r} is not allowed; allowed: {', '.join(self._allowed)}")
        briefing = invocation.arguments.get("briefing")
        if briefing not in (None, "", "spoken", "conversation"):
            raise ToolError(f"warm_transfer briefing is spoken or conversation, not {briefing!r}")
        actions = invocation.actions
        await actions.wait_agent_quiet(self._drain_timeout_s)
        started = await actions.control.warm_transfer(
            target, summary[:2000], "conversation" if briefing == "conversation" else "spoken" if briefing else None
        )
        if started.status != "dialling":
            raise ToolError(f"warm transfer refused: {started.detail}")
        return _ok(status="dialling", transfer_id=started.transfer_id, target=target)


class BriefingTool:
    """A conversational warm-transfer briefing's end, on the human's leg (gateway/worker/warm.py):
    ``connect_caller`` joins the waiting caller once the agent has finished speaking; ``decline_transfer(reason)``
    gives the caller back to their agent, who is told the reason, and ends the human's call."""

    background_ok = False

    def __init__(self, *, connect: bool, drain_timeout_s: float) -> None:
        self._connect = connect
        self._drain_timeout_s = drain_timeout_s
        if connect:
            self.spec = ToolSpec(
                name="connect_caller",
                description="Connect the waiting caller to your colleague now; you leave the call. Say so first.",
                parameters={"type": "object", "properties": {}},
            )
        else:
            reason = {"type": "string", "description": "Why the colleague won't take the call, in their words."}
            self.spec = ToolSpec(
                name="decline_transfer",
                description="Your colleague won't take the call: the caller goes back to their agent, who is told "
                "the reason, and this call ends. Acknowledge it first.",
                parameters={"type": "object", "properties": {"reason": reason}, "required": ["reason"]},
            )

    async def run(self, invocation: ToolInvocation) -> str:
        control = invocation.actions.control
        if not isinstance(control, BriefingControl):
            raise ToolError(f"{self.spec.name}: this call is not a warm transfer's briefing")
        reason = str(invocation.arguments.get("reason") or "").strip()
        await invocation.actions.wait_agent_quiet(self._drain_timeout_s)
        refused = await control.end_briefing(connect=self._connect, reason=reason)
        if refused:
            raise ToolError(refused)
        return _ok(status="connecting" if self._connect else "declined")


class WebhookTool:
    """A tool served over HTTP (POST JSON); any non-2xx answer is a ToolError."""

    def __init__(self, config: WebhookToolConfig, client: _SharedClient) -> None:
        self._config = config
        self._client = client
        self.background_ok = config.background
        self.spec = ToolSpec(name=config.name, description=config.description, parameters=config.parameters)

    async def run(self, invocation: ToolInvocation) -> str:
        config = self._config
        headers = {"Idempotency-Key": invocation.call_id}
        if config.auth_header is not None:
            headers[config.auth_header[0]] = config.auth_header[1]
        body: dict[str, Any] = {
            "call_id": invocation.session_id,
            "tool_call_id": invocation.call_id,
            "name": config.name,
            "arguments": dict(invocation.arguments),
        }
        if config.context:
            body["context"] = dict(config.context)
        url = httpx.URL(config.url)
        try:
            # httpx enforces its timeout in the network layer only; the outer bound covers everything.
            # The span (under the tool's, when the call is traced) puts its traceparent in the headers.
            with client_span(
                "POST",
                headers,
                {
                    "http.request.method": "POST",
                    "url.full": str(url.copy_with(query=None, fragment=None, username=None, password=None)),
                    "server.address": url.host,
                    "gateway.tool.name": config.name,
                },
            ) as span:
                async with asyncio.timeout(config.timeout_s):
                    response = await self._client.get().post(
                        config.url, json=body, headers=headers, timeout=config.timeout_s
                    )
                if span is not None:
                    span.set_attribute("http.response.status_code", response.status_code)
                    if not response.is_success:
                        span.set_status(Status(StatusCode.ERROR, f"HTTP {response.status_code}"))
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise ToolError(f"{config.name} timed out after {config.timeout_s:g} s") from exc
        except httpx.HTTPError as exc:
            raise ToolError(f"{config.name} could not be reached: {type(exc).__name__}") from exc
        if not response.is_success:
            raise ToolError(f"{config.name} answered HTTP {response.status_code}")
        text = response.text
        try:
            json.loads(text)
        except ValueError:
            return json.dumps({"result": text})
        return text


class _SharedClient:
    """One lazily created httpx.AsyncClient for all webhook tools of a registry."""

    def __init__(self, transport: httpx.AsyncBaseTransport | None) -> None:
        self._transport = transport
        self._client: httpx.AsyncClient | None = None

    def get(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(transport=self._transport, follow_redirects=False)
        return self._client

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


class ToolRegistry:
    """Tool implementations by name. A registry may serve many calls; its owner closes it."""

    def __init__(
        self,
        tools: Iterable[Tool] = (),
        *,
        webhooks: Iterable[WebhookToolConfig] = (),
        http_transport: httpx.AsyncBaseTransport | None = None,
        opt_in: Iterable[str] = (),
    ) -> None:
        self._client = _SharedClient(http_transport)
        self._tools: dict[str, Tool] = {}
        self._opt_in = frozenset(opt_in)  # offered only to profiles that name them
        for tool in [*tools, *(WebhookTool(config, self._client) for config in webhooks)]:
            if tool.spec.name in self._tools:
                raise ToolResolutionError(f"two tools are named {tool.spec.name!r}")
            self._tools[tool.spec.name] = tool

    @classmethod
    def from_config(
        cls,
        config: SessionConfig,
        *,
        extra: Iterable[Tool] = (),
        http_transport: httpx.AsyncBaseTransport | None = None,
    ) -> ToolRegistry:
        """The built-ins, the config's webhook tools and ``extra``."""
        builtins: list[Tool] = [
            HangUpTool(drain_timeout_s=config.hangup_drain_timeout_s),
            TransferTool(allowed_targets=config.transfer_targets, drain_timeout_s=config.hangup_drain_timeout_s),
            SendDtmfTool(),
            HoldTool(held=True, drain_timeout_s=config.hangup_drain_timeout_s),
            HoldTool(held=False, drain_timeout_s=config.hangup_drain_timeout_s),
            WarmTransferTool(allowed_targets=config.transfer_targets, drain_timeout_s=config.hangup_drain_timeout_s),
            BriefingTool(connect=True, drain_timeout_s=config.hangup_drain_timeout_s),
            BriefingTool(connect=False, drain_timeout_s=config.hangup_drain_timeout_s),
        ]
        # An agent holds callers, or brings a human in, only where its profile says so (tools = hold_caller, ...);
        # a conversational briefing's agent is given connect_caller and decline_transfer (gateway/worker/warm.py).
        opt_in = ("hold_caller", "resume_caller", "warm_transfer", "connect_caller", "decline_transfer")
        return cls([*builtins, *extra], webhooks=config.webhook_tools, http_transport=http_transport, opt_in=opt_in)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._tools)

    def resolve(self, wanted: Iterable[ToolSpec]) -> tuple[ToolSpec, ...]:
        """The specs to offer the provider: every registered tool but the opt-in ones when ``wanted`` is empty,
        else exactly those named, with the implementation's parameters (a profile's non-empty description wins).
        Raises ToolResolutionError for unknown or repeated names."""
        wanted = tuple(wanted)
        if not wanted:
            return tuple(tool.spec for name, tool in self._tools.items() if name not in self._opt_in)
        missing = [spec.name for spec in wanted if spec.name not in self._tools]
        if missing:
            raise ToolResolutionError(f"no implementation for tool(s): {', '.join(missing)}")
        names = [spec.name for spec in wanted]
        if len(set(names)) != len(names):
            raise ToolResolutionError(f"a profile lists a tool twice: {names}")
        return tuple(
            ToolSpec(
                name=spec.name,
                description=spec.description or self._tools[spec.name].spec.description,
                parameters=self._tools[spec.name].spec.parameters,
            )
            for spec in wanted
        )

    async def aclose(self) -> None:
        await self._client.aclose()
