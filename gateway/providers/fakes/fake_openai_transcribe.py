"""A local OpenAI Realtime *transcription* session (``/v1/realtime?intent=transcription``) for tests and load.

It speaks the GA event set of the ``openai`` SDK (``openai.types.realtime``) for ``type: "transcription"``
sessions: ``session.created`` on connect, ``session.updated`` for ``session.update``, and over
``input_audio_buffer.append`` (24 kHz PCM16) an energy VAD (:class:`gateway.providers.fake_audio.EnergyVad`,
with the session's ``silence_duration_ms``) that emits ``input_audio_buffer.speech_started`` /
``speech_stopped`` / ``committed``, then the turn's scripted transcript as
``conversation.item.input_audio_transcription.delta`` events (one per word) and ``.completed``. With
``turn_detection: null`` nothing is committed until the client sends ``input_audio_buffer.commit``; an empty
commit gets the ``input_audio_buffer_commit_empty`` error, as the service answers. A handshake without
``Authorization: Bearer <api_key>`` (when set) is refused with 401. Faults and records:
:mod:`gateway.providers.fakes.vendor_server`.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Any

import pybase64

from gateway.providers import fake_audio
from gateway.providers.fakes.vendor_server import FakeLink, Faults, VendorRecord, VendorServer, bearer_or_token


@dataclass(frozen=True, slots=True, kw_only=True)
class TranscribeOptions:
    transcripts: tuple[str, ...] = ("hello world",)
    vad_threshold_dbfs: float = -45.0


class _Session:
    def __init__(self, link: FakeLink, options: TranscribeOptions) -> None:
        self.link = link
        self.options = options
        self.ids = itertools.count(1)
        self.session: dict[str, Any] = {
            "type": "transcription",
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": 24000},
                    "transcription": {"model": "gpt-4o-mini-transcribe"},
                    "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
                }
            },
        }
        self.vad = self._new_vad()
        self.buffered_ms = 0
        self.turns = 0
        self.previous_item: str | None = None
        self.item = ""

    def _new_vad(self) -> fake_audio.EnergyVad:
        detection = self.session["audio"]["input"].get("turn_detection") or {}
        return fake_audio.EnergyVad(
            "audio/pcm",
            threshold_dbfs=self.options.vad_threshold_dbfs,
            silence_ms=int(detection.get("silence_duration_ms", 500)),
        )

    def event_id(self) -> str:
        return f"event_{next(self.ids)}"

    async def send(self, kind: str, **fields: Any) -> None:
        await self.link.send({"type": kind, "event_id": self.event_id(), **fields})

    async def on_message(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "session.update":
            session = message.get("session")
            if not isinstance(session, dict) or session.get("type") != "transcription":
                await self.error("invalid_request_error", "invalid_value", "session.type must be transcription")
                return
            audio_input = (session.get("audio") or {}).get("input") or {}
            merged = dict(self.session["audio"]["input"])
            merged.update(audio_input)
            self.session = {"type": "transcription", "audio": {"input": merged}}
            self.vad = self._new_vad()
            await self.send("session.updated", session=self.session)
        elif kind == "input_audio_buffer.append":
            audio = pybase64.b64decode(str(message.get("audio", "")))
            self.link.record.add_audio(audio, frame=False)
            self.buffered_ms += len(audio) // 48
            if self.session["audio"]["input"].get("turn_detection") is None:
                return
            for decision in self.vad.feed(audio):
                if decision.kind == "started":
                    self.item = f"item_{next(self.ids)}"
                    await self.send("input_audio_buffer.speech_started", audio_start_ms=decision.ms, item_id=self.item)
                else:
                    await self.send("input_audio_buffer.speech_stopped", audio_end_ms=decision.ms, item_id=self.item)
                    await self.commit()
        elif kind == "input_audio_buffer.commit":
            if not self.buffered_ms:
                await self.error("invalid_request_error", "input_audio_buffer_commit_empty", "buffer too small")
                return
            self.item = self.item or f"item_{next(self.ids)}"
            await self.commit()
        elif kind == "input_audio_buffer.clear":
            self.buffered_ms = 0
            await self.send("input_audio_buffer.cleared")
        else:
            await self.error("invalid_request_error", "unknown_event", f"unsupported event type {kind!r}")

    async def commit(self) -> None:
        item, self.item = self.item, ""
        self.buffered_ms = 0
        await self.send("input_audio_buffer.committed", item_id=item, previous_item_id=self.previous_item)
        self.previous_item = item
        text = self.options.transcripts[self.turns % len(self.options.transcripts)]
        self.turns += 1
        words = text.split()
        for index, word in enumerate(words):
            delta = word if index == 0 else " " + word
            await self.send(
                "conversation.item.input_audio_transcription.delta", item_id=item, content_index=0, delta=delta
            )
        usage = {"type": "duration", "seconds": 1.0}
        await self.send(
            "conversation.item.input_audio_transcription.completed",
            item_id=item,
            content_index=0,
            transcript=text,
            usage=usage,
        )

    async def error(self, kind: str, code: str, message: str) -> None:
        await self.send("error", error={"type": kind, "code": code, "message": message})


class FakeOpenAITranscribeServer:
    """``async with FakeOpenAITranscribeServer() as fake``; the SDK's ``websocket_base_url`` is :attr:`base_url`."""

    def __init__(
        self,
        options: TranscribeOptions | None = None,
        *,
        faults: Faults | None = None,
        api_key: str | None = None,
        port: int = 0,
        keep_messages: bool = True,
    ) -> None:
        self.options = options or TranscribeOptions()
        auth = None if api_key is None else (lambda h, q: bearer_or_token(h, "Bearer", api_key))
        self.server = VendorServer(self._serve, faults=faults, auth=auth, port=port, keep_messages=keep_messages)

    @property
    def base_url(self) -> str:
        return f"ws://127.0.0.1:{self.server.port}/v1"

    @property
    def url(self) -> str:
        return f"{self.base_url}/realtime"

    def record(self, conn_id: int) -> VendorRecord:
        return self.server.record(conn_id)

    async def __aenter__(self) -> FakeOpenAITranscribeServer:
        await self.server.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.server.aclose()

    async def _serve(self, link: FakeLink) -> None:
        options = self.options
        if "transcript" in link.query:
            options = dataclasses.replace(options, transcripts=tuple(link.query["transcript"].split("|")))
        session = _Session(link, options)
        if link.query.get("intent") != "transcription":
            await session.error("invalid_request_error", "invalid_intent", "this fake serves intent=transcription")
            await link.close(1008, "intent=transcription only")
            return
        await session.send("session.created", session=session.session)
        async for message in link.messages():
            if isinstance(message, bytes) or "__malformed__" in message:
                await session.error("invalid_request_error", "invalid_json", "expected a JSON text message")
                continue
            await session.on_message(message)
