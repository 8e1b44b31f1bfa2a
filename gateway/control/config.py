"""Routes, agent profiles and limits: ONE TOML file (``GATEWAY_CONFIG``), validated at start-up.

Routes are tried in file order; the first whose pattern matches the called number (DID) wins:

* ``did = "+15550199"``  exact match
* ``did = "+1555*"``     prefix (a trailing ``*``; ``"*"`` alone matches every number)
* ``did_regex = "^\\+44(20|161)"``  Python regular expression, searched in the number (anchor it yourself)

A profile's ``instructions`` and ``greeting`` are templates over the call's context (``{caller_number}``,
``{headers.X-Account}``: the names of :mod:`gateway.sip.caller_context`); ``[context]`` names the headers
a call keeps and the trunks whose asserted identity is believed. An unknown name fails the load.

``[trunks.<name>]`` declares the trunks (gateway/fleet/trunks.py; the workers read the same tables); a route's
``trunk`` names the one its outbound calls take (``default``: the workers' ``GATEWAY_TRUNK_*`` settings).

Each route names a profile (``[profiles.<name>]``, the fields of
:class:`gateway.providers.base.AgentProfile`, plus webhook tools) and may cap its own concurrent calls.
Every problem is reported as ``<file>: <key>: <problem>``, all of them at once, before anything starts.
Without ``GATEWAY_CONFIG`` the built-in config routes every number to one profile whose provider is
``default``: the worker's ``GATEWAY_PROVIDER`` (the echo agent unless set).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gateway.control.webhook_events import WEBHOOK_EVENT_TYPES, WebhookEventType
from gateway.fleet.models import (
    BotModel,
    ComponentModel,
    ContextPolicyModel,
    EarlyMediaModel,
    GuardrailModel,
    PipelineModel,
    ProfileModel,
    ReferPolicyModel,
    ToolModel,
    TurnDetectionModel,
    WebhookSpec,
)
from gateway.fleet.trunks import DEFAULT_TRUNK, TRUNK_NAME, TrunkConfig
from gateway.providers.base import handoff_tool_name
from gateway.sip.caller_context import template_problems

DEFAULT_SOURCE = "<built-in config>"


class ConfigError(Exception):
    """The config file is missing, not TOML, or invalid. The message names the file, the key and the problem."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LimitsConfig(_Section):
    max_calls: int = Field(default=1000, ge=0, description="Concurrent calls over the whole fleet")
    retry_after_s: int = Field(default=5, ge=1, le=3600, description="Retry-After sent with 503")


class FleetConfig(_Section):
    heartbeat_interval_s: float = Field(default=2.0, gt=0.0, le=60.0)
    lost_after_missed: int = Field(default=3, ge=1, le=100, description="Missed heartbeats before 'lost'")
    forget_after_s: float = Field(default=600.0, gt=0.0, description="Lost/gone workers are dropped after this")
    admitted_grace_s: float = Field(
        default=10.0, gt=0.0, description="An admitted call absent from its worker's heartbeats is released after this"
    )
    event_ring_size: int = Field(default=2000, ge=10, le=1_000_000)
    ended_call_retention: int = Field(default=1000, ge=0, le=1_000_000)
    sse_keepalive_s: float = Field(default=15.0, gt=0.0, le=300.0)

    @property
    def lost_after_s(self) -> float:
        return self.heartbeat_interval_s * self.lost_after_missed


class ToolConfig(_Section):
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    url: str | None = Field(default=None, pattern=r"^https?://", description="Webhook URL (absent: built-in tool)")
    timeout_s: float = Field(default=10.0, gt=0.0, le=300.0)
    auth_header: str = Field(default="", repr=False)

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        if value.get("type") != "object":
            raise ValueError('must be a JSON schema object: {type = "object", properties = {...}}')
        return value


class ComponentConfig(BaseModel):
    """``stt = { name = "deepgram", model = "nova-3", language = "en" }``: a name and that component's options."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = Field(min_length=1, max_length=64)

    @model_validator(mode="after")
    def _scalar_options(self) -> ComponentConfig:
        for key, value in (self.model_extra or {}).items():
            if not isinstance(value, str | int | float | bool):
                raise ValueError(f"option {key} must be a string, number or boolean")
        return self

    def to_model(self) -> ComponentModel:
        return ComponentModel(name=self.name, options=dict(self.model_extra or {}))


class PipelineConfig(_Section):
    """``[profiles.<name>.pipeline]``: the components of the ``pipeline`` provider and its turn-taking knobs."""

    stt: ComponentConfig
    llm: ComponentConfig
    tts: ComponentConfig
    vad: ComponentConfig = Field(default_factory=lambda: ComponentConfig(name="energy"))
    onset_ms: int = Field(default=60, ge=0, le=2000)
    endpoint_ms: int = Field(default=500, gt=0, le=10_000)
    max_endpoint_ms: int = Field(default=3000, gt=0, le=30_000)
    min_interrupt_ms: int = Field(default=400, ge=0, le=5000)
    false_interrupt_ms: int = Field(default=1500, gt=0, le=10_000)

    def to_model(self) -> PipelineModel:
        return PipelineModel(
            stt=self.stt.to_model(),
            llm=self.llm.to_model(),
            tts=self.tts.to_model(),
            vad=self.vad.to_model(),
            onset_ms=self.onset_ms,
            endpoint_ms=self.endpoint_ms,
            max_endpoint_ms=self.max_endpoint_ms,
            min_interrupt_ms=self.min_interrupt_ms,
            false_interrupt_ms=self.false_interrupt_ms,
        )


class ProfileConfig(_Section):
    # "default" means the worker's GATEWAY_PROVIDER (echo unless set), so one variable switches the agent.
    provider: str = Field(default="default", min_length=1)
    model: str = ""
    voice: str = ""
    instructions: str = "You are a helpful voice agent on a phone call. Be brief."
    greeting: str = ""
    tools: list[ToolConfig] = Field(default_factory=list)
    turn_detection: TurnDetectionModel = Field(default_factory=TurnDetectionModel)
    max_duration_s: float = Field(default=3600.0, gt=0.0, le=86_400.0)
    audio_format: Literal["pcm24k", "pcmu", "pcma"] = "pcm24k"
    pipeline: PipelineConfig | None = None
    # provider "websocket": the bot's url, wire audio and customParameters ([profiles.<name>.bot]).
    bot: BotModel | None = None
    # AMD's greeting words from a recogniser of its own: amd_stt = { name = "whisper" } (ProfileModel.amd_stt).
    amd_stt: ComponentConfig | None = None
    # Caller no-input: what each means is ProfileModel's description of it (gateway/fleet/models.py).
    no_input_prompt_s: float = Field(default=0.0, ge=0.0, le=3600.0)
    no_input_hangup_s: float = Field(default=0.0, ge=0.0, le=3600.0)
    no_input_prompt: str = Field(default=ProfileModel.model_fields["no_input_prompt"].default, max_length=500)
    no_input_goodbye: str = Field(default=ProfileModel.model_fields["no_input_goodbye"].default, max_length=500)
    # Output guardrails ([[profiles.<name>.guardrails]]) and how often they check the agent's transcript.
    guardrails: list[GuardrailModel] = Field(default_factory=list)
    guardrail_every_chars: int = Field(default=40, ge=1, le=10_000)
    # Recordings (docs/operations.md#recordings): which sides, in which format and rate, after which notice.
    record: Literal["off", "caller", "agent", "both"] = "off"
    record_format: Literal["wav", "ogg"] = "wav"
    record_sample_rate: Literal[8000, 16000, 24000, 48000] = 16000
    record_notice: str = Field(default="", max_length=1024)
    # Profiles this agent may hand the caller to: each becomes the tool transfer_to_<name>.
    handoffs: list[str] = Field(default_factory=list, max_length=32)

    @model_validator(mode="after")
    def _unique_tools(self) -> ProfileConfig:
        for kind, names in (
            ("tool", [tool.name for tool in self.tools]),
            ("guardrail", [guardrail.name for guardrail in self.guardrails]),
        ):
            duplicates = sorted({name for name in names if names.count(name) > 1})
            if duplicates:
                raise ValueError(f"duplicate {kind} names: {', '.join(duplicates)}")
        return self

    def to_model(self, name: str) -> ProfileModel:
        tools = [
            ToolModel(
                name=tool.name,
                description=tool.description,
                parameters=tool.parameters,
                webhook=WebhookSpec(url=tool.url, timeout_s=tool.timeout_s, auth_header=tool.auth_header)
                if tool.url
                else None,
            )
            for tool in self.tools
        ]
        return ProfileModel(
            name=name,
            provider=self.provider,
            model=self.model,
            voice=self.voice,
            instructions=self.instructions,
            greeting=self.greeting,
            tools=tools,
            turn_detection=self.turn_detection,
            max_duration_s=self.max_duration_s,
            audio_format=self.audio_format,
            pipeline=self.pipeline.to_model() if self.pipeline is not None else None,
            bot=self.bot,
            amd_stt=self.amd_stt.to_model() if self.amd_stt is not None else None,
            no_input_prompt_s=self.no_input_prompt_s,
            no_input_hangup_s=self.no_input_hangup_s,
            no_input_prompt=self.no_input_prompt,
            no_input_goodbye=self.no_input_goodbye,
            guardrails=self.guardrails,
            guardrail_every_chars=self.guardrail_every_chars,
            record=self.record,
            record_format=self.record_format,
            record_sample_rate=self.record_sample_rate,
            record_notice=self.record_notice,
            handoffs=list(self.handoffs),
        )


class ApplicationConfig(_Section):
    """``application = { url = "https://...", timeout_s = 2, fallback = "profile" }``: the route's call-time
    application, asked before each call is answered (:mod:`gateway.control.call_hook`)."""

    url: str = Field(pattern=r"^https?://", max_length=2048, description="Where each new call's context is POSTed")
    timeout_s: float | None = Field(
        default=None, gt=0.0, le=4.0, description="Deadline of the answer; unset: GATEWAY_CALL_HOOK_TIMEOUT_S"
    )
    fallback: Literal["profile", "reject"] = Field(
        default="profile",
        description="When the application is slow, down or answers badly: the route's own profile, or 503",
    )


class RouteConfig(_Section):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")
    did: str | None = Field(default=None, min_length=1, max_length=256)
    did_regex: str | None = Field(default=None, min_length=1, max_length=1024)
    profile: str = Field(min_length=1)
    max_calls: int | None = Field(default=None, ge=0, description="Concurrent calls on this route")
    webrtc_public: bool = Field(default=False, description="Browsers may call this route without the API token")
    record: Literal["off", "caller", "agent", "both"] | None = Field(
        default=None, description="Overrides the profile's record for this route's calls"
    )
    application: ApplicationConfig | None = Field(default=None, description="The call-time application")
    trunk: str | None = Field(
        default=None, pattern=TRUNK_NAME, description="The trunk its outbound calls take (unset: default)"
    )
    early_media: Literal["off", "tone", "greeting"] = Field(
        default="off",
        description="Inbound: 183 with early media before the 200 OK: a tone (or early_media_file), or the agent's "
        "greeting (docs/operations.md, Early media)",
    )
    early_media_s: float = Field(
        default=3.0,
        gt=0,
        le=60,
        description="tone: how long it plays before the 200 OK; greeting: the longest the greeting may take",
    )
    early_media_file: str = Field(
        default="", max_length=1024, description="tone: an audio file (any format FFmpeg reads) instead of ringback"
    )

    def early_media_model(self) -> EarlyMediaModel | None:
        if self.early_media == "off":
            return None
        return EarlyMediaModel(mode=self.early_media, seconds=self.early_media_s, file=self.early_media_file)

    refer: Literal["off", "accept"] = Field(
        default="off",
        description="A peer's REFER (transferring the call to a third party): off declines it with 603; accept places "
        "the new call and moves the agent onto it (docs/operations.md, Incoming REFER)",
    )
    refer_allow: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="With refer = accept: shell-style patterns the Refer-To URI or its host must match "
        "(sip:*@pbx.example.com, 10.0.0.*); empty: any target",
    )

    @field_validator("did_regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a valid regular expression: {exc}") from exc
        return value

    @model_validator(mode="after")
    def _one_pattern(self) -> RouteConfig:
        if (self.did is None) == (self.did_regex is None):
            raise ValueError("give exactly one of did (exact or prefix*) and did_regex")
        return self

    def refer_policy(self) -> ReferPolicyModel:
        return ReferPolicyModel(mode=self.refer, allow=tuple(self.refer_allow))

    def matches(self, number: str) -> bool:
        if self.did_regex is not None:
            return re.search(self.did_regex, number) is not None
        assert self.did is not None
        if self.did.endswith("*"):
            return number.startswith(self.did[:-1])
        return number == self.did


class WebhookEndpointConfig(_Section):
    """An application subscribed to event webhooks (``[[webhooks]]``): docs/operations.md, "Event webhooks"."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="Names the endpoint in the deliveries log")
    url: str = Field(pattern=r"^https?://", max_length=2048)
    secret: str = Field(default="", repr=False, description="Signs its requests; empty: GATEWAY_WEBHOOK_SECRET")
    events: list[WebhookEventType] = Field(default_factory=lambda: list(WEBHOOK_EVENT_TYPES), min_length=1)


class _ConfigFile(_Section):
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    fleet: FleetConfig = Field(default_factory=FleetConfig)
    routes: list[RouteConfig] = Field(default_factory=list)
    profiles: dict[str, ProfileConfig] = Field(default_factory=dict)
    context: ContextPolicyModel = Field(default_factory=ContextPolicyModel)
    webhooks: list[WebhookEndpointConfig] = Field(default_factory=list)
    trunks: dict[str, TrunkConfig] = Field(default_factory=dict)


class GatewayConfig:
    """The validated config: limits, fleet timing, routes in order, profiles by name (frozen)."""

    def __init__(self, parsed: _ConfigFile, source: str) -> None:
        self.source = source
        self.limits = parsed.limits
        self.fleet = parsed.fleet
        self.routes: tuple[RouteConfig, ...] = tuple(parsed.routes)
        self.context = parsed.context
        self.webhooks: tuple[WebhookEndpointConfig, ...] = tuple(parsed.webhooks)
        flat = {
            name: p.to_model(name).model_copy(update={"context": parsed.context}) for name, p in parsed.profiles.items()
        }
        self.profiles: dict[str, ProfileModel] = {
            name: model.model_copy(update={"handoff_profiles": _reachable(name, flat)}) for name, model in flat.items()
        }
        self._routes_by_name = {route.name: route for route in self.routes}
        self.trunks: dict[str, TrunkConfig] = dict(parsed.trunks)

    def knows_trunk(self, name: str) -> bool:
        """A trunk of the file's, or ``default`` (the workers' GATEWAY_TRUNK_* settings, which the plane does not
        see: a worker without it refuses the call)."""
        return name in self.trunks or name == DEFAULT_TRUNK

    def resolve(self, called: str) -> RouteConfig | None:
        """The first route whose pattern matches ``called``."""
        for route in self.routes:
            if route.matches(called):
                return route
        return None

    def route_named(self, name: str) -> RouteConfig | None:
        return self._routes_by_name.get(name)

    def profile_for(self, route: RouteConfig) -> ProfileModel:
        profile = self.profiles[route.profile]
        if route.record is not None and route.record != profile.record:
            return profile.model_copy(update={"record": route.record})
        return profile


def _reachable(name: str, profiles: dict[str, ProfileModel]) -> dict[str, ProfileModel]:
    """Every profile ``name`` can hand a call to, directly or through others (the worker resolves them)."""
    seen: dict[str, ProfileModel] = {}
    todo = list(profiles[name].handoffs)
    while todo:
        target = todo.pop()
        if target not in seen and target in profiles:
            seen[target] = profiles[target]
            todo.extend(profiles[target].handoffs)
    return dict(sorted(seen.items()))


def _handoff_problems(name: str, profile: ProfileConfig, known: dict[str, ProfileConfig]) -> list[str]:
    problems: list[str] = []
    tools = {tool.name for tool in profile.tools}
    made: dict[str, str] = {}
    for target in profile.handoffs:
        if target not in known:
            problems.append(f"unknown profile {target!r} (known: {', '.join(sorted(known))})")
        elif target == name:
            problems.append(f"a profile cannot hand off to itself ({target!r})")
        tool = handoff_tool_name(target)
        if tool in tools:
            problems.append(f"the handoff to {target!r} is the tool {tool!r}, which the profile already has")
        elif tool in made:
            problems.append(f"{made[tool]!r} and {target!r} are both the tool {tool!r}")
        made[tool] = target
    return problems


def _trunk_problems(parsed: _ConfigFile, source: str) -> list[str]:
    problems = [
        f"{source}: trunks.{name}: a trunk name is 1-64 of letters, digits, '._-'"
        for name in parsed.trunks
        if not re.fullmatch(TRUNK_NAME, name)
    ]
    known = ", ".join(sorted({*parsed.trunks, DEFAULT_TRUNK}))
    for index, route in enumerate(parsed.routes):
        if route.trunk is not None and route.trunk not in parsed.trunks and route.trunk != DEFAULT_TRUNK:
            problems.append(f"{source}: routes[{index}].trunk: unknown trunk {route.trunk!r} (known: {known})")
    return problems


def _key(location: tuple[int | str, ...]) -> str:
    key = ""
    for part in location:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return key or "(top level)"


def _problem(message: str) -> str:
    return message.removeprefix("Value error, ")


def parse_config(data: dict[str, Any], source: str) -> GatewayConfig:
    """Validate a parsed TOML document; raise ConfigError listing every problem."""
    try:
        parsed = _ConfigFile.model_validate(data)
    except ValidationError as exc:
        lines = [f"{source}: {_key(e['loc'])}: {_problem(e['msg'])}" for e in exc.errors()]
        raise ConfigError("invalid config:\n  " + "\n  ".join(lines)) from None
    problems: list[str] = []
    if not parsed.routes:
        problems.append(f"{source}: routes: at least one [[routes]] entry is needed")
    seen: set[str] = set()
    for index, route in enumerate(parsed.routes):
        if route.name in seen:
            problems.append(f"{source}: routes[{index}].name: duplicate route name {route.name!r}")
        seen.add(route.name)
        if route.profile not in parsed.profiles:
            known = ", ".join(sorted(parsed.profiles)) or "none defined"
            problems.append(f"{source}: routes[{index}].profile: unknown profile {route.profile!r} (known: {known})")
    problems += _trunk_problems(parsed, source)
    names = [endpoint.name for endpoint in parsed.webhooks]
    problems += [f"{source}: webhooks: duplicate endpoint name {n!r}" for n in sorted(set(names)) if names.count(n) > 1]
    policy = parsed.context.to_policy()
    for name, profile in parsed.profiles.items():
        problems += [
            f"{source}: profiles.{name}.handoffs: {p}" for p in _handoff_problems(name, profile, parsed.profiles)
        ]
        for key in ("instructions", "greeting"):
            problems += [
                f"{source}: profiles.{name}.{key}: {p}" for p in template_problems(getattr(profile, key), policy)
            ]
        if profile.pipeline is not None:
            from gateway.providers.pipeline.components import problems as pipeline_problems

            spec = profile.pipeline.to_model().to_spec()
            problems += [f"{source}: profiles.{name}.pipeline.{p}" for p in pipeline_problems(spec)]
        if profile.amd_stt is not None:
            from gateway.providers.pipeline.components import component_problems

            stt = profile.amd_stt.to_model().to_spec()
            problems += [f"{source}: profiles.{name}.amd_stt: {p}" for p in component_problems("stt", stt)]
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
    return GatewayConfig(parsed, source)


def load_config(path: str | Path | None) -> GatewayConfig:
    """Load ``path`` (TOML), or the built-in echo config when ``path`` is None or empty."""
    if not path:
        return default_config()
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read the config file: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    return parse_config(data, str(file))


def default_config() -> GatewayConfig:
    return parse_config(
        {
            "routes": [{"name": "default", "did": "*", "profile": "echo", "webrtc_public": True}],
            "profiles": {"echo": {"provider": "default", "greeting": ""}},
        },
        DEFAULT_SOURCE,
    )
