"""Gemini Live adapter: the BidiGenerateContent websocket (one top-level key per message, camelCase).

Protocol facts in PROVIDERS.md; message shapes follow ``google.genai.types`` (LiveClientSetup,
LiveClientRealtimeInput, LiveClientContent, LiveClientToolResponse, LiveServerMessage).

Connect: send ``setup`` (model, AUDIO response modality, voice, system instruction, function declarations,
automatic activity detection, session resumption, sliding-window context compression, input and output
transcription) and wait for ``setupComplete``. With a resumption handle the server restores the conversation
(``SessionStarted(resumed=True)``); without one, a non-empty ``history`` is replayed as ``clientContent``
turns with ``turnComplete: false`` (the model does not answer it), followed by the profile's resume note.

Audio: caller frames (24 kHz) are resampled to the 16 kHz Gemini requires; agent audio arrives at 24 kHz in
``serverContent.modelTurn.parts[].inlineData``. Gemini has no item ids, so each model turn gets a synthetic,
stable id used as both ``response_id`` and ``item_id``. Barge-in is server-side: ``interrupted`` ends the
turn (ResponseInterrupted, then ResponseDone "cancelled"); truncate/delete/cancel have nothing to do and are
accepted as no-ops. ``goAway`` becomes ConnectionExpiring and makes the following close retryable;
``sessionResumptionUpdate`` becomes ResumeHandleUpdated.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import orjson
import pybase64

from gateway.providers._link import ProviderLink, close_is_retryable, open_websocket, receive_json, send_during_setup
from gateway.providers.base import (
    AgentProfile,
    AudioDone,
    AudioReceived,
    Capabilities,
    ConnectionExpiring,
    HistoryItem,
    ProviderDisconnected,
    ProviderEvent,
    ResponseDone,
    ResponseInterrupted,
    ResponseStarted,
    ResumeHandleUpdated,
    SessionStarted,
    ToolCallRequested,
    ToolCallsCancelled,
    TranscriptReceived,
)
from gateway.providers.errors import ProviderClosedError, ProviderConnectError
from telcodecs.resample import StreamResampler

DEFAULT_URL = (
    "wss://generativelanguage.googleapis.com/ws/"
    "google.ai.generativelanguage.v1beta.GenerativeService.BidiGenerateContent"
)
DEFAULT_MODEL = "gemini-2.5-flash-native-audio-preview-09-2025"
INPUT_MIME = "audio/pcm;rate=16000"


@dataclass(frozen=True, slots=True, kw_only=True)
class GeminiConfig:
    url: str = DEFAULT_URL
    api_key: str = ""
    model: str = DEFAULT_MODEL
    voice: str = "Puck"
    open_timeout_s: float = 10.0
    setup_timeout_s: float = 10.0
    event_queue_size: int = 256


class Downsampler24To16:
    """24 kHz caller frames -> the 16 kHz Gemini wants, through the shared streaming resampler.

    ``send_audio`` may carry several 20 ms frames at once (the session batches when it is behind); each is
    resampled in order through one :class:`telcodecs.resample.StreamResampler`, so the filter state runs
    across frames and batches and there is no click at a frame edge.
    """

    def __init__(self) -> None:
        self._resampler = StreamResampler(24000, 16000)

    def process(self, pcm: npt.NDArray[np.int16]) -> npt.NDArray[np.int16]:
        step = self._resampler.in_frame
        if pcm.size % step:
            raise ValueError(f"gemini: audio must be whole 20 ms frames of {step} samples, got {pcm.size}")
        parts = [self._resampler.process(pcm[i : i + step]) for i in range(0, pcm.size, step)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int16)


def parse_duration(value: Any) -> float:
    """Protobuf JSON durations ("50s", "1.5s", "0.000000001s") or {"seconds", "nanos"} -> seconds."""
    if isinstance(value, Mapping):
        return float(value.get("seconds", 0)) + float(value.get("nanos", 0)) / 1e9
    match = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)s\s*", str(value))
    if match is None:
        raise ValueError(f"not a protobuf duration: {value!r}")
    return float(match.group(1))


def setup_message(profile: AgentProfile, config: GeminiConfig, *, resume_handle: str | None) -> dict[str, Any]:
    model = profile.model or config.model
    setup: dict[str, Any] = {
        "model": model if model.startswith("models/") else f"models/{model}",
        "generationConfig": {
            "responseModalities": ["AUDIO"],
            "speechConfig": {"voiceConfig": {"prebuiltVoiceConfig": {"voiceName": profile.voice or config.voice}}},
        },
        "systemInstruction": {"parts": [{"text": profile.instructions}]},
        "realtimeInputConfig": {
            "automaticActivityDetection": {
                "disabled": False,
                "prefixPaddingMs": profile.turn_detection.prefix_padding_ms,
                "silenceDurationMs": profile.turn_detection.silence_duration_ms,
            },
            "activityHandling": "START_OF_ACTIVITY_INTERRUPTS",
        },
        "sessionResumption": {"handle": resume_handle} if resume_handle else {},
        "contextWindowCompression": {"slidingWindow": {}},
        "inputAudioTranscription": {},
        "outputAudioTranscription": {},
    }
    if profile.tools:
        declarations = [
            {"name": t.name, "description": t.description, "parametersJsonSchema": dict(t.parameters)}
            for t in profile.tools
        ]
        setup["tools"] = [{"functionDeclarations": declarations}]
    return {"setup": setup}


def _json_object(text: str) -> dict[str, Any]:
    """Tool outputs travel as objects; plain text (or a non-object JSON value) is wrapped as {"output": ...}."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {"output": text}
    return value if isinstance(value, dict) else {"output": value}


def history_content(history: Sequence[HistoryItem], *, resume_note: str) -> dict[str, Any]:
    """``clientContent`` replaying the call's transcript without asking for an answer."""
    names = {item.call_id: item.name for item in history if item.kind == "function_call"}
    turns: list[dict[str, Any]] = []
    for item in history:
        if item.kind == "function_call":
            call = {"id": item.call_id, "name": item.name, "args": _json_object(item.arguments or "{}")}
            turns.append({"role": "model", "parts": [{"functionCall": call}]})
        elif item.kind == "function_call_output":
            response = {"id": item.call_id, "name": names.get(item.call_id, ""), "response": _json_object(item.output)}
            turns.append({"role": "user", "parts": [{"functionResponse": response}]})
        else:
            # Gemini turns know only "user" and "model"; system notes ride as user text.
            turns.append({"role": "model" if item.role == "assistant" else "user", "parts": [{"text": item.text}]})
    if turns and resume_note:
        turns.append({"role": "user", "parts": [{"text": resume_note}]})
    return {"clientContent": {"turns": turns, "turnComplete": False}}


class _Translator:
    """Server messages -> provider events; synthesizes per-turn ids and whole-turn transcripts."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.call_names: dict[str, str] = {}
        self._turns = itertools.count(1)
        self._turn_id = ""
        self._assistant_text = ""
        self._user_item = ""
        self._user_text = ""
        self._going_away = False

    def translate(self, message: Mapping[str, Any]) -> Sequence[ProviderEvent]:
        events: list[ProviderEvent] = []
        if "serverContent" in message:
            self._server_content(message["serverContent"], events)
        if "toolCall" in message:
            for call in message["toolCall"].get("functionCalls") or ():
                self.call_names[call["id"]] = call["name"]
                arguments = orjson.dumps(call.get("args") or {}).decode()
                events.append(ToolCallRequested(call_id=call["id"], name=call["name"], arguments=arguments))
        if "toolCallCancellation" in message:
            events.append(ToolCallsCancelled(call_ids=tuple(message["toolCallCancellation"].get("ids") or ())))
        if "sessionResumptionUpdate" in message:
            update = message["sessionResumptionUpdate"]
            if update.get("newHandle"):
                events.append(ResumeHandleUpdated(handle=update["newHandle"], resumable=bool(update.get("resumable"))))
        if "goAway" in message:
            self._going_away = True
            events.append(ConnectionExpiring(time_left_s=parse_duration(message["goAway"].get("timeLeft", "0s"))))
        return events

    def _server_content(self, content: Mapping[str, Any], events: list[ProviderEvent]) -> None:
        heard = (content.get("inputTranscription") or {}).get("text")
        if heard:
            if not self._user_item:
                self._user_item = f"{self.session_id}_user_{next(self._turns)}"
            self._user_text += heard
            events.append(TranscriptReceived(role="user", item_id=self._user_item, text=heard, final=False))
        for part in (content.get("modelTurn") or {}).get("parts") or ():
            inline = part.get("inlineData")
            if inline and str(inline.get("mimeType", "audio/pcm")).startswith("audio/pcm"):
                turn_id = self._open_turn(events)
                pcm = pybase64.b64decode(inline["data"], validate=True)
                events.append(AudioReceived(response_id=turn_id, item_id=turn_id, content_index=0, pcm=pcm))
        said = (content.get("outputTranscription") or {}).get("text")
        if said:
            turn_id = self._open_turn(events)
            self._assistant_text += said
            events.append(TranscriptReceived(role="assistant", item_id=turn_id, text=said, final=False))
        if content.get("interrupted"):
            events.append(ResponseInterrupted())
            self._close_turn(events, status="cancelled", details="interrupted")
        if content.get("turnComplete"):
            self._close_turn(events, status="completed", details="")

    def _open_turn(self, events: list[ProviderEvent]) -> str:
        if not self._turn_id:
            self._finish_user_transcript(events)
            self._turn_id = f"{self.session_id}_turn_{next(self._turns)}"
            events.append(ResponseStarted(response_id=self._turn_id))
        return self._turn_id

    def _close_turn(self, events: list[ProviderEvent], *, status: str, details: str) -> None:
        self._finish_user_transcript(events)
        if not self._turn_id:
            return
        turn_id, self._turn_id = self._turn_id, ""
        events.append(AudioDone(response_id=turn_id, item_id=turn_id))
        if self._assistant_text:
            events.append(TranscriptReceived(role="assistant", item_id=turn_id, text=self._assistant_text, final=True))
            self._assistant_text = ""
        events.append(ResponseDone(response_id=turn_id, status=status, status_details=details))

    def _finish_user_transcript(self, events: list[ProviderEvent]) -> None:
        if self._user_item:
            events.append(TranscriptReceived(role="user", item_id=self._user_item, text=self._user_text, final=True))
            self._user_item, self._user_text = "", ""

    def disconnected(self, close_code: int | None, close_reason: str) -> ProviderDisconnected:
        if self._going_away:
            return ProviderDisconnected(reason="goAway", retryable=True)
        reason = f"closed by provider (code {close_code}{': ' + close_reason if close_reason else ''})"
        return ProviderDisconnected(reason=reason, retryable=close_is_retryable(close_code))


class GeminiSession:
    """One Gemini Live connection for one call. See :class:`gateway.providers.base.RealtimeSession`."""

    def __init__(self, link: ProviderLink, translator: _Translator) -> None:
        self._link = link
        self._translator = translator
        self._downsampler = Downsampler24To16()
        self.session_id = translator.session_id

    async def send_audio(self, pcm: bytes) -> None:
        if not self._link.is_open:
            raise ProviderClosedError("gemini: connection is closed")
        await self._link.send(self._audio_message(pcm))

    def send_audio_nowait(self, pcm: bytes) -> bool:
        if not self._link.writable():
            return False
        # Resample only once the write is certain: the downsampler's state must see each frame exactly once.
        return self._link.send_nowait(orjson.dumps(self._audio_message(pcm)))

    def _audio_message(self, pcm: bytes) -> dict[str, Any]:
        samples = self._downsampler.process(np.frombuffer(pcm, dtype="<i2"))
        data = pybase64.b64encode(samples.astype("<i2").tobytes()).decode("ascii")
        return {"realtimeInput": {"audio": {"data": data, "mimeType": INPUT_MIME}}}

    async def send_text(self, text: str, *, role: Literal["user", "system"] = "user") -> None:
        turn = {"role": "user", "parts": [{"text": text}]}
        await self._link.send({"clientContent": {"turns": [turn], "turnComplete": False}})

    async def create_response(self, *, instructions: str | None = None) -> None:
        """Gemini answers a completed client turn; ``instructions`` become that turn's text."""
        content: dict[str, Any] = {"turnComplete": True}
        if instructions:
            content["turns"] = [{"role": "user", "parts": [{"text": instructions}]}]
        await self._link.send({"clientContent": content})

    async def cancel_response(self) -> None:
        self._check_open()  # Gemini stops its own output when it detects the caller (serverContent.interrupted)

    async def truncate_item(self, item_id: str, *, content_index: int, audio_end_ms: int) -> None:
        self._check_open()  # the server already cut its context at the interruption

    async def delete_item(self, item_id: str) -> None:
        self._check_open()

    async def send_tool_result(self, call_id: str, output: str, *, name: str = "") -> None:
        response = {
            "id": call_id,
            "name": name or self._translator.call_names.get(call_id, ""),
            "response": _json_object(output),
        }
        await self._link.send({"toolResponse": {"functionResponses": [response]}})

    def events(self) -> AsyncIterator[ProviderEvent]:
        return self._link.events()

    async def aclose(self) -> None:
        await self._link.aclose()

    def _check_open(self) -> None:
        if not self._link.is_open:
            raise ProviderClosedError("gemini: connection is closed")


class GeminiLiveModel:
    """A configured Gemini Live endpoint. See :class:`gateway.providers.base.RealtimeModel`."""

    name = "gemini"

    def __init__(self, config: GeminiConfig) -> None:
        self.config = config
        self.capabilities = Capabilities(
            server_vad=True, truncate=False, resume_handle=True, max_connection_s=600.0, g711_passthrough=False
        )
        self._sessions = itertools.count(1)

    def headers(self) -> dict[str, str]:
        return {"x-goog-api-key": self.config.api_key} if self.config.api_key else {}

    async def connect(
        self,
        profile: AgentProfile,
        *,
        history: tuple[HistoryItem, ...] = (),
        resume_handle: str | None = None,
    ) -> GeminiSession:
        """Open and set up a session; resume by ``resume_handle`` or else replay ``history``."""
        if profile.audio_format != "pcm24k":
            raise ProviderConnectError("Gemini Live takes PCM only: no G.711 passthrough", retryable=False)
        config = self.config
        ws = await open_websocket(config.url, self.headers(), open_timeout=config.open_timeout_s)
        try:
            await send_during_setup(ws, setup_message(profile, config, resume_handle=resume_handle), during="setup")
            while "setupComplete" not in (
                reply := await receive_json(ws, wait_s=config.setup_timeout_s, during="setup")
            ):
                if "goAway" in reply:
                    raise ProviderConnectError("server is going away during setup", retryable=True)
            if history and not resume_handle:
                await send_during_setup(ws, history_content(history, resume_note=profile.resume_note), during="history")
        except BaseException:
            await ws.close()
            raise
        translator = _Translator(f"gemini_{next(self._sessions)}")
        link = ProviderLink(
            ws,
            name=translator.session_id,
            translate=translator.translate,
            disconnected=translator.disconnected,
            queue_size=config.event_queue_size,
        )
        link.start((SessionStarted(session_id=translator.session_id, resumed=bool(resume_handle)),))
        return GeminiSession(link, translator)
