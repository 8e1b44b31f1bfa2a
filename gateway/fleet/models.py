"""Wire models shared by the control plane and the media workers (the fleet contract).

Everything that crosses the control-plane/worker boundary — in-process or over HTTP — is one of these
pydantic models, so both halves validate the same shapes and the ops API documents them in OpenAPI.
Times are Unix epoch seconds (floats) read from the sender's clock; the control plane stamps its own
``last_heartbeat`` so liveness never depends on worker clocks.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from gateway.providers.base import AgentProfile, BotSpec, ComponentSpec, PipelineSpec, ToolSpec, TurnDetection
from gateway.session.config import GuardrailConfig
from gateway.session.errors import SessionConfigError
from gateway.session.guardrail_checks import PII_KINDS, PiiKind
from gateway.sip.caller_context import CallContext, ContextPolicy, ContextPolicyError
from gateway.sip.events import CallOffered

WorkerStatus = Literal["up", "draining", "lost", "gone"]
CallState = Literal["admitted", "ringing", "active", "held", "resuming", "ending", "ended"]
CallDirection = Literal["inbound", "outbound"]
CallKind = Literal["sip", "webrtc"]

# The event types the control plane publishes on GET /v1/events.
EventType = Literal[
    "call.started",
    "call.updated",
    "call.held",
    "call.resumed",
    "call.ended",
    "call.recording_ready",
    "call.hook_failed",
    "worker.registered",
    "worker.updated",
    "worker.draining",
    "worker.lost",
    "worker.gone",
    "security.blocked",
    "guardrail.tripped",
    "agent.handoff_started",
    "agent.handed_off",
    "agent.handoff_failed",
    "call.amd_detected",
    "call.refer_received",
    "call.referred",
    "call.refer_failed",
    "call.transfer_started",
    "call.transferred",
    "call.transfer_failed",
]
# The subset a worker may report through ControlLink.report (worker.* events are derived by the plane,
# except "worker.gone", which a worker sends when it exits after a drain).
WorkerEventType = Literal[
    "call.started",
    "call.updated",
    "call.held",
    "call.resumed",
    "call.ended",
    "worker.gone",
    "security.blocked",
    "guardrail.tripped",
    "agent.handoff_started",
    "agent.handed_off",
    "agent.handoff_failed",
    "call.amd_detected",
    "call.refer_received",
    "call.referred",
    "call.refer_failed",
    "call.transfer_started",
    "call.transferred",
    "call.transfer_failed",
]

LEVEL_HISTORY_MAX = 120
DTMF_DIGITS = re.compile(r"^[0-9*#A-Da-d]{1,64}$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


#: Capacity and what calls take of it are sums of floats such as 1.0 and 8.0: a hair over is still within.
CAPACITY_SLACK = 1e-6

# ------------------------------------------------------------------------------------------ workers

TrunkRegistrationState = Literal["registering", "registered", "refreshing", "failed", "unregistering", "unregistered"]


class TrunkRegistration(_Model):
    """A worker's registration of its own contact with a trunk's registrar (``register = true``)."""

    trunk: str = Field(default="default", max_length=64, description="The trunk's name (GATEWAY_TRUNK_*: default)")
    state: TrunkRegistrationState = Field(
        description="registered/refreshing: the registrar holds our contact; failed: the last attempt failed and "
        "the next is at next_attempt_at; unregistered: removed on drain or shutdown"
    )
    registrar: str = Field(max_length=512, description="The registrar's SIP URI")
    aor: str = Field(max_length=512, description="The address-of-record our contact is bound to")
    contact: str = Field(default="", max_length=1024, description="This worker's Contact, as registered")
    expires_s: int | None = Field(default=None, ge=0, description="The time the registrar last granted, seconds")
    expires_at: float | None = Field(
        default=None, description="When the binding lapses unless refreshed (worker clock, epoch seconds)"
    )
    next_attempt_at: float | None = Field(default=None, description="When a failed registration is tried again")
    last_status: int | None = Field(default=None, ge=100, le=699, description="The registrar's last final status")
    last_error: str = Field(default="", max_length=1024, description="Why the last attempt failed (empty after one)")
    attempts: int = Field(default=0, ge=0, description="Attempts since the binding was last granted")


class WorkerInfo(_Model):
    """A media worker as it describes itself (id, url, capacity, load) plus what the plane stamps on it."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={
            "examples": [
                {
                    "id": "worker-a",
                    "url": "http://10.0.0.5:8081",
                    "capacity": 200,
                    "active_calls": 12,
                    "used": 19.0,
                    "load": 0.095,
                    "draining": False,
                    "status": "up",
                    "last_heartbeat": 1767225600.0,
                    "version": "0.1.0",
                    "registration": {
                        "state": "registered",
                        "registrar": "sip:sip.carrier.example",
                        "aor": "sip:+15550100@carrier.example",
                        "contact": '<sip:gateway@10.0.0.5:5060>;+sip.instance="<urn:uuid:1d6f0c2e-2b8c-5a4e-'
                        '9f51-0c8d1f3e7a21>"',
                        "expires_s": 3600,
                        "expires_at": 1767229200.0,
                        "next_attempt_at": None,
                        "last_status": 200,
                        "last_error": "",
                        "attempts": 0,
                    },
                }
            ]
        },
    )

    id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")
    url: str = Field(default="", max_length=512, description="Base URL of the worker's internal command API")
    capacity: int = Field(
        default=100, ge=0, le=100_000, description="What the worker carries, in G.711 calls (an Opus call takes more)"
    )
    active_calls: int = Field(default=0, ge=0)
    used: float = Field(
        default=0.0, ge=0.0, description="Capacity its live calls take: 1 per G.711 call, the Opus cost per Opus call"
    )
    load: float = Field(default=0.0, ge=0.0, description="used / capacity (1.0 = full)")
    draining: bool = False
    status: WorkerStatus = "up"
    last_heartbeat: float = Field(default=0.0, description="Control-plane clock, epoch seconds")
    version: str = Field(default="", max_length=64)
    registration: TrunkRegistration | None = Field(
        default=None,
        description="Its registration with the trunk named default (else the first of registrations); kept for "
        "older readers",
    )
    registrations: list[TrunkRegistration] = Field(
        default_factory=list, max_length=256, description="Its registration with each trunk with register = true"
    )


# -------------------------------------------------------------------------------------------- calls


class TranscriptLine(_Model):
    role: Literal["user", "assistant", "system"]
    text: str
    start_s: float | None = Field(default=None, ge=0.0, description="When the item began, seconds into the call")
    end_s: float | None = Field(default=None, ge=0.0, description="When it ended, seconds into the call")
    truncated: bool = Field(default=False, description="The agent was interrupted: the caller heard only part of it")


class ToolCallLine(_Model):
    """One tool the agent called: its arguments, its result and how long it ran (when the worker reports them)."""

    name: str = Field(max_length=64)
    arguments: str = Field(default="", description="The arguments, as the model sent them (JSON text)")
    result: str = Field(default="", description="What the tool returned (JSON text); empty while it runs")
    start_s: float | None = Field(default=None, ge=0.0, description="When it was called, seconds into the call")
    duration_ms: float | None = Field(default=None, ge=0.0)


class HandoffLine(_Model):
    """One handoff of the call from one agent profile to another (failed ones too: the old agent kept the call)."""

    at_s: float = Field(ge=0.0, description="When, seconds into the call")
    from_profile: str = Field(max_length=128)
    to_profile: str = Field(max_length=128)
    reason: str = Field(default="", max_length=500)
    initiator: Literal["agent", "api"] = Field(description="agent: its transfer_to_<name> tool; api: the ops API")
    ok: bool
    error: str = Field(default="", max_length=1000, description="Why it failed")


class DtmfLine(_Model):
    """One DTMF digit of the call: received from the caller or sent to it, and when."""

    digit: str = Field(min_length=1, max_length=1)
    direction: Literal["received", "sent"]
    at_s: float | None = Field(default=None, ge=0.0, description="When, seconds into the call")
    method: Literal["rfc4733", "info", "inband", "webrtc"] | None = Field(
        default=None, description="How a sent digit went out: RFC 4733 event, SIP INFO, in-band tones, or WebRTC"
    )


class GuardrailTripLine(_Model):
    """One output guardrail trip (docs/operations.md, "Output guardrails")."""

    guardrail: str = Field(max_length=64)
    reason: str = Field(max_length=200)
    response_id: str = Field(default="", max_length=128)
    item_id: str = Field(default="", max_length=128)
    at_s: float | None = Field(default=None, ge=0.0, description="When it tripped, seconds into the call")
    heard_ms: int = Field(default=0, ge=0, description="Audio of the cut reply the caller was sent")
    followed_up: bool = Field(default=True, description="A follow-up naming the guardrail was asked for")


class AmdLine(_Model):
    """What answering-machine detection decided on an outbound call (docs/operations.md,
    "Answering-machine detection")."""

    result: Literal["human", "machine", "fax", "unknown"]
    reason: str = Field(max_length=64, description="What decided it, e.g. long_greeting, short_greeting, fax_tone")
    at_s: float = Field(ge=0.0, description="Seconds of the callee's audio after the answer when it was decided")
    beep_at_s: float | None = Field(
        default=None, ge=0.0, description="When the machine's beep (or the greeting's end) came; None: not (yet)"
    )


class ReferralLine(_Model):
    """A transfer the peer asked for with REFER (we were the transferee): where to, and how it went."""

    at_s: float = Field(ge=0.0, description="When the REFER came, seconds into the call")
    target: str = Field(max_length=512, description="The Refer-To URI (without its headers)")
    replaces: bool = Field(default=False, description="The Refer-To carried a Replaces (RFC 3891)")
    outcome: Literal["declined", "referred", "failed"]
    status: int = Field(ge=100, le=699, description="603 when declined; the new call's final SIP status otherwise")
    detail: str = Field(default="", max_length=200)
    trunk: str | None = Field(
        default=None, max_length=64, description="The trunk the new call to the target was dialled through (null: none)"
    )


class CallStats(_Model):
    """Media and agent statistics of one call, as the worker measured them."""

    rtp_packets_in: int = Field(default=0, ge=0)
    rtp_packets_out: int = Field(default=0, ge=0)
    rtp_lost: int = Field(default=0, ge=0)
    loss_pct: float = Field(default=0.0, ge=0.0, le=100.0)
    jitter_ms: float = Field(default=0.0, ge=0.0)
    late: int = Field(default=0, ge=0, description="Packets that arrived after their playout time")
    rtt_ms: float | None = Field(default=None, ge=0.0, description="Round-trip time from RTCP (or WebRTC stats)")
    concealed: int = Field(default=0, ge=0, description="Caller frames played as concealment (lost or late audio)")
    underruns: int = Field(default=0, ge=0, description="Times the caller's jitter buffer ran empty and re-buffered")
    discarded: int = Field(default=0, ge=0, description="Caller frames dropped to bring the playout delay down")
    inserted: int = Field(
        default=0,
        ge=0,
        description="Frames inserted in the caller's pauses to grow the playout delay (Opus: so that in-band FEC "
        "can mend the next lost packet)",
    )
    agent_audio_gaps: int = Field(
        default=0, ge=0, description="Times the agent's audio ran out while its item was still arriving"
    )
    mos: float | None = Field(default=None, ge=1.0, le=5.0, description="E-model estimate (ITU-T G.107)")
    provider_latency_p50_ms: float | None = Field(default=None, ge=0.0)
    provider_latency_last_ms: float | None = Field(default=None, ge=0.0)
    barge_ins: int = Field(default=0, ge=0)
    resumes: int = Field(default=0, ge=0)
    tool_calls: int = Field(default=0, ge=0)
    handoffs: int = Field(default=0, ge=0, description="Times the call was handed to another agent")
    guardrail_trips: list[GuardrailTripLine] = Field(
        default_factory=list, max_length=50, description="Output guardrail trips, oldest first"
    )
    early_media_frames_in: int = Field(
        default=0, ge=0, description="20 ms frames received before the 200 OK (early media; never passed on)"
    )
    early_media_frames_out: int = Field(
        default=0, ge=0, description="20 ms frames of early media sent before the 200 OK"
    )
    level_dbfs: float | None = Field(default=None, le=0.0, description="Recent caller audio level")
    level_history: list[float] = Field(
        default_factory=list, max_length=LEVEL_HISTORY_MAX, description="Recent levels, oldest first (sparkline)"
    )


class CallContextModel(_Model):
    """What the call carried when it arrived (:class:`gateway.sip.caller_context.CallContext`), sanitised."""

    caller_number: str = Field(default="", max_length=4096)
    caller_name: str = Field(default="", max_length=4096)
    identity_source: Literal["p-asserted-identity", "remote-party-id", "from", "page", "none"] = Field(
        default="none",
        description="Which header gave the caller: P-Asserted-Identity and Remote-Party-ID only from trusted "
        "sources (RFC 3325), From otherwise; page: a browser page's metadata",
    )
    privacy: bool = Field(default=False, description="The caller asked for Privacy: id")
    called_number: str = Field(default="", max_length=4096)
    diverted_from: list[str] = Field(default_factory=list, description="Diversion, then History-Info numbers")
    headers: dict[str, str] = Field(default_factory=dict, description="The configured headers the INVITE carried")
    metadata: dict[str, str] = Field(default_factory=dict, description="A browser page's, from its token request")
    transport: str = ""
    source: str = ""

    @classmethod
    def of(cls, context: CallContext) -> CallContextModel:
        return cls(
            caller_number=context.caller_number,
            caller_name=context.caller_name,
            identity_source=context.identity_source,
            privacy=context.privacy,
            called_number=context.called_number,
            diverted_from=list(context.diverted_from),
            headers=dict(context.headers),
            metadata=dict(context.metadata),
            transport=context.transport,
            source=context.source,
        )


class RecordingModel(_Model):
    """A call's recording: where it lies (relative to the recordings directory) and what it holds."""

    path: str = Field(max_length=1024, description="Relative to GATEWAY_RECORDINGS_DIR: <UTC date>/<call id>.<ext>")
    format: Literal["wav", "ogg"] = Field(description="wav: PCM16 RIFF; ogg: Opus in Ogg")
    channels: int = Field(ge=1, le=2, description="1: one side; 2: caller left, agent right")
    sample_rate: int = Field(gt=0)
    bytes: int = Field(default=0, ge=0, description="Size of the file (0 while the call runs)")
    duration_s: float = Field(default=0.0, ge=0.0, description="Audio written (0 while the call runs)")


class TransferLine(_Model):
    """A warm transfer (POST /v1/calls/{id}/warm_transfer, the agent's warm_transfer tool): the caller's leg,
    the human's leg, and where it got to."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(max_length=64, description="The transfer's id")
    target: str = Field(max_length=256, description="What was dialled (a queue name resolved to its target)")
    caller_leg: str = Field(max_length=64, description="The caller's call id")
    human_leg: str = Field(max_length=64, description="The human's call id (its own call record)")
    state: Literal["dialling", "briefing", "bridged", "failed", "ended"]
    initiator: Literal["agent", "api"]
    outcome: str = Field(
        default="", max_length=64, description="Why it failed (no_answer, sip_486, ...) or how the bridge ended"
    )
    briefed: bool = Field(default=False, description="The human heard the summary before the legs were joined")
    briefing: Literal["spoken", "conversation"] = Field(
        default="spoken", description="spoken: the summary as one turn; conversation: the human talked with the agent"
    )
    declined_reason: str = Field(
        default="", max_length=200, description="Why the human declined the call (outcome `declined`)"
    )
    handoff: Literal["bridge", "refer"] = Field(
        default="bridge",
        description="How the joined call went on: bridged by the gateway, or handed off with a REFER (Replaces) "
        "so that caller and human talk directly",
    )
    handoff_detail: str = Field(
        default="", max_length=200, description="Why a REFER handoff was not tried or did not go through"
    )
    started: float
    answered: float | None = None
    bridged: float | None = None
    ended: float | None = None


class CallSnapshot(_Model):
    """The state of one call. Workers send these; the plane stores and publishes them."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        populate_by_name=True,
        json_schema_extra={
            "examples": [
                {
                    "id": "c-5f2a9d0e",
                    "direction": "inbound",
                    "kind": "sip",
                    "from": "+15550100",
                    "to": "+15550199",
                    "route": "support",
                    "provider": "openai",
                    "state": "active",
                    "worker": "worker-a",
                    "codec": "PCMU",
                    "srtp": "AES_CM_128_HMAC_SHA1_80",
                    "transport": "tls",
                    "trunk": "carrier_a",
                    "started": 1767225600.0,
                    "answered": 1767225600.4,
                    "ended": None,
                    "duration_s": 42.0,
                    "end_reason": "",
                    "stats": {"jitter_ms": 3.1, "loss_pct": 0.2, "mos": 4.3},
                    "transcript": [{"role": "user", "text": "Hello"}],
                }
            ]
        },
    )

    id: str = Field(min_length=1, max_length=128)
    direction: CallDirection = "inbound"
    kind: CallKind = "sip"
    from_: str = Field(default="", alias="from", max_length=256)
    to: str = Field(default="", max_length=256)
    route: str = ""
    provider: str = ""
    state: CallState = "admitted"
    worker: str = ""
    codec: str = ""
    srtp: str = Field(
        default="",
        max_length=64,
        description="The SRTP crypto-suite protecting the call's media (SDES), e.g. AES_CM_128_HMAC_SHA1_80; "
        "empty for plain RTP (and for browser calls, whose DTLS-SRTP is aiortc's)",
    )
    transport: Literal["", "udp", "tcp", "tls"] = Field(
        default="",
        description="The SIP transport the call's INVITE took (tls: signalling encrypted); empty for browser calls",
    )
    trunk: str | None = Field(
        default=None,
        max_length=64,
        description="The trunk the call's INVITE came in on (by its source address) or was dialled through; "
        "null: none (a caller from no trunk's sources, a SIP URI dialled without a trunk, a browser call)",
    )
    cost: float = Field(
        default=1.0, ge=1.0, le=1000.0, description="Capacity the call takes on its worker (1 = a G.711 call)"
    )
    started: float | None = None
    answered: float | None = None
    ended: float | None = None
    duration_s: float = Field(default=0.0, ge=0.0)
    end_reason: str = ""
    stats: CallStats = Field(default_factory=CallStats)
    transcript: list[TranscriptLine] = Field(default_factory=list)
    tools: list[ToolCallLine] = Field(
        default_factory=list, description="Tool calls with arguments and results (GET /v1/calls/{id} only)"
    )
    dtmf: str = Field(default="", max_length=256, description="DTMF digits the caller sent, in order")
    handoffs: list[HandoffLine] = Field(
        default_factory=list, max_length=256, description="Handoffs between agent profiles, in order"
    )
    dtmf_events: list[DtmfLine] = Field(
        default_factory=list, description="Each DTMF digit received or sent, with its time (ended calls only)"
    )
    context: CallContextModel | None = Field(default=None, description="Caller context (None before admission)")
    trace_id: str = Field(
        default="", max_length=32, description="The call's OpenTelemetry trace id (32 hex digits; empty: not traced)"
    )
    recording: RecordingModel | None = Field(
        default=None, description="The call's recording (None: not recorded); sizes are final once the call ended"
    )
    amd: AmdLine | None = Field(
        default=None, description="Answering-machine detection's decision (outbound calls with amd on; None: none yet)"
    )
    referrals: list[ReferralLine] = Field(
        default_factory=list, max_length=32, description="REFERs the peer sent (transfers of the call), in order"
    )
    transfer: TransferLine | None = Field(
        default=None, description="The call's last warm transfer to a human: both legs and how it went (None: none)"
    )

    @property
    def is_live(self) -> bool:
        return self.state != "ended"

    def wire(self) -> dict[str, Any]:
        """JSON-ready dict with the public field names (``from``, not ``from_``)."""
        return self.model_dump(mode="json", by_alias=True)


# ------------------------------------------------------------------------------------------- events


class FleetEvent(_Model):
    """One entry of the control plane's event ring; ``id`` increases by one per event, fleet-wide."""

    id: int = Field(ge=1)
    type: EventType
    time: float
    data: dict[str, Any] = Field(default_factory=dict)


class WorkerEvent(_Model):
    """What a worker reports (ControlLink.report); the plane turns it into FleetEvents with ids."""

    type: WorkerEventType
    worker: str
    time: float
    call: CallSnapshot | None = None
    # What a security.* or agent.* event says (agent.*: from/to profile, reason, ...).
    data: dict[str, Any] = Field(default_factory=dict)


# ----------------------------------------------------------------------------------- agent profile


class WebhookSpec(_Model):
    """Where a webhook tool is executed: an HTTP POST of the JSON arguments to ``url``."""

    url: str = Field(pattern=r"^https?://", max_length=2048)
    timeout_s: float = Field(default=10.0, gt=0.0, le=300.0)
    auth_header: str = Field(default="", repr=False, description="Sent as the Authorization header")


class ToolModel(_Model):
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    webhook: WebhookSpec | None = Field(
        default=None, description="Absent: a tool built into the worker (e.g. hang_up, transfer)"
    )


class GuardrailModel(_Model):
    """An output guardrail of a profile (``[[profiles.<name>.guardrails]]``): docs/operations.md, "Output
    guardrails". Validated when loaded (patterns compile, the kind has what it needs)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    kind: Literal["blocked", "pii", "http"]
    phrases: list[str] = Field(default_factory=list, max_length=1000)
    patterns: list[str] = Field(default_factory=list, max_length=100)
    pii: list[PiiKind] = Field(default_factory=lambda: list(PII_KINDS))
    url: str = Field(default="", max_length=2048)
    timeout_s: float = Field(default=1.0, gt=0.0, le=30.0)

    @model_validator(mode="after")
    def _valid(self) -> GuardrailModel:
        try:
            self.to_config()
        except SessionConfigError as exc:
            raise ValueError(str(exc)) from exc
        return self

    def to_config(self) -> GuardrailConfig:
        return GuardrailConfig(
            name=self.name,
            kind=self.kind,
            phrases=tuple(self.phrases),
            patterns=tuple(self.patterns),
            pii=tuple(self.pii),
            url=self.url,
            timeout_s=self.timeout_s,
        )


class TurnDetectionModel(_Model):
    kind: Literal["server_vad", "semantic_vad", "none"] = "server_vad"
    threshold: float = Field(default=0.5, ge=0.0, le=1.0)
    prefix_padding_ms: int = Field(default=300, ge=0, le=5000)
    silence_duration_ms: int = Field(default=500, ge=0, le=10_000)


class ComponentModel(_Model):
    """One pipeline component: a registered name and its options (gateway.providers.pipeline.components)."""

    name: str = Field(min_length=1, max_length=64)
    options: dict[str, str | int | float | bool] = Field(default_factory=dict)

    def to_spec(self) -> ComponentSpec:
        return ComponentSpec(name=self.name, options=dict(self.options))


class PipelineModel(_Model):
    """The wire form of :class:`gateway.providers.base.PipelineSpec`."""

    stt: ComponentModel
    llm: ComponentModel
    tts: ComponentModel
    vad: ComponentModel = Field(default_factory=lambda: ComponentModel(name="energy"))
    onset_ms: int = Field(default=60, ge=0, le=2000, description="VAD speech before a caller turn starts")
    endpoint_ms: int = Field(default=500, gt=0, le=10_000, description="Silence that ends a caller turn")
    max_endpoint_ms: int = Field(
        default=3000, gt=0, le=30_000, description="Longest wait for the recogniser's final text after silence"
    )
    min_interrupt_ms: int = Field(default=400, ge=0, le=5000, description="Caller speech that interrupts the agent")
    false_interrupt_ms: int = Field(
        default=1500, gt=0, le=10_000, description="An unconfirmed onset over the agent is ignored after this"
    )

    def to_spec(self) -> PipelineSpec:
        return PipelineSpec(
            stt=self.stt.to_spec(),
            llm=self.llm.to_spec(),
            tts=self.tts.to_spec(),
            vad=self.vad.to_spec(),
            onset_ms=self.onset_ms,
            endpoint_ms=self.endpoint_ms,
            max_endpoint_ms=self.max_endpoint_ms,
            min_interrupt_ms=self.min_interrupt_ms,
            false_interrupt_ms=self.false_interrupt_ms,
        )


class BotModel(_Model):
    """The bot of a ``websocket`` profile (:class:`gateway.providers.base.BotSpec`); secrets stay in settings."""

    url: str = Field(default="", pattern=r"^(wss?://.+)?$", max_length=2048, repr=False)
    audio: Literal["", "mulaw", "l16_16k", "l16_24k"] = ""
    parameters: dict[str, str] = Field(default_factory=dict, description="Added to start.customParameters")

    def to_spec(self) -> BotSpec:
        return BotSpec(url=self.url, audio=self.audio, parameters=dict(self.parameters))


class ContextPolicyModel(_Model):
    """The routes file's ``[context]``: which INVITE headers a call keeps, whose identity headers are believed."""

    headers: list[str] = Field(
        default_factory=list, description="SIP headers kept in the call's context, e.g. X-Account (case-insensitive)"
    )
    trusted_sources: list[str] = Field(
        default_factory=list,
        description="Addresses or networks (CIDR) of trusted trunks: only their P-Asserted-Identity / "
        "Remote-Party-ID is believed (RFC 3325 §9.1)",
    )
    max_value_chars: int = Field(default=256, ge=1, le=4096, description="Longest kept value (longer: cut)")
    max_headers: int = Field(default=16, ge=0, le=64, description="Most headers kept (and metadata entries)")
    max_redirects: int = Field(default=8, ge=0, le=32, description="Most Diversion/History-Info numbers kept")

    @model_validator(mode="after")
    def _valid_policy(self) -> ContextPolicyModel:
        try:
            self.to_policy()
        except ContextPolicyError as exc:
            raise ValueError(str(exc)) from None
        return self

    def to_policy(self) -> ContextPolicy:
        return ContextPolicy(
            headers=tuple(self.headers),
            trusted_sources=tuple(self.trusted_sources),
            max_value_chars=self.max_value_chars,
            max_headers=self.max_headers,
            max_redirects=self.max_redirects,
        )


class ProfileModel(_Model):
    """The wire form of :class:`gateway.providers.base.AgentProfile`, plus where webhook tools run."""

    name: str = "default"
    provider: str = "echo"
    model: str = ""
    voice: str = ""
    instructions: str = "You are a helpful voice agent on a phone call. Be brief."
    greeting: str = ""
    tools: list[ToolModel] = Field(default_factory=list)
    turn_detection: TurnDetectionModel = Field(default_factory=TurnDetectionModel)
    max_duration_s: float = Field(default=3600.0, gt=0.0)
    audio_format: Literal["pcm24k", "pcmu", "pcma"] = "pcm24k"
    pipeline: PipelineModel | None = None
    bot: BotModel | None = None
    amd_stt: ComponentModel | None = Field(
        default=None,
        description="A recogniser (a pipeline stt component) for the words of an outbound call's greeting while "
        "AMD listens, whatever the provider; unset: the pipeline's own STT, none for realtime providers",
    )
    no_input_prompt_s: float = Field(
        default=0.0,
        ge=0.0,
        le=3600.0,
        description="Seconds of caller silence, while the agent waits, before the agent says no_input_prompt "
        "(agent speech, tool runs and hold do not count); 0: no prompt",
    )
    no_input_hangup_s: float = Field(
        default=0.0,
        ge=0.0,
        le=3600.0,
        description="Seconds of further silence before the agent says no_input_goodbye and hangs up with end "
        "reason no_input; 0: never",
    )
    no_input_prompt: str = Field(default="Are you still there?", max_length=500)
    no_input_goodbye: str = Field(
        default="I have not heard from you, so I will end the call now. Goodbye.", max_length=500
    )
    guardrails: list[GuardrailModel] = Field(default_factory=list)
    guardrail_every_chars: int = Field(default=40, ge=1, le=10_000)
    record: Literal["off", "caller", "agent", "both"] = "off"
    record_format: Literal["wav", "ogg"] = "wav"
    record_sample_rate: Literal[8000, 16000, 24000, 48000] = 16000
    record_notice: str = Field(default="", max_length=1024, description="An audio file the worker plays first")
    # The routes file's [context], copied onto every profile so the worker builds the call's context with it.
    context: ContextPolicyModel = Field(default_factory=ContextPolicyModel)
    handoffs: list[str] = Field(
        default_factory=list, description="Profiles this agent may hand the caller to (tools transfer_to_<name>)"
    )
    # Every profile reachable through handoffs, by name (each without a closure of its own): what the worker
    # needs to hand the call on without asking the control plane.
    handoff_profiles: dict[str, ProfileModel] = Field(default_factory=dict)

    def to_agent_profile(self) -> AgentProfile:
        td = self.turn_detection
        return AgentProfile(
            name=self.name,
            provider=self.provider,
            model=self.model,
            voice=self.voice,
            instructions=self.instructions,
            greeting=self.greeting,
            tools=tuple(ToolSpec(name=t.name, description=t.description, parameters=t.parameters) for t in self.tools),
            turn_detection=TurnDetection(
                kind=td.kind,
                threshold=td.threshold,
                prefix_padding_ms=td.prefix_padding_ms,
                silence_duration_ms=td.silence_duration_ms,
            ),
            max_duration_s=self.max_duration_s,
            audio_format=self.audio_format,
            pipeline=self.pipeline.to_spec() if self.pipeline is not None else None,
            bot=self.bot.to_spec() if self.bot is not None else None,
            amd_stt=self.amd_stt.to_spec() if self.amd_stt is not None else None,
            handoffs=tuple(self.handoffs),
            no_input_prompt_s=self.no_input_prompt_s,
            no_input_hangup_s=self.no_input_hangup_s,
            no_input_prompt=self.no_input_prompt,
            no_input_goodbye=self.no_input_goodbye,
        )

    def guardrail_configs(self) -> tuple[GuardrailConfig, ...]:
        return tuple(guardrail.to_config() for guardrail in self.guardrails)

    def webhook_for(self, tool_name: str) -> WebhookSpec | None:
        for tool in self.tools:
            if tool.name == tool_name:
                return tool.webhook
        return None


# -------------------------------------------------------------------------------------- admission


HeaderValue = Annotated[str, StringConstraints(max_length=4096)]


class InviteFacts(_Model):
    """What an inbound INVITE said about its call, for the control plane to build the call's context with the
    routes file's ``[context]`` (the call-time application hook is sent it before the call is answered)."""

    request_uri: str = Field(default="", max_length=4096)
    from_header: str = Field(default="", max_length=4096)
    from_display_name: str | None = Field(default=None, max_length=4096)
    to_uri: str = Field(default="", max_length=4096)
    headers: list[tuple[HeaderValue, HeaderValue]] = Field(
        default_factory=list, max_length=64, description="Identity, redirection and application headers"
    )
    transport: str = Field(default="", max_length=16)

    @classmethod
    def of(cls, event: CallOffered) -> InviteFacts:
        """An INVITE's facts without the headers that only route it or carry credentials, each value cut short."""
        headers = [
            (name[:4096], value[:4096]) for name, value in event.headers if name.lower() not in _NOT_CONTEXT_HEADERS
        ]
        return cls(
            request_uri=event.request_uri[:4096],
            from_header=event.from_uri[:4096],
            from_display_name=event.from_display_name[:4096] if event.from_display_name is not None else None,
            to_uri=event.to_uri[:4096],
            headers=headers[:64],
            transport=event.transport[:16],
        )


# Routing, dialog and body headers say nothing of the caller; credentials must never reach an application.
_NOT_CONTEXT_HEADERS = frozenset(
    {
        "via",
        "v",
        "route",
        "record-route",
        "contact",
        "m",
        "content-type",
        "c",
        "content-length",
        "l",
        "cseq",
        "call-id",
        "i",
        "max-forwards",
        "from",
        "f",
        "to",
        "t",
        "authorization",
        "proxy-authorization",
        "allow",
        "supported",
        "k",
        "accept",
        "session-expires",
        "x",
        "min-se",
    }
)


class AdmissionRequest(_Model):
    """A worker (inbound INVITE), the WebRTC endpoint or the ops API asks to place a call.

    ``call_id`` makes the request idempotent: asking again with the same id returns the same decision,
    so a link may retry safely. ``route`` names a route directly (WebRTC, originate) instead of matching
    ``called`` against the DID table. ``public`` marks an unauthenticated browser caller.
    """

    called: str = Field(default="", max_length=256, description="Dialled number / DID (SIP request-URI user)")
    caller: str = Field(default="", max_length=256)
    source: str = Field(default="", max_length=256, description="Signalling source address")
    kind: CallKind = "sip"
    direction: CallDirection = "inbound"
    route: str | None = None
    worker: str | None = Field(default=None, description="The worker the call arrived on, if any")
    call_id: str | None = Field(default=None, max_length=128)
    public: bool = False
    cost: float = Field(
        default=1.0,
        ge=1.0,
        le=1000.0,
        description="Capacity the call takes on its worker: 1 for G.711, the worker's Opus cost for Opus",
    )
    invite: InviteFacts | None = Field(default=None, description="An inbound SIP call's INVITE (its context)")
    metadata: dict[str, HeaderValue] = Field(
        default_factory=dict, max_length=64, description="A browser call's page metadata (its context)"
    )
    traceparent: str = Field(
        default="",
        max_length=55,
        description="W3C traceparent of the call's span on the worker (empty when tracing is off): one trace per call",
    )


class EarlyMediaModel(_Model):
    """A route's early media on inbound calls: what the caller hears between the 183 and the 200 OK
    (docs/operations.md, "Early media")."""

    mode: Literal["off", "tone", "greeting"] = "off"
    seconds: float = Field(default=3.0, gt=0, le=60)
    file: str = Field(default="", max_length=1024)


class ReferPolicyModel(_Model):
    """What the route lets a peer's REFER do (docs/operations.md, "Incoming REFER"): ``off`` declines every REFER
    with 603; ``accept`` takes one whose Refer-To matches ``allow`` (every target when ``allow`` is empty)."""

    mode: Literal["off", "accept"] = "off"
    allow: tuple[str, ...] = Field(
        default=(),
        max_length=64,
        description="Shell-style patterns matched against the Refer-To URI (sip:*@pbx.example.com) or its host "
        "(10.0.0.*); case-insensitive",
    )

    def allows(self, uri: str, host: str) -> bool:
        if self.mode != "accept":
            return False
        if not self.allow:
            return True
        uri, host = uri.lower(), host.lower()
        return any(fnmatch.fnmatchcase(uri, p.lower()) or fnmatch.fnmatchcase(host, p.lower()) for p in self.allow)


class AdmissionDecision(_Model):
    """Accepted: route + profile + call id + worker. Rejected: an HTTP-like status, a reason, a retry hint."""

    accepted: bool
    call_id: str = ""
    worker: str = ""
    route: str = ""
    profile: ProfileModel | None = None
    status: int = Field(
        default=200,
        ge=200,
        le=699,
        description="200, or the refusal: 403/404/503, or the SIP status the call-time application chose "
        "(302 with contact: a redirect)",
    )
    code: str = Field(
        default="",
        description="Machine-readable rejection: no_route, forbidden, no_worker, over_capacity, "
        "application_rejected, application_redirected, application_unavailable",
    )
    reason: str = ""
    retry_after_s: int | None = None
    contact: str = Field(default="", max_length=256, description="Where a redirect (302) sends the caller")
    metadata: dict[str, str] = Field(
        default_factory=dict, description="The call-time application's metadata, added to the call's context"
    )
    early_media: EarlyMediaModel | None = Field(default=None, description="The route's early media (inbound)")
    traceparent: str = Field(
        default="",
        max_length=55,
        description="W3C traceparent of an originated call's span on the control plane (empty when tracing is off)",
    )
    refer: ReferPolicyModel = Field(
        default_factory=ReferPolicyModel, description="The route's policy for the peer's REFERs (default: declined)"
    )
    trunk: str | None = Field(
        default=None,
        max_length=64,
        description="The route's trunk, for the numbers this call goes on to dial (a warm transfer's human, a "
        "REFER's tel: target); None: default",
    )


# ---------------------------------------------------------------------------------------- commands


class OriginateRequest(_Model):
    """POST /v1/calls: place an outbound call from an agent to ``to``."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={
            "examples": [{"to": "sip:+15550123@trunk.example.net", "caller_id": "+15550199", "route": "support"}]
        },
    )

    to: str = Field(min_length=1, max_length=256, description="SIP URI or number to call")
    caller_id: str = Field(default="", max_length=256, description="From number; also used to pick the route")
    route: str | None = Field(default=None, max_length=128, description="Route name (default: match caller_id)")
    worker: str | None = Field(default=None, max_length=128, description="Worker to use (default: least loaded)")
    trunk: str | None = Field(
        default=None,
        max_length=64,
        description="The trunk to call through (a [trunks.<name>] of the routes file, or default); unset: the "
        "route's trunk, else default for a number and none for a SIP URI",
    )
    ring_timeout_s: float = Field(default=30.0, gt=0.0, le=300.0)
    amd: Literal["off", "detect", "detect_and_leave_message"] = Field(
        default="off",
        description="Answering-machine detection: off, detect (hang up on a machine or fax), or "
        "detect_and_leave_message (on a machine, wait for the beep and say voicemail_message)",
    )
    voicemail_message: str = Field(
        default="", max_length=2000, description="What the agent says after the beep (detect_and_leave_message)"
    )

    @model_validator(mode="after")
    def _message_for_voicemail(self) -> OriginateRequest:
        if self.amd == "detect_and_leave_message" and not self.voicemail_message.strip():
            raise ValueError("amd detect_and_leave_message needs a voicemail_message (the text the agent leaves)")
        return self


class HangupRequest(_Model):
    reason: str = Field(default="api", max_length=64)


class TransferRequest(_Model):
    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra={"examples": [{"target": "+15550142"}]})

    target: str = Field(min_length=1, max_length=256, description="SIP URI or number (REFER target)")


class WarmTransferRequest(_Model):
    """POST /v1/calls/{id}/warm_transfer: bring a human in, briefed, then join them with the caller."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={"examples": [{"target": "sales", "summary": "Caller wants to upgrade to the annual plan."}]},
    )

    target: str = Field(
        min_length=1,
        max_length=256,
        description="A number (dialled through the trunk), a SIP URI, or a queue name (GATEWAY_WARM_TRANSFER_QUEUES)",
    )
    summary: str = Field(
        default="", max_length=2000, description="What the human is told first; empty: made from the transcript"
    )
    ring_timeout_s: float | None = Field(
        default=None, gt=0.0, le=300.0, description="How long the human's phone rings (default: the worker's setting)"
    )
    caller_hears: Literal["hold", "agent"] = Field(
        default="hold", description="hold: the hold audio while the human is dialled and briefed; agent: the agent"
    )
    briefing: Literal["spoken", "conversation"] | None = Field(
        default=None,
        description="spoken: the summary is said to the human as one turn, then the join; conversation: the human "
        "talks with the briefing agent, who joins them (connect_caller) or gives the caller back (decline_transfer); "
        "default: GATEWAY_WARM_TRANSFER_BRIEFING",
    )
    handoff: Literal["bridge", "refer"] | None = Field(
        default=None,
        description="Once joined: bridge (the gateway carries the media until a side hangs up) or refer (REFER the "
        "caller to the human with Replaces, the gateway leaves; a refusal keeps the bridge); default: "
        "GATEWAY_WARM_TRANSFER_REFER",
    )


class DtmfRequest(_Model):
    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra={"examples": [{"digits": "1#"}]})

    digits: str = Field(description="0-9 * # A-D: RFC 4733 events, else SIP INFO, else tones", examples=["123#"])
    duration_ms: int = Field(default=160, ge=40, le=2000)

    @field_validator("digits")
    @classmethod
    def _valid_digits(cls, value: str) -> str:
        if not DTMF_DIGITS.fullmatch(value):
            raise ValueError("digits must be 1-64 of 0-9 * # A-D")
        return value.upper()


class SayRequest(_Model):
    """POST /v1/calls/{id}/say: the agent says ``text``."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={"examples": [{"text": "One moment.", "interrupt": False}]},
    )

    text: str = Field(min_length=1, max_length=4096, description="What the agent says, as written")
    interrupt: bool = Field(
        default=False, description="Cut what the agent is saying and say this now (false: after the current turn)"
    )


class InjectRequest(_Model):
    """POST /v1/calls/{id}/inject: a message added to the agent's conversation."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={"examples": [{"text": "The caller's order has shipped.", "role": "system"}]},
    )

    text: str = Field(min_length=1, max_length=16_384)
    role: Literal["user", "system"] = Field(default="system", description="Who the message is from")
    respond: bool = Field(default=False, description="Ask the agent to respond to it now")


class AgentUpdateRequest(_Model):
    """POST /v1/calls/{id}/update: change the running agent (a fresh provider session carries the transcript)."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, json_schema_extra={"examples": [{"instructions": "Speak French from now on."}]}
    )

    instructions: str | None = Field(default=None, min_length=1, max_length=32_768)
    voice: str | None = Field(default=None, min_length=1, max_length=64)
    tools: list[ToolModel] | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="The agent's tools from now on (replacing its list): built-in names, or with a webhook",
    )

    @model_validator(mode="after")
    def _something(self) -> AgentUpdateRequest:
        if self.instructions is None and self.voice is None and self.tools is None:
            raise ValueError("give instructions, voice or tools")
        if self.tools is not None:
            names = [tool.name for tool in self.tools]
            if len(set(names)) != len(names):
                raise ValueError(f"tool names must be unique, got {names}")
        return self


class HandoffRequest(_Model):
    """POST /v1/calls/{id}/handoff: hand the call to another agent profile, keeping the conversation."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={"examples": [{"profile": "billing", "reason": "The caller asks about an invoice."}]},
    )

    profile: str = Field(min_length=1, max_length=128, description="A profile of the routes file")
    reason: str = Field(default="", max_length=500, description="Why; the new agent is told")


class AgentCommand(_Model):
    """The control plane -> worker form of the live call control commands: exactly one is set."""

    say: SayRequest | None = None
    inject: InjectRequest | None = None
    update: AgentUpdateRequest | None = None
    handoff: HandoffRequest | None = None
    # With handoff: the profile it names, as the control plane's config has it (the plane fills it in).
    target: ProfileModel | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> AgentCommand:
        if sum(part is not None for part in (self.say, self.inject, self.update, self.handoff)) != 1:
            raise ValueError("exactly one of say, inject, update, handoff")
        if self.target is not None and self.handoff is None:
            raise ValueError("only a handoff carries a target profile")
        return self


class DrainRequest(_Model):
    exit_when_empty: bool = Field(default=False, description="The worker exits once its last call ends")
    deadline_s: float | None = Field(
        default=None,
        ge=0,
        le=86_400,
        description="Calls still up this many seconds from now are ended politely (the agent says the worker's"
        " goodbye, then a BYE with a Reason header); null lets them run to their end",
    )


class OriginateCommand(_Model):
    """The control plane -> worker originate message: what to dial and the admission that placed it."""

    request: OriginateRequest
    admission: AdmissionDecision


class CallCreated(_Model):
    id: str
    worker: str
    route: str


class HeartbeatRequest(_Model):
    info: WorkerInfo
    calls: list[CallSnapshot] = Field(default_factory=list)


class ReportRequest(_Model):
    events: list[WorkerEvent] = Field(max_length=1000)
