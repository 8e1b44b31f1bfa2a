"""The local speech-to-text of one call: caller audio bounded into utterances by a VAD, each decoded in one batch
by the process's Whisper (:mod:`.whisper`) when the pipeline decides the turn (``finalize()``).

Audio before speech is kept only as a short pre-roll, so silence and the agent's own turns never reach the
decoder. When the VAD has heard ``early_decode_ms`` of silence after speech, the utterance so far is decoded at
once, before the pipeline's endpoint (``endpoint_ms``, longer) asks: if ``finalize()`` then comes with nothing
said in between, that decode is the answer, so the endpoint wait and the decode overlap. Speech that resumes
drops it (the CPU spent is the price of the shorter turn). Speech longer than Whisper's window is decoded in
parts as it goes (``SttFinal(speech_final=False)``).

Every ``finalize()`` is answered by exactly one ``SttFinal(from_finalize=True)``, empty when nothing was said,
in the order the calls were made. Queues are bounded: more than ``max_pending`` decodes waiting, or an events
queue the consumer does not drain, is an :class:`SttFailed` (retryable), never a silent drop.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Final, Protocol

import numpy as np

from gateway.providers.pipeline.local.whisper import MAX_UTTERANCE_S, SAMPLE_RATE, Pcm16
from gateway.providers.pipeline.ports import (
    SttEvent,
    SttFailed,
    SttFinal,
    SttSpeechStarted,
    VoiceDetector,
)

log = logging.getLogger(__name__)

_BYTES_PER_MS: Final = SAMPLE_RATE * 2 // 1000


class Transcriber(Protocol):
    """What the stream needs of :class:`~.whisper.WhisperRuntime`."""

    async def transcribe(self, pcm: Pcm16) -> str: ...


@dataclass(frozen=True, slots=True)
class _Job:
    audio: bytes  # empty: a finalize with nothing said
    speech_final: bool
    from_finalize: bool
    early: asyncio.Task[str] | None = None  # an early decode of this audio (only silence came after it)


class LocalWhisperStt:
    """A :class:`~gateway.providers.pipeline.ports.SpeechToText` on a shared Whisper runtime. Build it inside the
    event loop (it starts its decode task)."""

    input_rate: int = SAMPLE_RATE

    def __init__(
        self,
        transcriber: Transcriber,
        vad: VoiceDetector | None,
        *,
        preroll_ms: int = 300,
        early_decode_ms: int = 200,
        max_utterance_s: float = MAX_UTTERANCE_S,
        max_pending: int = 4,
        max_events: int = 64,
    ) -> None:
        if vad is not None and vad.sample_rate != SAMPLE_RATE:
            raise ValueError(f"the VAD must run at {SAMPLE_RATE} Hz, not {vad.sample_rate}")
        self._transcriber = transcriber
        self._vad = vad
        self._preroll_bytes = preroll_ms * _BYTES_PER_MS
        self._max_bytes = int(max_utterance_s * 1000) * _BYTES_PER_MS
        self._preroll: deque[bytes] = deque()
        self._preroll_len = 0
        self._utterance = bytearray()
        self._in_speech = vad is None  # without a VAD everything fed is the utterance
        self._window_ms = int(getattr(vad, "window_ms", 32))
        self._early_ms = early_decode_ms
        self._quiet_ms = 0  # VAD silence since the last speech window
        self._early: asyncio.Task[str] | None = None  # decoding the utterance as it stands
        self._early_tasks: set[asyncio.Task[str]] = set()
        self.early_decodes = 0
        self.early_used = 0
        self._fed_bytes = 0
        self._jobs: asyncio.Queue[_Job] = asyncio.Queue(maxsize=max_pending)
        self._events: deque[SttEvent | None] = deque()
        self._max_events = max_events
        self._wakeup = asyncio.Event()
        self._closed = False
        self._decode_task = asyncio.get_running_loop().create_task(self._decode_loop(), name="local-stt-decode")

    # ---------------------------------------------------------------------------------------------- input

    def feed(self, pcm: bytes) -> None:
        if self._closed:
            return
        at_bytes = self._fed_bytes
        self._fed_bytes += len(pcm)
        if self._vad is not None:
            speech = False
            for decision in self._vad.feed(pcm):
                if decision.speech:
                    speech, self._quiet_ms, self._early = True, 0, None
                else:
                    self._quiet_ms += self._window_ms
            if not self._in_speech:
                self._remember(pcm)
                if not speech:
                    return
                self._in_speech = True
                start = at_bytes + len(pcm) - self._preroll_len
                self._utterance += b"".join(self._preroll)
                self._preroll.clear()
                self._preroll_len = 0
                self._emit(SttSpeechStarted(at_ms=max(0, start) // _BYTES_PER_MS))
                self._cut_if_long()
                return
        self._utterance += pcm
        self._cut_if_long()
        if self._vad is not None and self._early_ms and self._early is None and self._quiet_ms >= self._early_ms:
            self._start_early()

    def finalize(self) -> None:
        if self._closed:
            return
        audio = bytes(self._utterance) if self._in_speech else b""
        early = self._early if audio else None
        if early is not None:
            self.early_used += 1
        self._utterance.clear()
        self._early = None
        if self._vad is not None:
            self._in_speech = False
        self._submit(_Job(audio=audio, speech_final=True, from_finalize=True, early=early))

    def _start_early(self) -> None:
        audio = np.frombuffer(bytes(self._utterance), dtype="<i2")
        if not audio.size:
            return
        task = asyncio.get_running_loop().create_task(self._transcriber.transcribe(audio), name="local-stt-early")
        self._early = task
        self._early_tasks.add(task)
        task.add_done_callback(self._early_done)
        self.early_decodes += 1

    def _early_done(self, task: asyncio.Task[str]) -> None:
        self._early_tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved here; the decode loop reports it when the result is used

    def _remember(self, pcm: bytes) -> None:
        self._preroll.append(pcm)
        self._preroll_len += len(pcm)
        # The newest chunk always stays: it may be the one whose speech starts the utterance.
        while len(self._preroll) > 1 and self._preroll_len - len(self._preroll[0]) >= self._preroll_bytes:
            self._preroll_len -= len(self._preroll.popleft())

    def _cut_if_long(self) -> None:
        if len(self._utterance) >= self._max_bytes:
            audio = bytes(self._utterance)
            self._utterance.clear()
            self._early = None
            self._submit(_Job(audio=audio, speech_final=False, from_finalize=False))

    def _submit(self, job: _Job) -> None:
        try:
            self._jobs.put_nowait(job)
        except asyncio.QueueFull:
            self._emit(SttFailed(message=f"local STT: more than {self._jobs.maxsize} decodes waiting", retryable=True))

    # --------------------------------------------------------------------------------------------- output

    def _emit(self, event: SttEvent | None) -> None:
        if event is not None and len(self._events) >= self._max_events:
            if not isinstance(self._events[-1], SttFailed):
                self._events[-1] = SttFailed(message="local STT: events not consumed, queue full", retryable=True)
            return
        self._events.append(event)
        self._wakeup.set()

    async def events(self) -> AsyncIterator[SttEvent]:
        while True:
            while not self._events:
                self._wakeup.clear()
                await self._wakeup.wait()
            event = self._events.popleft()
            if event is None:
                return
            yield event

    async def _decode_loop(self) -> None:
        while True:
            job = await self._jobs.get()
            text = ""
            if job.audio:
                try:
                    if job.early is not None:
                        text = await job.early
                    else:
                        text = await self._transcriber.transcribe(np.frombuffer(job.audio, dtype="<i2"))
                except (RuntimeError, ValueError, MemoryError) as exc:
                    log.warning("local STT decode failed: %s", exc)
                    self._emit(SttFailed(message=f"local STT decode failed: {exc}", retryable=True))
                    continue
            self._emit(SttFinal(text=text, speech_final=job.speech_final, from_finalize=job.from_finalize))

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        tasks = [self._decode_task, *self._early_tasks]
        for task in tasks:
            task.cancel()
        self._emit(None)
        # gather() absorbs the tasks' own CancelledError but raises ours, should we be cancelled.
        await asyncio.gather(*tasks, return_exceptions=True)
