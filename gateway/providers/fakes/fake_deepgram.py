"""A local Deepgram live STT websocket (``/v1/listen``) for tests and load: energy VAD, scripted transcripts.

It speaks the protocol of the ``deepgram-sdk`` 7.x (``listen/v1``): the query (``encoding`` linear16/mulaw/alaw,
``sample_rate``, ``interim_results``, ``endpointing`` ms or ``false``, ``utterance_end_ms``, ``vad_events``, ...),
binary audio frames and the text messages ``KeepAlive``, ``Finalize`` and ``CloseStream``; it answers with
``Results``, ``SpeechStarted``, ``UtteranceEnd`` and ``Metadata``. A query it cannot serve is refused with 400,
a handshake without ``Authorization: Token <api_key>`` (or ``Bearer``) with 401 when ``api_key`` is set.

What it hears: a 20 ms RMS energy VAD (``vad_threshold_dbfs``) over the decoded audio. Speech onset gives
``SpeechStarted`` (``vad_events=true``). Each utterance is given the next scripted transcript (``transcripts``;
the query parameter ``transcript`` sets one, ``|`` separating several), whose words are spread evenly over the
voiced audio: interim ``Results`` every ``interim_ms`` of speech reveal the words heard so far
(``interim_results=true``); after ``endpointing`` ms of silence the final ``Results`` (``is_final`` and
``speech_final``) carries them all; after ``utterance_end_ms`` of silence since the last word comes
``UtteranceEnd``. ``Finalize`` finalizes the utterance at once (``from_finalize: true``; an empty one when
there is nothing to finalize). Silence is confirmed with an empty final ``Results`` every ``silence_final_ms``,
as the service does, so a client always learns how far the audio was processed (``start + duration``).

``CloseStream`` finalizes what is pending, sends ``Metadata`` and closes with 1000. No audio and no message for
``idle_timeout_s`` closes with 1011 ``NET-0001``, as the service does after 10 s. Times are seconds of audio
since the connection began. Faults and records: :mod:`gateway.providers.fakes.vendor_server`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from gateway.providers import fake_audio
from gateway.providers.fakes.vendor_server import FakeLink, Faults, VendorRecord, VendorServer, with_query

_ENCODINGS = {"linear16": None, "mulaw": "audio/pcmu", "alaw": "audio/pcma"}
_FRAME_MS = 20
_MODEL_INFO = {"name": "fake-nova", "version": "2026-12-07", "arch": "fake"}


@dataclass(frozen=True, slots=True, kw_only=True)
class DeepgramOptions:
    transcripts: tuple[str, ...] = ("hello world",)
    vad_threshold_dbfs: float = -45.0
    interim_ms: int = 500
    silence_final_ms: int = 2000
    idle_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if not self.transcripts or self.interim_ms <= 0 or self.silence_final_ms <= 0:
            raise ValueError("transcripts must be non-empty, interim_ms and silence_final_ms positive")


def check_query(query: Mapping[str, str]) -> str:
    """The problem with a ``/v1/listen`` query the fake (and the service) would refuse, or ""."""
    encoding = query.get("encoding", "linear16")
    if encoding not in _ENCODINGS:
        return f"unsupported encoding {encoding!r}"
    try:
        rate = int(query.get("sample_rate", "16000"))
    except ValueError:
        return "sample_rate must be an integer"
    if encoding != "linear16" and rate != 8000:
        return f"{encoding} needs sample_rate 8000"
    if rate not in (8000, 16000, 24000, 48000):
        return f"unsupported sample_rate {rate}"
    endpointing = query.get("endpointing", "10")
    if endpointing != "false" and not endpointing.isdigit():
        return "endpointing must be milliseconds or false"
    return ""


@dataclass(slots=True)
class _Utterance:
    words: list[str]
    start_ms: int
    voiced_ms: int = 0
    last_voice_end_ms: int = 0
    revealed: int = 0
    final_sent: bool = False
    last_interim_ms: int = 0


@dataclass(slots=True)
class _Listener:
    """One connection's recogniser state (sans-I/O: audio and messages in, server messages out)."""

    options: DeepgramOptions
    query: Mapping[str, str]
    encoding: str | None = None
    rate: int = 16000
    pending: bytearray = field(default_factory=bytearray)
    position_ms: int = 0  # audio heard so far
    confirmed_ms: int = 0  # end of the last final result
    utterances: int = 0
    current: _Utterance | None = None
    last_word_end_ms: int | None = None  # for UtteranceEnd
    request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    digest: Any = field(default_factory=hashlib.sha256)  # of the audio heard, for Metadata.sha256

    def __post_init__(self) -> None:
        self.encoding = _ENCODINGS[self.query.get("encoding", "linear16")]
        self.rate = int(self.query.get("sample_rate", "16000"))

    def flag(self, name: str) -> bool:
        return self.query.get(name, "false").lower() == "true"

    @property
    def endpointing_ms(self) -> int | None:
        raw = self.query.get("endpointing", "10")
        return None if raw == "false" else int(raw)

    def audio(self, data: bytes) -> list[dict[str, Any]]:
        self.digest.update(data)
        self.pending += data
        width = 1 if self.encoding else 2
        frame_bytes = self.rate * _FRAME_MS // 1000 * width
        out: list[dict[str, Any]] = []
        while len(self.pending) >= frame_bytes:
            frame = bytes(self.pending[:frame_bytes])
            del self.pending[:frame_bytes]
            out += self._frame(self._loud(frame))
        return out

    def _loud(self, frame: bytes) -> bool:
        if self.encoding is None:
            samples = np.frombuffer(frame, dtype="<i2").astype(np.float64)
        else:
            samples = fake_audio.decode(self.encoding, frame).astype(np.float64)  # type: ignore[arg-type]
        energy = float(np.dot(samples, samples)) / max(samples.size, 1)
        return bool(energy > 32768.0**2 * 10.0 ** (self.options.vad_threshold_dbfs / 10.0))

    def _frame(self, loud: bool) -> list[dict[str, Any]]:
        start = self.position_ms
        self.position_ms += _FRAME_MS
        out: list[dict[str, Any]] = []
        utterance = self.current
        if loud:
            if utterance is None:
                script = self.options.transcripts[self.utterances % len(self.options.transcripts)]
                self.utterances += 1
                utterance = self.current = _Utterance(words=script.split(), start_ms=start)
                if self.flag("vad_events"):
                    out.append({"type": "SpeechStarted", "channel": [0, 1], "timestamp": start / 1000})
            if utterance.final_sent:
                return out  # finalized early: the rest of this speech belongs to it
            utterance.voiced_ms += _FRAME_MS
            utterance.last_voice_end_ms = self.position_ms
            if (
                self.flag("interim_results")
                and utterance.voiced_ms - utterance.last_interim_ms >= self.options.interim_ms
            ):
                utterance.last_interim_ms = utterance.voiced_ms
                utterance.revealed = min(len(utterance.words), utterance.voiced_ms // 300)
                if utterance.revealed:
                    out.append(self._results(utterance, is_final=False))
            return out
        if utterance is not None:
            silence = self.position_ms - utterance.last_voice_end_ms
            endpoint = self.endpointing_ms
            if not utterance.final_sent and endpoint is not None and silence >= max(endpoint, _FRAME_MS):
                out.append(self._final(utterance, speech_final=True))
            if utterance.final_sent and silence >= max(endpoint or 0, _FRAME_MS):
                self.current = None
        out += self._utterance_end()
        if self.current is None and self.position_ms - self.confirmed_ms >= self.options.silence_final_ms:
            out.append(self._empty_final(from_finalize=False))
        return out

    def _utterance_end(self) -> list[dict[str, Any]]:
        gap = self.query.get("utterance_end_ms")
        if gap is None or self.last_word_end_ms is None or not self.flag("interim_results"):
            return []
        if self.current is not None and not self.current.final_sent:
            return []
        if self.position_ms - self.last_word_end_ms < int(gap):
            return []
        last, self.last_word_end_ms = self.last_word_end_ms, None
        return [{"type": "UtteranceEnd", "channel": [0, 1], "last_word_end": last / 1000}]

    def finalize(self) -> list[dict[str, Any]]:
        utterance = self.current
        if utterance is not None and not utterance.final_sent:
            return [self._final(utterance, speech_final=False, from_finalize=True)]
        return [self._empty_final(from_finalize=True)]

    def close_stream(self) -> list[dict[str, Any]]:
        out = []
        if self.current is not None and not self.current.final_sent:
            out.append(self._final(self.current, speech_final=True))
        out.append(
            {
                "type": "Metadata",
                "transaction_key": "deprecated",
                "request_id": self.request_id,
                "sha256": self.digest.hexdigest(),
                "created": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                "duration": self.position_ms / 1000,
                "channels": 1,
            }
        )
        return out

    def _final(self, utterance: _Utterance, *, speech_final: bool, from_finalize: bool = False) -> dict[str, Any]:
        utterance.revealed = len(utterance.words)
        utterance.final_sent = True
        message = self._results(utterance, is_final=True, speech_final=speech_final)
        if from_finalize:
            message["from_finalize"] = True
        if utterance.words:
            self.last_word_end_ms = utterance.last_voice_end_ms
        return message

    def _results(self, utterance: _Utterance, *, is_final: bool, speech_final: bool = False) -> dict[str, Any]:
        words = utterance.words[: utterance.revealed]
        span = max(utterance.last_voice_end_ms - utterance.start_ms, _FRAME_MS)
        each = span / max(len(utterance.words), 1)
        start_s = self.confirmed_ms / 1000  # results tile the audio: each starts where the last final ended
        end_ms = self.position_ms
        if is_final:
            self.confirmed_ms = end_ms
        return self._message(
            start_s,
            end_ms / 1000 - start_s,
            " ".join(words),
            [
                {
                    "word": word,
                    "start": round((utterance.start_ms + i * each) / 1000, 3),
                    "end": round((utterance.start_ms + (i + 1) * each) / 1000, 3),
                    "confidence": 0.99,
                    "punctuated_word": word,
                }
                for i, word in enumerate(words)
            ],
            is_final=is_final,
            speech_final=speech_final,
        )

    def _empty_final(self, *, from_finalize: bool) -> dict[str, Any]:
        start_s = self.confirmed_ms / 1000
        self.confirmed_ms = self.position_ms
        message = self._message(start_s, self.position_ms / 1000 - start_s, "", [], is_final=True, speech_final=False)
        if from_finalize:
            message["from_finalize"] = True
        return message

    def _message(
        self,
        start: float,
        duration: float,
        transcript: str,
        words: list[dict[str, Any]],
        *,
        is_final: bool,
        speech_final: bool,
    ) -> dict[str, Any]:
        return {
            "type": "Results",
            "channel_index": [0, 1],
            "duration": round(duration, 3),
            "start": round(start, 3),
            "is_final": is_final,
            "speech_final": speech_final,
            "channel": {
                "alternatives": [{"transcript": transcript, "confidence": 0.99 if words else 0.0, "words": words}]
            },
            "metadata": {
                "request_id": self.request_id,
                "model_info": dict(_MODEL_INFO),
                "model_uuid": str(uuid.uuid5(uuid.NAMESPACE_URL, "fake-nova")),
            },
        }


class FakeDeepgramServer:
    """``async with FakeDeepgramServer() as fake``; the SDK's ``environment.production`` is :attr:`base_url`."""

    def __init__(
        self,
        options: DeepgramOptions | None = None,
        *,
        faults: Faults | None = None,
        api_key: str | None = None,
        port: int = 0,
        keep_messages: bool = True,
    ) -> None:
        self.options = options or DeepgramOptions()
        auth = None
        if api_key is not None:
            accepted = {f"Token {api_key}", f"Bearer {api_key}"}
            auth = lambda h, q: h.get("Authorization", "") in accepted  # noqa: E731
        self.server = VendorServer(
            self._serve, faults=faults, auth=auth, check_query=check_query, port=port, keep_messages=keep_messages
        )

    @property
    def base_url(self) -> str:
        return f"ws://127.0.0.1:{self.server.port}"

    @property
    def url(self) -> str:
        return f"{self.base_url}/v1/listen"

    def record(self, conn_id: int) -> VendorRecord:
        return self.server.record(conn_id)

    async def __aenter__(self) -> FakeDeepgramServer:
        await self.server.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.server.aclose()

    async def _serve(self, link: FakeLink) -> None:
        query = dict(link.query)
        options = with_query(self.options, query)
        if "transcript" in query:
            options = dataclasses.replace(options, transcripts=tuple(query["transcript"].split("|")))
        listener = _Listener(options, query)
        messages = link.messages()
        try:
            while True:
                try:
                    async with asyncio.timeout(options.idle_timeout_s):
                        message = await anext(messages)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    await link.close(1011, "NET-0001: Deepgram did not receive audio data or a text message")
                    return
                if isinstance(message, bytes):
                    replies = listener.audio(message)
                else:
                    kind = message.get("type")
                    if kind == "Finalize":
                        replies = listener.finalize()
                    elif kind == "CloseStream":
                        for reply in listener.close_stream():
                            await link.send(reply)
                        await link.close(1000, "")
                        return
                    else:
                        replies = []  # KeepAlive resets the idle clock; Configure and unknown types are ignored
                for reply in replies:
                    await link.send(reply)
        finally:
            await messages.aclose()
