"""Typed, frozen configuration of the session core, validated when built.

One small class per concern: :class:`LocalVadConfig` (the energy VAD used when a provider has no server VAD),
:class:`WebhookToolConfig` (an HTTP tool the agent may call), :class:`GuardrailConfig` (an output guardrail) and
:class:`SessionConfig` (everything else).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.session.errors import SessionConfigError
from gateway.session.guardrail_checks import PII_KINDS, BlockedTerms, PiiCheck, PiiKind

_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _positive(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise SessionConfigError(f"{name} must be a positive number, got {value!r}")


def _non_negative(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
        raise SessionConfigError(f"{name} must be >= 0, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalVadConfig:
    """Energy VAD: speech starts after ``start_ms`` above ``threshold_dbfs``, ends after ``hangover_ms`` below."""

    threshold_dbfs: float = -40.0
    start_ms: int = 60
    hangover_ms: int = 400

    def __post_init__(self) -> None:
        if not (-96.0 <= self.threshold_dbfs <= 0.0):
            raise SessionConfigError(f"threshold_dbfs must be in [-96, 0], got {self.threshold_dbfs}")
        for name in ("start_ms", "hangover_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 20 or value % 20:
                raise SessionConfigError(f"{name} must be a positive multiple of 20 ms, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class WebhookToolConfig:
    """A tool served by an HTTP endpoint: POST JSON ``{call_id, tool_call_id, name, arguments}``
    (and ``context``, the caller's, when the worker set one).

    ``auth_header`` is sent as given, e.g. ``("Authorization", "Bearer ...")``. ``background`` lets a slow
    call be promoted to a background run after the session's grace period.
    """

    name: str
    url: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    timeout_s: float = 5.0
    auth_header: tuple[str, str] | None = None
    background: bool = True
    # The call's context (CallContext.as_json), sent as "context" in each request when not empty.
    context: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _TOOL_NAME.match(self.name):
            raise SessionConfigError(f"tool name must match {_TOOL_NAME.pattern}, got {self.name!r}")
        if not self.url.startswith(("http://", "https://")):
            raise SessionConfigError(f"webhook tool {self.name}: url must be http(s), got {self.url!r}")
        _positive(f"webhook tool {self.name}: timeout_s", self.timeout_s)
        if self.parameters.get("type") != "object":
            raise SessionConfigError(f"webhook tool {self.name}: parameters must be a JSON schema of type object")
        if self.auth_header is not None and (len(self.auth_header) != 2 or not self.auth_header[0]):
            raise SessionConfigError(f"webhook tool {self.name}: auth_header must be (name, value)")


@dataclass(frozen=True, slots=True, kw_only=True)
class GuardrailConfig:
    """An output guardrail over what the agent says (docs/operations.md, "Output guardrails").

    ``kind`` "blocked": ``phrases`` and/or ``patterns`` (regular expressions), case-insensitive. "pii": the
    ``pii`` checks (``card``, ``us_ssn``). "http": POST ``{call_id, guardrail, response_id, item_id, text}`` to
    ``url``, which answers ``{"flagged": bool, "reason": str}`` within ``timeout_s``.
    """

    name: str
    kind: Literal["blocked", "pii", "http"]
    phrases: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()
    pii: tuple[PiiKind, ...] = PII_KINDS
    url: str = ""
    timeout_s: float = 1.0

    def __post_init__(self) -> None:
        if not _TOOL_NAME.match(self.name):
            raise SessionConfigError(f"guardrail name must match {_TOOL_NAME.pattern}, got {self.name!r}")
        if self.kind == "blocked":
            BlockedTerms(phrases=self.phrases, patterns=self.patterns)
        elif self.kind == "pii":
            PiiCheck(self.pii)
        elif self.kind == "http":
            if not self.url.startswith(("http://", "https://")):
                raise SessionConfigError(f"guardrail {self.name}: url must be http(s), got {self.url!r}")
            _positive(f"guardrail {self.name}: timeout_s", self.timeout_s)
        else:
            raise SessionConfigError(f"guardrail {self.name}: kind must be blocked, pii or http, got {self.kind!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionConfig:
    """Everything a CallSession needs besides the profile, the model and the call control."""

    # Caller frames held while (re)connecting; overflow drops the oldest and counts it.
    hold_buffer_s: float = 10.0
    # Send granularity toward the provider, and the largest batch when the sender is behind.
    inbound_chunk_ms: int = 20
    inbound_max_batch_ms: int = 200
    # Once the caller has been quiet for inbound_quiet_after_ms (past any turn detector's silence window), caller
    # audio goes in inbound_quiet_chunk_ms messages; the first frame that is not quiet sends what waits at once.
    # A quiet chunk is never smaller than inbound_chunk_ms nor larger than inbound_max_batch_ms; equal to
    # inbound_chunk_ms, every chunk goes as it fills.
    inbound_quiet_chunk_ms: int = 100
    inbound_quiet_after_ms: int = 1000
    # Entry and resume: attempts with exponential backoff base * 2**(n-1), capped at max.
    connect_attempts: int = 2
    connect_timeout_s: float = 10.0
    resume_attempts: int = 5
    resume_backoff_base_s: float = 0.25
    resume_backoff_max_s: float = 4.0
    # Proactive rotation starts this long before capabilities.max_connection_s, waits for a gap between turns
    # for up to rotation_gap_wait_s, then rotates anyway.
    rotation_margin_s: float = 120.0
    rotation_gap_wait_s: float = 60.0
    # On ConnectionExpiring, rotate at the latest this long before the announced end.
    expiring_safety_s: float = 5.0
    # Tools.
    tool_grace_s: float = 3.0
    tool_timeout_s: float = 15.0
    background_timeout_s: float = 120.0
    background_slots: int = 1
    background_result_role: Literal["system", "user"] = "system"
    transfer_targets: tuple[str, ...] = ()  # allow-list for the transfer tool; empty allows any target
    webhook_tools: tuple[WebhookToolConfig, ...] = ()
    # Output guardrails (the profile's), checked every guardrail_every_chars characters of the agent's transcript
    # and at sentence ends; a trip sends guardrail_follow_up as a system message, then asks for a response.
    guardrails: tuple[GuardrailConfig, ...] = ()
    guardrail_every_chars: int = 40
    guardrail_follow_up: str = (
        "Your last reply was cut off by the {guardrail} guardrail ({reason}) and the caller did not hear the rest. "
        "Do not repeat it; continue the conversation safely."
    )
    # Ending: how long hang-up waits for the agent's audio to finish, and the polite goodbye.
    hangup_drain_timeout_s: float = 10.0
    goodbye_message: str = ""
    goodbye_timeout_s: float = 8.0
    apology_audio: bytes = b""  # 24 kHz PCM16 LE played before hanging up with "provider_unavailable"
    # Caller experience.
    hold_audio: bytes = b""  # 24 kHz PCM16 LE looped to a caller the gateway holds (empty: a soft tone)
    comfort_tone: bool = False
    local_vad: LocalVadConfig = field(default_factory=LocalVadConfig)
    forward_dtmf: bool = True
    dtmf_template: str = "The caller pressed {digit} on the keypad."
    dtmf_requests_response: bool = True
    greeting_template: str = "Greet the caller now, saying: {greeting}"
    # Closing system item of the history replayed into a fresh session ("do not greet again"); "" uses the
    # profile's resume_note. The session adds it itself, so adapters are handed resume_note="" (never twice).
    resume_instruction: str = ""
    # Server VAD usually starts a reply right after the caller stops; background results wait this long for it.
    reply_wait_s: float = 1.5
    # Bookkeeping.
    event_ring_size: int = 1000
    close_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        for name in (
            "hold_buffer_s",
            "connect_timeout_s",
            "resume_backoff_base_s",
            "resume_backoff_max_s",
            "tool_grace_s",
            "tool_timeout_s",
            "background_timeout_s",
            "hangup_drain_timeout_s",
            "goodbye_timeout_s",
            "close_timeout_s",
        ):
            _positive(name, getattr(self, name))
        for name in ("rotation_margin_s", "rotation_gap_wait_s", "expiring_safety_s", "reply_wait_s"):
            _non_negative(name, getattr(self, name))
        for name in ("connect_attempts", "resume_attempts", "background_slots", "event_ring_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise SessionConfigError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("inbound_chunk_ms", "inbound_max_batch_ms", "inbound_quiet_chunk_ms", "inbound_quiet_after_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 20 or value % 20:
                raise SessionConfigError(f"{name} must be a positive multiple of 20 ms, got {value!r}")
        if self.inbound_max_batch_ms < self.inbound_chunk_ms:
            raise SessionConfigError("inbound_max_batch_ms must be >= inbound_chunk_ms")
        if self.hold_buffer_s * 1000 < self.inbound_max_batch_ms:
            raise SessionConfigError("hold_buffer_s must hold at least one inbound batch")
        if self.resume_backoff_max_s < self.resume_backoff_base_s:
            raise SessionConfigError("resume_backoff_max_s must be >= resume_backoff_base_s")
        if self.background_timeout_s <= self.tool_grace_s:
            raise SessionConfigError("background_timeout_s must exceed tool_grace_s")
        if len(self.hold_audio) % 2:
            raise SessionConfigError("hold_audio must be PCM16 (an even number of bytes)")
        if len(self.apology_audio) % 2:
            raise SessionConfigError("apology_audio must be PCM16 (an even number of bytes)")
        if "{digit}" not in self.dtmf_template:
            raise SessionConfigError("dtmf_template must contain {digit}")
        if "{greeting}" not in self.greeting_template:
            raise SessionConfigError("greeting_template must contain {greeting}")
        names = [tool.name for tool in self.webhook_tools]
        if len(set(names)) != len(names):
            raise SessionConfigError(f"webhook tool names must be unique, got {names}")
        names = [guardrail.name for guardrail in self.guardrails]
        if len(set(names)) != len(names):
            raise SessionConfigError(f"guardrail names must be unique, got {names}")
        if not isinstance(self.guardrail_every_chars, int) or self.guardrail_every_chars < 1:
            raise SessionConfigError(
                f"guardrail_every_chars must be an integer >= 1, got {self.guardrail_every_chars!r}"
            )
        try:
            self.guardrail_follow_up.format(guardrail="", reason="")
        except (KeyError, IndexError, ValueError) as exc:
            raise SessionConfigError(f"guardrail_follow_up may use only {{guardrail}} and {{reason}}: {exc}") from exc

    @property
    def hold_frames(self) -> int:
        return max(1, round(self.hold_buffer_s * 1000 / 20))

    @property
    def quiet_chunk_frames(self) -> int:
        """Frames per message once the caller has been quiet (``inbound_quiet_chunk_ms`` within its bounds)."""
        return min(max(self.inbound_quiet_chunk_ms, self.inbound_chunk_ms), self.inbound_max_batch_ms) // 20

    def backoff_s(self, retry: int) -> float:
        """Delay before retry number ``retry`` (1 = the first retry)."""
        return float(min(self.resume_backoff_max_s, self.resume_backoff_base_s * 2.0 ** (retry - 1)))
