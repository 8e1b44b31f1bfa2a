"""The seam every realtime provider plugs into: RealtimeModel (one per profile) and RealtimeSession (one per call).

A session speaks the 24 kHz mono PCM16 frame contract (:mod:`telcodecs.frames`) in both directions; adapters
that need other rates or formats convert inside. Everything a provider tells the call arrives as one of the
frozen, past-tense events below, read from :meth:`RealtimeSession.events`.

Error tree (see also :mod:`gateway.providers.errors`)::

    ProviderError(retryable: bool)
     ├── ProviderConnectError      connecting or the setup handshake failed
     ├── ProviderClosedError       the connection is gone (send after close, remote close)
     ├── ProviderProtocolError     the provider sent something we cannot interpret
     └── ProviderConfigError       the provider cannot be built from the configuration
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

# ---------------------------------------------------------------------------------------------- profile

# Appended after a replayed transcript when a call continues on a fresh provider session (history non-empty
# and no server-side resumption): without it models greet the caller a second time.
RESUME_NOTE = (
    "The call was briefly interrupted by a technical reconnection and continues now. The conversation so far "
    "is above. Do not greet the caller again and do not mention the reconnection; continue where you left off."
)

#: The provider kinds a profile may name (gateway/providers/registry.py builds each). Here, in a module
#: without heavy imports, so that the control plane can check names without loading the providers.
PROVIDERS = ("echo", "openai", "gemini", "pipeline", "websocket")


_NOT_TOOL_CHARS = re.compile(r"[^A-Za-z0-9_-]")


def handoff_tool_name(profile: str) -> str:
    """The tool that hands the caller to ``profile``: ``transfer_to_<profile>`` as a valid function name (here, not
    in gateway.session.handoff, so the control plane checks it at load without importing the session core)."""
    return ("transfer_to_" + _NOT_TOOL_CHARS.sub("_", profile))[:64]


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolSpec:
    """A function the agent may call. ``parameters`` is a JSON schema object."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnDetection:
    """Server-side voice activity detection settings (OpenAI server_vad; Gemini automaticActivityDetection)."""

    kind: Literal["server_vad", "semantic_vad", "none"] = "server_vad"
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500


ComponentOption = str | int | float | bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ComponentSpec:
    """One component of the cascaded pipeline: a registered name and its options (model, voice, language, ...)."""

    name: str
    options: Mapping[str, ComponentOption] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineSpec:
    """What the ``pipeline`` provider is made of on a route, and its turn-taking knobs (milliseconds).

    Component names are looked up in :mod:`gateway.providers.pipeline.components`; see docs/operations.md.
    """

    stt: ComponentSpec
    llm: ComponentSpec
    tts: ComponentSpec
    vad: ComponentSpec = field(default_factory=lambda: ComponentSpec(name="energy"))
    onset_ms: int = 60
    endpoint_ms: int = 500
    max_endpoint_ms: int = 3000
    min_interrupt_ms: int = 400
    false_interrupt_ms: int = 1500


@dataclass(frozen=True, slots=True, kw_only=True)
class BotSpec:
    """Where a ``websocket`` profile's bot listens and what it is told (docs/operations.md, "Websocket provider").

    Empty ``url`` and ``audio`` take the worker's settings (``GATEWAY_BOT_URL``, ``GATEWAY_BOT_AUDIO``). Secrets
    (tokens, auth headers) come from settings only, never from a profile.
    """

    url: str = ""
    audio: Literal["", "mulaw", "l16_16k", "l16_24k"] = ""
    # Added to the stream's start.customParameters (the call's own from_number/to_number/... win).
    parameters: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentProfile:
    """What the agent on a route is: provider, model, voice, instructions, tools, greeting, limits."""

    name: str = "default"
    provider: str = "echo"
    model: str = ""
    voice: str = ""
    instructions: str = "You are a helpful voice agent on a phone call. Be brief."
    greeting: str = ""
    tools: tuple[ToolSpec, ...] = ()
    turn_detection: TurnDetection = field(default_factory=TurnDetection)
    max_duration_s: float = 3600.0
    # "pcm24k" (the frame contract) or "pcmu"/"pcma" passthrough where the provider accepts G.711.
    audio_format: Literal["pcm24k", "pcmu", "pcma"] = "pcm24k"
    # System text an adapter adds after replaying ``history`` into a fresh session ("" disables it).
    resume_note: str = RESUME_NOTE
    # The components of the ``pipeline`` provider (None: the provider's defaults from the environment).
    pipeline: PipelineSpec | None = None
    # The bot of a ``websocket`` profile (None: the worker's settings).
    bot: BotSpec | None = None
    # A recogniser of its own for answering-machine detection's words, whatever the provider (a pipeline ``stt``
    # component: gateway/session/amd_listen.py). None: the provider's own, if it offers one (the pipeline's STT).
    amd_stt: ComponentSpec | None = None
    # Profiles this agent may hand the caller to: each is a tool ``transfer_to_<name>`` (gateway/session/handoff.py).
    handoffs: tuple[str, ...] = ()
    # What the call is, set per call by the worker: from_number, to_number, call_id, direction, route. Adapters
    # that can tell their peer (the websocket provider's customParameters) pass it on.
    call_context: Mapping[str, str] = field(default_factory=dict)
    # Caller no-input (gateway/session/noinput.py): seconds of caller silence while the agent waits before the
    # agent says ``no_input_prompt``, then before it says ``no_input_goodbye`` and hangs up; 0 turns a step off.
    no_input_prompt_s: float = 0.0
    no_input_hangup_s: float = 0.0
    no_input_prompt: str = "Are you still there?"
    no_input_goodbye: str = "I have not heard from you, so I will end the call now. Goodbye."


# ------------------------------------------------------------------------------------------ history


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryItem:
    """One entry of the call's own transcript, replayed into a fresh provider session on resume.

    kind "message": role + text. kind "function_call": call_id, name, arguments (JSON text).
    kind "function_call_output": call_id, output (JSON text or plain text).
    """

    kind: Literal["message", "function_call", "function_call_output"]
    role: Literal["user", "assistant", "system"] = "user"
    text: str = ""
    call_id: str = ""
    name: str = ""
    arguments: str = ""
    output: str = ""


# ------------------------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderEvent:
    """Base of everything a provider session reports."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionStarted(ProviderEvent):
    """The provider session is configured and ready (OpenAI session.updated / Gemini setupComplete).

    ``resumed`` is True when the provider kept server-side state (Gemini resumption handle accepted).
    """

    session_id: str = ""
    resumed: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeechStarted(ProviderEvent):
    """The provider's VAD heard the caller start speaking (barge-in trigger)."""

    audio_start_ms: int = 0
    item_id: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeechStopped(ProviderEvent):
    audio_end_ms: int = 0
    item_id: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseStarted(ProviderEvent):
    response_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class AudioReceived(ProviderEvent):
    """A chunk of agent audio: 24 kHz mono PCM16 little-endian (any length, even number of bytes).

    ``item_id`` and ``content_index`` name what a truncate must point at.
    """

    response_id: str
    item_id: str
    content_index: int = 0
    pcm: bytes


#: ``(marker, cleared)``: see :class:`AudioMarked`.
MarkerReached = Callable[[str, bool], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class AudioMarked(ProviderEvent):
    """A point in the agent's audio, after every :class:`AudioReceived` before it.

    The session calls ``reached(marker, cleared)`` exactly once: ``cleared`` False in the media tick that takes
    the last frame holding audio from before the marker (at once when nothing is queued), ``cleared`` True when a
    barge-in drops that audio unplayed. A marker is forgotten, never called, when the playout is emptied because
    the connection goes away (resume). Called synchronously on the event loop: it must not block.
    """

    marker: str
    reached: MarkerReached


@dataclass(frozen=True, slots=True, kw_only=True)
class AudioDone(ProviderEvent):
    response_id: str
    item_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TranscriptReceived(ProviderEvent):
    """Text of what the caller (role "user") or the agent (role "assistant") said.

    ``final`` False is a partial delta; True carries the whole text of the item.
    """

    role: Literal["user", "assistant"]
    item_id: str
    text: str
    final: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallRequested(ProviderEvent):
    call_id: str
    name: str
    arguments: str  # JSON text as sent by the provider


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallsCancelled(ProviderEvent):
    """Gemini toolCallCancellation: the caller interrupted; results for these ids are no longer wanted."""

    call_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseInterrupted(ProviderEvent):
    """The provider itself stopped its output because the caller barged in (Gemini serverContent.interrupted)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseDone(ProviderEvent):
    response_id: str
    status: str  # completed | cancelled | failed | incomplete
    status_details: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeHandleUpdated(ProviderEvent):
    """Gemini sessionResumptionUpdate: reconnect with ``handle`` to keep server-side context."""

    handle: str
    resumable: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionExpiring(ProviderEvent):
    """The connection will end soon (Gemini goAway; OpenAI session nearing its 60 minute cap)."""

    time_left_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderNoticed(ProviderEvent):
    """A benign error the provider reported (e.g. response_cancel_not_active): logged, never call-fatal."""

    code: str
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderErrored(ProviderEvent):
    """A real error. ``fatal`` means this connection is unusable (resume needed)."""

    code: str
    message: str
    fatal: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderDisconnected(ProviderEvent):
    """The connection ended. Always the last event a session yields.

    ``retryable`` True: a new connection may continue the call (drop, session_expired, goAway).
    """

    reason: str
    retryable: bool


# ------------------------------------------------------------------------------------ capabilities


@dataclass(frozen=True, slots=True, kw_only=True)
class Capabilities:
    server_vad: bool = True  # emits SpeechStarted; without it the session runs its own VAD
    truncate: bool = True  # supports truncate_item (OpenAI); Gemini truncates server-side on interrupt
    resume_handle: bool = False  # keeps context across connections by handle (Gemini)
    max_connection_s: float | None = None  # known connection life (OpenAI 3600, Gemini ~600)
    g711_passthrough: bool = False
    # A quiet caller may be sent in larger messages (SessionConfig.inbound_quiet_chunk_ms): the provider answers
    # turns, not frames. False for an agent that answers every frame as it comes (the echo agent).
    quiet_chunks: bool = True
    # Says what it is asked to (create_response with instructions: a goodbye before the gateway hangs up).
    # False for the echo agent, whose only voice is the caller's own.
    speaks: bool = True


# ---------------------------------------------------------------------------------------- protocols


@runtime_checkable
class RealtimeSession(Protocol):
    """One provider connection for one call. All send methods are serialized by the adapter.

    Send methods raise :class:`gateway.providers.errors.ProviderClosedError` after the connection is gone.
    """

    async def send_audio(self, pcm: bytes) -> None:
        """Caller audio, 24 kHz mono PCM16 LE (one or more whole 20 ms frames) — or G.711 bytes in passthrough."""
        ...

    def send_audio_nowait(self, pcm: bytes) -> bool:
        """:meth:`send_audio` without waiting, from the media tick: True when the audio was handed to the
        connection; False when it would have to wait (a send in progress, a full write buffer), and the caller
        then awaits :meth:`send_audio` with the same audio instead. Raises like :meth:`send_audio`."""
        ...

    async def send_text(self, text: str, *, role: Literal["user", "system"] = "user") -> None:
        """Add a text item to the conversation (no response is requested)."""
        ...

    async def create_response(self, *, instructions: str | None = None) -> None: ...

    async def cancel_response(self) -> None: ...

    async def truncate_item(self, item_id: str, *, content_index: int, audio_end_ms: int) -> None:
        """Tell the provider the caller heard only ``audio_end_ms`` of the item's audio."""
        ...

    async def delete_item(self, item_id: str) -> None: ...

    async def send_tool_result(self, call_id: str, output: str, *, name: str = "") -> None:
        """Deliver a function result. Does not request a response by itself."""
        ...

    def events(self) -> AsyncIterator[ProviderEvent]:
        """The provider's events in order; ends after ProviderDisconnected."""
        ...

    async def aclose(self) -> None: ...


@runtime_checkable
class KeypadSession(Protocol):
    """A session that takes caller DTMF as keypresses (the websocket provider's ``dtmf`` message) instead of the
    text item every other provider gets."""

    async def send_dtmf(self, digit: str) -> None: ...


@runtime_checkable
class RealtimeModel(Protocol):
    """A configured provider. ``connect`` opens one session for one call."""

    name: str
    capabilities: Capabilities

    async def connect(
        self,
        profile: AgentProfile,
        *,
        history: tuple[HistoryItem, ...] = (),
        resume_handle: str | None = None,
    ) -> RealtimeSession:
        """Open and configure a session; replay ``history`` (text/tool items) when given.

        Raises ProviderConnectError (retryable or not) when the connection or setup fails.
        """
        ...
