"""OpenAI Realtime GA adapter over a websocket (also Azure OpenAI and xAI, by URL and auth header).

Protocol: the GA event set of ``/v1/realtime`` as modelled by the ``openai`` SDK (``openai.types.realtime``),
summarised in PROVIDERS.md. No ``OpenAI-Beta`` header: beta event names are refused by the server.

Connect: open ``<url>?model=<model>``, wait for ``session.created``, send one ``session.update`` (voice,
instructions, tools, audio format, server VAD, input transcription), wait for ``session.updated``, replay the
call's own transcript as ``conversation.item.create`` when continuing a call, then hand the socket to a
:class:`~gateway.providers._link.ProviderLink`.

Turn detection: ``create_response`` is on (the server answers when the caller stops) and ``interrupt_response``
is off by default. The gateway, not the server, owns barge-in: only the gateway knows how much agent audio the
caller actually heard, it sends ``response.cancel`` and the truncate at that point, and a server-side cancel
racing our own would only add ``response_cancel_not_active`` noise. :attr:`OpenAIConfig.interrupt_response`
turns it on for deployments whose session core leaves cancellation to the server.

Truncation: the server drops the transcript of an item it truncates but reports only ``audio_end_ms``
(``conversation.item.truncated``). The translator keeps each recent item's transcript and the audio received for
it, estimates the words heard (:func:`gateway.providers.pipeline.words.estimate_words`: characters spread over
the audio, a word counts once its start played) and reports that prefix as the item's final transcript, so the
call's own transcript, and a resume that replays it, hold only what the caller heard.

Errors: benign codes (a cancel or truncate that lost a race, a response.create while one is active) become
:class:`ProviderNoticed`; ``session_expired`` and a second ``session.created`` (the server silently replaced the
session: state lost) are fatal and end the connection with ``ProviderDisconnected(retryable=True)``.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pybase64
from websockets.asyncio.client import ClientConnection

from gateway.providers._link import (
    ProviderLink,
    close_is_retryable,
    open_websocket,
    receive_json,
    send_during_setup,
)
from gateway.providers.base import (
    AgentProfile,
    AudioDone,
    AudioReceived,
    Capabilities,
    HistoryItem,
    ProviderDisconnected,
    ProviderErrored,
    ProviderEvent,
    ProviderNoticed,
    ResponseDone,
    ResponseStarted,
    SessionStarted,
    SpeechStarted,
    SpeechStopped,
    ToolCallRequested,
    TranscriptReceived,
)
from gateway.providers.errors import ProviderConnectError
from gateway.providers.pipeline.words import estimate_words, heard_prefix

DEFAULT_URL = "wss://api.openai.com/v1/realtime"
DEFAULT_MODEL = "gpt-realtime"

# Error codes that report a race the gateway expects, never a broken call.
BENIGN_ERROR_CODES = frozenset({"response_cancel_not_active", "conversation_already_has_active_response"})
# A truncate that lands after the item's audio already ended ("Audio content of X ms is already shorter than
# Y ms") carries a generic code; the message is the only stable marker.
BENIGN_ERROR_FRAGMENT = "already shorter than"
FATAL_ERROR_CODES = frozenset({"session_expired"})
# input_audio_buffer.append around its base64 audio (orjson's key order for the dict send_audio builds).
_APPEND_HEAD = b'{"type":"input_audio_buffer.append","audio":"'
_APPEND_TAIL = b'"}'

_AUDIO_FORMATS: Mapping[str, Mapping[str, Any]] = {
    "pcm24k": {"type": "audio/pcm", "rate": 24000},
    "pcmu": {"type": "audio/pcmu"},
    "pcma": {"type": "audio/pcma"},
}


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenAIConfig:
    """Where and how to reach an OpenAI-Realtime-compatible endpoint.

    ``auth_header``/``auth_scheme`` make Azure work (``api-key`` header, empty scheme); xAI uses the defaults.
    An empty ``api_key`` sends no auth header (the local fake server needs none).
    """

    url: str = DEFAULT_URL
    api_key: str = ""
    auth_header: str = "Authorization"
    auth_scheme: str = "Bearer "
    model: str = DEFAULT_MODEL
    voice: str = "marin"
    transcription_model: str = "gpt-4o-mini-transcribe"
    interrupt_response: bool = False
    extra_headers: Mapping[str, str] = field(default_factory=dict)
    open_timeout_s: float = 10.0
    setup_timeout_s: float = 10.0
    event_queue_size: int = 256


def build_url(base_url: str, model: str) -> str:
    """Add ``model=`` to the endpoint URL, keeping any query it already has (Azure's ``api-version``)."""
    parts = urlsplit(base_url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "model"]
    if model:
        query.append(("model", model))
    return urlunsplit(parts._replace(query=urlencode(query)))


def session_config(profile: AgentProfile, config: OpenAIConfig) -> dict[str, Any]:
    """The ``session`` object of the ``session.update`` we send (GA shape)."""
    audio_format = dict(_AUDIO_FORMATS[profile.audio_format])
    detection = profile.turn_detection
    turn_detection: dict[str, Any] | None
    if detection.kind == "server_vad":
        turn_detection = {
            "type": "server_vad",
            "threshold": detection.threshold,
            "prefix_padding_ms": detection.prefix_padding_ms,
            "silence_duration_ms": detection.silence_duration_ms,
            "create_response": True,
            "interrupt_response": config.interrupt_response,
        }
    elif detection.kind == "semantic_vad":
        turn_detection = {
            "type": "semantic_vad",
            "eagerness": "auto",
            "create_response": True,
            "interrupt_response": config.interrupt_response,
        }
    else:
        turn_detection = None
    audio_input: dict[str, Any] = {"format": audio_format, "turn_detection": turn_detection}
    if config.transcription_model:
        audio_input["transcription"] = {"model": config.transcription_model}
    return {
        "type": "realtime",
        "instructions": profile.instructions,
        "output_modalities": ["audio"],
        "audio": {
            "input": audio_input,
            "output": {"format": dict(audio_format), "voice": profile.voice or config.voice},
        },
        "tools": [
            {"type": "function", "name": t.name, "description": t.description, "parameters": dict(t.parameters)}
            for t in profile.tools
        ],
    }


def history_events(history: Sequence[HistoryItem], *, resume_note: str) -> list[dict[str, Any]]:
    """``conversation.item.create`` events replaying the call's transcript, then the resume note."""
    events = [{"type": "conversation.item.create", "item": history_item(item)} for item in history]
    if history and resume_note:
        note = HistoryItem(kind="message", role="system", text=resume_note)
        events.append({"type": "conversation.item.create", "item": history_item(note)})
    return events


def history_item(item: HistoryItem) -> dict[str, Any]:
    if item.kind == "function_call":
        return {"type": "function_call", "call_id": item.call_id, "name": item.name, "arguments": item.arguments}
    if item.kind == "function_call_output":
        return {"type": "function_call_output", "call_id": item.call_id, "output": item.output}
    part_type = "output_text" if item.role == "assistant" else "input_text"
    return {"type": "message", "role": item.role, "content": [{"type": part_type, "text": item.text}]}


class _SpokenItem:
    """An assistant item's transcript and received audio, until a truncate may need them."""

    __slots__ = ("audio_bytes", "text", "truncated_ms")

    def __init__(self) -> None:
        self.audio_bytes = 0
        self.text = ""
        self.truncated_ms: int | None = None


class _Translator:
    """Server events -> provider events. Holds the little state the mapping needs."""

    KEPT_ITEMS = 32  # recent assistant items a truncate may still point at

    def __init__(self, session_id: str, *, bytes_per_ms: int = 48) -> None:
        self.session_id = session_id
        self.fatal_code = ""
        self._bytes_per_ms = bytes_per_ms
        self._items: OrderedDict[str, _SpokenItem] = OrderedDict()

    def _item(self, item_id: str) -> _SpokenItem:
        item = self._items.get(item_id)
        if item is None:
            item = self._items[item_id] = _SpokenItem()
            while len(self._items) > self.KEPT_ITEMS:
                self._items.popitem(last=False)
        return item

    def heard(self, item: _SpokenItem) -> str:
        """The words of the item whose audio started before the truncate point (characters spread over audio)."""
        assert item.truncated_ms is not None
        duration = item.audio_bytes // self._bytes_per_ms
        words = estimate_words(item.text, char_offset=0, start_ms=0, duration_ms=duration)
        return heard_prefix(item.text, words, item.truncated_ms)

    def translate(self, message: Mapping[str, Any]) -> Sequence[ProviderEvent]:
        kind = message.get("type")
        if kind == "response.output_audio.delta":
            pcm = pybase64.b64decode(message["delta"], validate=True)
            self._item(message["item_id"]).audio_bytes += len(pcm)
            return (
                AudioReceived(
                    response_id=message["response_id"],
                    item_id=message["item_id"],
                    content_index=int(message.get("content_index", 0)),
                    pcm=pcm,
                ),
            )
        if kind == "conversation.item.truncated":
            item = self._item(message["item_id"])
            item.truncated_ms = int(message["audio_end_ms"])
            return (
                TranscriptReceived(role="assistant", item_id=message["item_id"], text=self.heard(item), final=True),
            )
        if kind == "response.output_audio.done":
            return (AudioDone(response_id=message["response_id"], item_id=message["item_id"]),)
        if kind == "input_audio_buffer.speech_started":
            return (SpeechStarted(audio_start_ms=int(message["audio_start_ms"]), item_id=message.get("item_id", "")),)
        if kind == "input_audio_buffer.speech_stopped":
            return (SpeechStopped(audio_end_ms=int(message["audio_end_ms"]), item_id=message.get("item_id", "")),)
        if kind == "response.created":
            return (ResponseStarted(response_id=message["response"].get("id") or ""),)
        if kind == "response.done":
            return (self._response_done(message["response"]),)
        if kind == "response.output_audio_transcript.delta":
            item = self._item(message["item_id"])
            item.text += message["delta"]
            if item.truncated_ms is not None:
                return ()  # the caller never heard it
            return (
                TranscriptReceived(role="assistant", item_id=message["item_id"], text=message["delta"], final=False),
            )
        if kind == "response.output_audio_transcript.done":
            item = self._item(message["item_id"])
            item.text = message["transcript"]
            text = item.text if item.truncated_ms is None else self.heard(item)
            return (TranscriptReceived(role="assistant", item_id=message["item_id"], text=text, final=True),)
        if kind == "conversation.item.input_audio_transcription.delta":
            text = message.get("delta") or ""
            return (TranscriptReceived(role="user", item_id=message["item_id"], text=text, final=False),)
        if kind == "conversation.item.input_audio_transcription.completed":
            text = message["transcript"]
            return (TranscriptReceived(role="user", item_id=message["item_id"], text=text, final=True),)
        if kind == "response.function_call_arguments.done":
            return (
                ToolCallRequested(call_id=message["call_id"], name=message["name"], arguments=message["arguments"]),
            )
        if kind == "error":
            return (self._error(message.get("error") or {}),)
        if kind == "session.created":
            # The server replaced our session behind the same socket: configuration and context are gone.
            self.fatal_code = "session_recreated"
            return (ProviderErrored(code="session_recreated", message="server created a new session", fatal=True),)
        # conversation.item.*, response.output_item.*, content_part.*, rate_limits.updated, session.updated, ...
        return ()

    def _response_done(self, response: Mapping[str, Any]) -> ResponseDone:
        details = response.get("status_details") or {}
        error = details.get("error") or {}
        detail_text = details.get("reason") or error.get("message") or error.get("code") or ""
        return ResponseDone(
            response_id=response.get("id") or "",
            status=response.get("status") or "completed",
            status_details=detail_text,
        )

    def _error(self, error: Mapping[str, Any]) -> ProviderEvent:
        code = error.get("code") or error.get("type") or "error"
        message = error.get("message") or ""
        if code in BENIGN_ERROR_CODES or BENIGN_ERROR_FRAGMENT in message:
            return ProviderNoticed(code=code, message=message)
        if code in FATAL_ERROR_CODES:
            self.fatal_code = code
            return ProviderErrored(code=code, message=message, fatal=True)
        return ProviderErrored(code=code, message=message, fatal=False)

    def disconnected(self, close_code: int | None, close_reason: str) -> ProviderDisconnected:
        if self.fatal_code:
            # Expiry and a replaced session lose server state, but a new connection can carry on the call.
            return ProviderDisconnected(reason=self.fatal_code, retryable=True)
        reason = f"closed by provider (code {close_code}{': ' + close_reason if close_reason else ''})"
        return ProviderDisconnected(reason=reason, retryable=close_is_retryable(close_code))


class OpenAISession:
    """One OpenAI Realtime connection for one call. See :class:`gateway.providers.base.RealtimeSession`."""

    def __init__(self, link: ProviderLink, *, session_id: str) -> None:
        self._link = link
        self.session_id = session_id
        self._event_ids = itertools.count(1)

    async def send_audio(self, pcm: bytes) -> None:
        await self._link.send({"type": "input_audio_buffer.append", "audio": pybase64.b64encode(pcm).decode("ascii")})

    def send_audio_nowait(self, pcm: bytes) -> bool:
        # The same message as send_audio, written out by hand: base64 needs no JSON escaping, and this runs
        # for every call on every tick.
        return self._link.send_nowait(_APPEND_HEAD + pybase64.b64encode(pcm) + _APPEND_TAIL)

    async def send_text(self, text: str, *, role: Literal["user", "system"] = "user") -> None:
        item = history_item(HistoryItem(kind="message", role=role, text=text))
        await self._link.send({"type": "conversation.item.create", "item": item})

    async def create_response(self, *, instructions: str | None = None) -> None:
        message: dict[str, Any] = {"type": "response.create"}
        if instructions:
            message["response"] = {"instructions": instructions}
        await self._link.send(message)

    async def cancel_response(self) -> None:
        await self._link.send({"type": "response.cancel"})

    async def truncate_item(self, item_id: str, *, content_index: int, audio_end_ms: int) -> None:
        await self._link.send(
            {
                "type": "conversation.item.truncate",
                "item_id": item_id,
                "content_index": content_index,
                "audio_end_ms": max(0, int(audio_end_ms)),
            }
        )

    async def delete_item(self, item_id: str) -> None:
        await self._link.send({"type": "conversation.item.delete", "item_id": item_id})

    async def send_tool_result(self, call_id: str, output: str, *, name: str = "") -> None:
        await self._link.send(
            {
                "type": "conversation.item.create",
                "item": {"type": "function_call_output", "call_id": call_id, "output": output},
            }
        )

    def events(self) -> AsyncIterator[ProviderEvent]:
        return self._link.events()

    async def aclose(self) -> None:
        await self._link.aclose()


class OpenAIRealtimeModel:
    """A configured OpenAI-compatible endpoint. See :class:`gateway.providers.base.RealtimeModel`."""

    name = "openai"

    def __init__(self, config: OpenAIConfig) -> None:
        self.config = config
        self.capabilities = Capabilities(
            server_vad=True, truncate=True, resume_handle=False, max_connection_s=3600.0, g711_passthrough=True
        )

    def headers(self) -> dict[str, str]:
        headers = dict(self.config.extra_headers)
        if self.config.api_key:
            headers[self.config.auth_header] = f"{self.config.auth_scheme}{self.config.api_key}"
        return headers

    async def connect(
        self,
        profile: AgentProfile,
        *,
        history: tuple[HistoryItem, ...] = (),
        resume_handle: str | None = None,
    ) -> OpenAISession:
        """Open, configure and (when ``history`` is non-empty) re-seed a session.

        ``resume_handle`` is accepted for the protocol's sake and ignored: OpenAI keeps no state across
        connections, so continuing a call always means replaying ``history``.
        """
        config = self.config
        url = build_url(config.url, profile.model or config.model)
        ws = await open_websocket(url, self.headers(), open_timeout=config.open_timeout_s)
        failure: BaseException | None = None
        session_id = ""
        try:
            created = await self._expect(ws, "session.created")
            session_id = str((created.get("session") or {}).get("id") or "")
            update = {"type": "session.update", "session": session_config(profile, config)}
            await send_during_setup(ws, update, during="session.update")
            await self._expect(ws, "session.updated")
            for event in history_events(history, resume_note=profile.resume_note):
                await send_during_setup(ws, event, during="history replay")
        except BaseException as exc:
            failure = exc
        if failure is not None:
            # Awaited outside the except block: a compiled (mypyc) coroutine suspended inside one leaves its
            # exception as the thread's current one, and a later bare `raise` or `finally` elsewhere re-raises it.
            await ws.close()
            raise failure
        translator = _Translator(session_id, bytes_per_ms=48 if profile.audio_format == "pcm24k" else 8)
        link = ProviderLink(
            ws,
            name=f"openai-{session_id or 'session'}",
            translate=translator.translate,
            disconnected=translator.disconnected,
            queue_size=config.event_queue_size,
        )
        link.start((SessionStarted(session_id=session_id, resumed=False),))
        return OpenAISession(link, session_id=session_id)

    async def _expect(self, ws: ClientConnection, wanted: str) -> dict[str, Any]:
        """Wait for one server event during setup; an ``error`` aborts the connect."""
        while True:
            message = await receive_json(ws, wait_s=self.config.setup_timeout_s, during=f"waiting for {wanted}")
            kind = message.get("type")
            if kind == wanted:
                return message
            if kind == "error":
                error = message.get("error") or {}
                code = error.get("code") or error.get("type") or "error"
                retryable = code in FATAL_ERROR_CODES or error.get("type") == "server_error"
                raise ProviderConnectError(f"{code}: {error.get('message', '')}", retryable=retryable)
            # Anything else before the handshake completes (rate_limits.updated, ...) carries nothing we need.
