"""The call-time application hook: what the control plane asks a route's application before a call is answered,
and how the answer becomes the call's admission.

A route may name an application (``application = { url = ..., timeout_s = ..., fallback = ... }`` in the routes
file). On each new call — an inbound INVITE or a browser's offer — the plane POSTs a :class:`CallHookRequest` (the
call's context) there, signed per Standard Webhooks (:mod:`gateway.control.signing`), and the answer
(:data:`CallHookAnswer`) says what to do: ``accept`` with overrides of the profile, ``reject`` with a SIP status, or
``redirect`` to a SIP URI. Both shapes are in the OpenAPI document (:data:`webhooks`).

This module is the sans-I/O half: parsing and validating an answer, applying overrides through the profile machinery
(templates checked as at load time), choosing the fallback. :mod:`gateway.control.call_hook_client` does the I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError, field_validator

from gateway.control.config import ApplicationConfig, GatewayConfig, RouteConfig
from gateway.fleet.models import AdmissionRequest, CallContextModel, CallKind, ProfileModel, ToolModel, WebhookSpec
from gateway.providers.base import PROVIDERS
from gateway.sip.caller_context import CallContext, context_from_invite, context_of_page, template_problems

MAX_ANSWER_BYTES = 64 * 1024

MetadataKey = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
MetadataValue = Annotated[str, StringConstraints(max_length=256)]
# A SIP reason phrase or URI goes on the wire as it is: no control characters (CR LF would forge a header).
_NO_CONTROLS = r"^[^\x00-\x1f\x7f]*$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CallHookRequest(_Strict):
    """What the gateway POSTs to a route's application when a call arrives, before it is answered."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={
            "examples": [
                {
                    "type": "call.incoming",
                    "call_id": "c-5f2a9d0e11aa",
                    "kind": "sip",
                    "route": "support",
                    "profile": "agent",
                    "context": {"caller_number": "+15550111", "called_number": "+15550199", "transport": "udp"},
                }
            ]
        },
    )

    type: Literal["call.incoming"] = "call.incoming"
    call_id: str = Field(description="The call's id in /v1/calls")
    kind: CallKind = Field(description="sip: an inbound INVITE; webrtc: a browser's offer")
    route: str = Field(description="The route the call matched")
    profile: str = Field(description="The route's own profile (what an accept without overrides gives)")
    context: CallContextModel = Field(description="Who is calling, whom they dialled, the kept headers")


class HookTool(_Strict):
    """A webhook tool given to the call's agent (as ``[[profiles.<name>.tools]]`` in the routes file)."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
    description: str = Field(default="", max_length=4096)
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    url: str = Field(pattern=r"^https?://", max_length=2048, description="Where the tool's calls are POSTed")
    timeout_s: float = Field(default=10.0, gt=0.0, le=300.0)

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        if value.get("type") != "object":
            raise ValueError('must be a JSON schema object: {"type": "object", "properties": {...}}')
        return value

    def to_model(self) -> ToolModel:
        return ToolModel(
            name=self.name,
            description=self.description,
            parameters=self.parameters,
            webhook=WebhookSpec(url=self.url, timeout_s=self.timeout_s),
        )


class AcceptAnswer(_Strict):
    """Answer the call, with the route's profile or another, changed by the fields given."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={
            "examples": [{"action": "accept", "profile": "vip", "instructions": "Greet {caller_number} by name."}]
        },
    )

    action: Literal["accept"]
    profile: str | None = Field(default=None, max_length=128, description="A profile of the routes file")
    instructions: str | None = Field(
        default=None, max_length=32_768, description="A template over the call's context, as in the routes file"
    )
    greeting: str | None = Field(default=None, max_length=4096, description="A template, as instructions")
    voice: str | None = Field(default=None, max_length=64)
    provider: str | None = Field(default=None, max_length=32, description="default, echo, openai, gemini, ...")
    tools: list[HookTool] | None = Field(default=None, max_length=64, description="Replace the profile's tools")
    metadata: dict[MetadataKey, MetadataValue] = Field(
        default_factory=dict, max_length=16, description="Added to the call's context ({metadata.<key>})"
    )

    @field_validator("provider")
    @classmethod
    def _known_provider(cls, value: str | None) -> str | None:
        if value is not None and value not in ("default", *PROVIDERS):
            raise ValueError(f"unknown provider {value!r} (known: default, {', '.join(PROVIDERS)})")
        return value

    @field_validator("tools")
    @classmethod
    def _unique_tools(cls, value: list[HookTool] | None) -> list[HookTool] | None:
        names = [tool.name for tool in value or ()]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"duplicate tool names: {', '.join(duplicates)}")
        return value


class RejectAnswer(_Strict):
    """Refuse the call: the SIP status and reason phrase a SIP caller gets (a browser gets 403 naming them)."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, json_schema_extra={"examples": [{"action": "reject", "status": 486}]}
    )

    action: Literal["reject"]
    status: int = Field(default=603, ge=400, le=699, description="e.g. 486 Busy Here, 603 Decline")
    reason: str = Field(default="", max_length=128, pattern=_NO_CONTROLS, description="The reason phrase")


class RedirectAnswer(_Strict):
    """Send a SIP caller elsewhere: 302 Moved Temporarily with this Contact (a browser call is refused)."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={"examples": [{"action": "redirect", "target": "sip:+15550123@pbx.example.net"}]},
    )

    action: Literal["redirect"]
    target: str = Field(pattern=r"^(sips?|tel):[^\s<>\"\x00-\x1f\x7f]+$", max_length=256)


CallHookAnswer = Annotated[AcceptAnswer | RejectAnswer | RedirectAnswer, Field(discriminator="action")]
_ANSWER: TypeAdapter[AcceptAnswer | RejectAnswer | RedirectAnswer] = TypeAdapter(CallHookAnswer)


# ------------------------------------------------------------------------------------------- decisions


class InvalidAnswerError(Exception):
    """The application's answer cannot be used; the message names what was wrong (it goes on the event stream)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HookOutcome:
    """What the call gets: ``accept`` with ``profile``; ``reject`` with ``status``/``reason`` (a SIP status);
    ``redirect`` to ``target``. ``problem``: why the route's fallback was taken (empty: the application decided)."""

    action: Literal["accept", "reject", "redirect"]
    profile: ProfileModel | None = None
    status: int = 200
    reason: str = ""
    target: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    problem: str = ""

    @property
    def fell_back(self) -> bool:
        return bool(self.problem)


def parse_answer(status: int, body: bytes) -> AcceptAnswer | RejectAnswer | RedirectAnswer:
    """The answer of an HTTP response (``status``, ``body``); InvalidAnswerError naming the problem."""
    if not 200 <= status <= 299:
        raise InvalidAnswerError(f"HTTP {status}")
    if len(body) > MAX_ANSWER_BYTES:
        raise InvalidAnswerError(f"answer of {len(body)} bytes (at most {MAX_ANSWER_BYTES})")
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise InvalidAnswerError(f"not JSON: {exc}") from None
    try:
        return _ANSWER.validate_python(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or '(answer)'}: {error['msg']}" for error in exc.errors()
        )
        raise InvalidAnswerError(f"schema: {problems}") from None


def accepted(answer: AcceptAnswer, *, route: RouteConfig, config: GatewayConfig) -> HookOutcome:
    """The profile an accept gives the call; InvalidAnswerError for an unknown profile or a bad template."""
    name = answer.profile or route.profile
    base = config.profiles.get(name)
    if base is None:
        raise InvalidAnswerError(f"profile: unknown profile {name!r} (known: {', '.join(sorted(config.profiles))})")
    policy = config.context.to_policy()
    problems = [
        f"{key}: {problem}"
        for key in ("instructions", "greeting")
        if (template := getattr(answer, key)) is not None
        for problem in template_problems(template, policy)
    ]
    if problems:
        raise InvalidAnswerError("; ".join(problems))
    updates: dict[str, Any] = {
        key: value
        for key in ("instructions", "greeting", "voice", "provider")
        if (value := getattr(answer, key)) is not None
    }
    if answer.tools is not None:
        updates["tools"] = [tool.to_model() for tool in answer.tools]
    return HookOutcome(action="accept", profile=base.model_copy(update=updates), metadata=dict(answer.metadata))


def outcome_of(
    answer: AcceptAnswer | RejectAnswer | RedirectAnswer, *, route: RouteConfig, config: GatewayConfig
) -> HookOutcome:
    if isinstance(answer, AcceptAnswer):
        return accepted(answer, route=route, config=config)
    if isinstance(answer, RejectAnswer):
        return HookOutcome(action="reject", status=answer.status, reason=answer.reason)
    return HookOutcome(action="redirect", status=302, reason="Moved Temporarily", target=answer.target)


def fallback(route: RouteConfig, config: GatewayConfig, problem: str) -> HookOutcome:
    """The route's fallback when its application failed (``problem``): its own profile, or 503."""
    application = route.application
    if application is not None and application.fallback == "reject":
        return HookOutcome(action="reject", status=503, reason="Service Unavailable", problem=problem)
    return HookOutcome(action="accept", profile=config.profile_for(route), problem=problem)


def decide(status: int, body: bytes, *, route: RouteConfig, config: GatewayConfig) -> HookOutcome:
    """The outcome of the application's HTTP answer: its decision, or the route's fallback naming the problem."""
    try:
        return outcome_of(parse_answer(status, body), route=route, config=config)
    except InvalidAnswerError as exc:
        return fallback(route, config, str(exc))


def deadline_of(application: ApplicationConfig, default_s: float) -> float:
    return application.timeout_s if application.timeout_s is not None else default_s


# ------------------------------------------------------------------------------------------------ docs

#: FastAPI's ``webhooks``: the request the gateway sends and the answers it takes, in the OpenAPI document.
webhooks = APIRouter()


@webhooks.post(
    "call.incoming",
    response_model=CallHookAnswer,
    summary="A call arrives on a route with an application",
    tags=["call-time webhook"],
)
def call_incoming(body: CallHookRequest) -> Any:  # pragma: no cover - documentation only
    """POSTed to the route's ``application.url`` before the call is answered, signed per Standard Webhooks
    (``webhook-id``, ``webhook-timestamp``, ``webhook-signature``). Answer within the deadline with one of the
    three actions; anything else (an error status, bad JSON, a schema error, no answer in time) takes the route's
    fallback and publishes ``call.hook_failed`` on ``GET /v1/events``."""


# ------------------------------------------------------------------------------------------- admission


def hook_request(
    admission: AdmissionRequest, *, call_id: str, route: RouteConfig, config: GatewayConfig
) -> CallHookRequest:
    """The body sent for ``admission``: the call's context built as the worker builds it, under ``[context]``."""
    policy = config.context.to_policy()
    invite = admission.invite
    if admission.kind == "webrtc":
        context = context_of_page(
            metadata=admission.metadata, policy=policy, call_id=call_id, route=route.name, source=admission.source
        )
    elif invite is not None:
        host, _, port = admission.source.rpartition(":")
        context = context_from_invite(
            request_uri=invite.request_uri,
            from_header=invite.from_header,
            from_display_name=invite.from_display_name,
            to_uri=invite.to_uri,
            headers=invite.headers,
            source=(host, int(port)) if port.isdigit() else (admission.source, 0),
            transport=invite.transport,
            policy=policy,
            call_id=call_id,
            route=route.name,
        )
    else:  # a worker that sends no INVITE: the numbers are all there is
        context = CallContext(
            call_id=call_id,
            route=route.name,
            source=admission.source,
            caller_number=admission.caller,
            called_number=admission.called,
        )
    return CallHookRequest(
        call_id=call_id,
        kind=admission.kind,
        route=route.name,
        profile=route.profile,
        context=CallContextModel.of(context),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """How a call the application (or its fallback) refused is answered: an admission refusal's fields."""

    status: int
    code: str
    reason: str
    contact: str = ""


def refusal(outcome: HookOutcome, kind: CallKind) -> Refusal:
    """SIP callers get the application's status (302 with Contact for a redirect); a browser gets 403 naming it,
    or 503 when the application failed and the route's fallback is to refuse."""
    if outcome.fell_back:
        return Refusal(status=503, code="application_unavailable", reason="the call-time application failed")
    if outcome.action == "redirect":
        if kind == "webrtc":
            return Refusal(
                status=403,
                code="application_redirected",
                reason=f"the application redirected the call to {outcome.target}, which a browser call cannot follow",
            )
        return Refusal(status=302, code="application_redirected", reason="Moved Temporarily", contact=outcome.target)
    if kind == "webrtc":
        said = f" ({outcome.reason})" if outcome.reason else ""
        return Refusal(
            status=403, code="application_rejected", reason=f"the application rejected the call: {outcome.status}{said}"
        )
    return Refusal(status=outcome.status, code="application_rejected", reason=outcome.reason or "Rejected")
