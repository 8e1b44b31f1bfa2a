"""Local text-to-speech with espeak-ng (Debian), word timings exact from the engine's own WORD events.

espeak-ng is GPL-3.0, so it runs in a helper process (:mod:`.espeak_helper`) and this module only writes text to
its stdin and reads audio and word events from its stdout (docs/adr/0024-local-gpl-engines-in-a-helper-process.md).
One helper serves every stream of a :class:`EspeakTts`; a request is one pushed clause, synthesised in a few
milliseconds, so streams take turns without waiting long. The helper's 22.05 kHz audio is resampled once to the
24 kHz contract (soxr, per clause; the clauses end in espeak's own pauses).

Timing: a word's ``start_ms`` is espeak's ``audio_position`` plus the audio this stream produced before the
clause, so it is exact in the stream's own timeline; ``end_ms`` is the next word's start or the clause's end.
Cancelling a stream drops its queued clauses before they reach the helper and discards the one in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from gateway.providers.errors import ProviderConfigError
from gateway.providers.pipeline.ports import TtsAudio, TtsDone, TtsEvent, TtsFailed, TtsWords, Word

log = logging.getLogger(__name__)

OUTPUT_RATE: Final = 24000
_HELPER: Final = Path(__file__).with_name("espeak_helper.py")
_MAX_CLAUSES: Final = 256  # pushed and not yet spoken, per stream
_MAX_EVENTS: Final = 512
_START_TIMEOUT_S: Final = 10.0
_STOP_TIMEOUT_S: Final = 2.0


class EspeakError(Exception):
    """The helper failed; ``retryable`` False when it cannot start at all (no library, no voice)."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True, slots=True, kw_only=True)
class EspeakConfig:
    voice: str = "en-us"
    wpm: int = 160

    def __post_init__(self) -> None:
        if not 80 <= self.wpm <= 450:
            raise ProviderConfigError(f"espeak-ng rate must be within 80..450 words per minute, got {self.wpm}")
        if not self.voice or any(c.isspace() for c in self.voice):
            raise ProviderConfigError(f"espeak-ng voice {self.voice!r} is not a voice name")


@dataclass(frozen=True, slots=True, kw_only=True)
class Synthesis:
    """One clause from the helper: PCM16 at ``rate`` and its words as (char_start, char_length, audio_ms)."""

    pcm: bytes
    rate: int
    words: tuple[tuple[int, int, int], ...]


@dataclass(slots=True)
class _Request:
    text: str
    voice: str
    wpm: int
    answer: asyncio.Future[Synthesis]


class EspeakEngine:
    """The helper process and the one task that talks to it (so a cancelled caller never desynchronises the
    pipe). Started on first use; a helper that dies is restarted for the next request."""

    def __init__(self) -> None:
        self._requests: asyncio.Queue[_Request] = asyncio.Queue(maxsize=1024)
        self._task: asyncio.Task[None] | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self.rate = 0
        self.version = ""
        self.synthesised = 0  # clauses the helper spoke (tests: a cancel stops synthesis)

    async def synthesize(self, text: str, *, voice: str, wpm: int) -> Synthesis:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._serve(), name="espeak-engine")
        answer: asyncio.Future[Synthesis] = asyncio.get_running_loop().create_future()
        try:
            self._requests.put_nowait(_Request(text, voice, wpm, answer))
        except asyncio.QueueFull:
            raise EspeakError("espeak-ng: more than 1024 clauses waiting", retryable=True) from None
        return await answer

    async def _serve(self) -> None:
        while True:
            request = await self._requests.get()
            if request.answer.cancelled():
                continue  # its stream was cancelled while it waited: never synthesised
            try:
                result = await self._exchange(request)
            except EspeakError as exc:
                if not request.answer.done():
                    request.answer.set_exception(exc)
                continue
            if not request.answer.done():
                request.answer.set_result(result)

    async def _exchange(self, request: _Request) -> Synthesis:
        proc = await self._ensure_started()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            line = json.dumps({"text": request.text, "voice": request.voice, "wpm": request.wpm})
            proc.stdin.write(line.encode() + b"\n")
            await proc.stdin.drain()
            header = json.loads(await proc.stdout.readline() or b"null")
            if not isinstance(header, dict):
                raise EspeakError("espeak-ng helper exited", retryable=True)
            if "error" in header:
                raise EspeakError(f"espeak-ng: {header['error']}", retryable=False)
            pcm = await proc.stdout.readexactly(int(header["samples"]) * 2)
        except (OSError, asyncio.IncompleteReadError, ValueError, KeyError) as exc:
            await self._stop()
            raise EspeakError(f"espeak-ng helper failed: {exc}", retryable=True) from exc
        self.synthesised += 1
        words = tuple((int(w[0]), int(w[1]), int(w[2])) for w in header["words"])
        return Synthesis(pcm=pcm, rate=self.rate, words=words)

    async def _ensure_started(self) -> asyncio.subprocess.Process:
        if self._proc is not None and self._proc.returncode is None:
            return self._proc
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-I",
                "-S",
                str(_HELPER),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                limit=1 << 20,
            )
        except OSError as exc:
            raise EspeakError(f"cannot start the espeak-ng helper: {exc}", retryable=False) from exc
        self._proc = proc
        assert proc.stdout is not None
        try:
            ready = json.loads(await asyncio.wait_for(proc.stdout.readline(), _START_TIMEOUT_S) or b"null")
        except (TimeoutError, ValueError) as exc:
            await self._stop()
            raise EspeakError(f"the espeak-ng helper did not start: {exc!r}", retryable=True) from exc
        if not isinstance(ready, dict) or not ready.get("ready"):
            await self._stop()
            reason = ready.get("error") if isinstance(ready, dict) else "it exited"
            raise EspeakError(f"the espeak-ng helper cannot speak: {reason}", retryable=False)
        self.rate, self.version = int(ready["rate"]), str(ready.get("version", ""))
        log.info("espeak-ng helper pid %d: libespeak-ng %s at %d Hz", proc.pid, self.version, self.rate)
        return proc

    async def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), _STOP_TIMEOUT_S)
        except TimeoutError:
            proc.kill()  # our own child, by its pid
            await proc.wait()

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self._stop()


def _to_output_rate(pcm: bytes, rate: int) -> npt.NDArray[np.int16]:
    samples = np.frombuffer(pcm, dtype="<i2")
    if rate == OUTPUT_RATE or samples.size == 0:
        return samples.astype(np.int16)
    import soxr  # type: ignore[import-untyped,unused-ignore]  # in the [local] extra

    resampled: Any = soxr.resample(samples, rate, OUTPUT_RATE)
    return np.asarray(resampled, dtype=np.int16)


def clause_words(text: str, synthesis: Synthesis, *, offset_ms: int, char_offset: int, duration_ms: int) -> list[Word]:
    """espeak's WORD events of one clause as :class:`Word`\\ s in the stream's timelines (ms and characters)."""
    spans: list[tuple[int, int, int]] = []
    for start, length, ms in synthesis.words:
        start = max(0, min(start, len(text)))
        end = max(start, min(start + max(length, 0), len(text)))
        if end == start or (spans and start < spans[-1][1]):
            continue  # empty, or a second event inside a word already reported (numbers, abbreviations)
        spans.append((start, end, ms))
    words = []
    for i, (start, end, ms) in enumerate(spans):
        next_ms = spans[i + 1][2] if i + 1 < len(spans) else duration_ms
        words.append(
            Word(
                text=text[start:end],
                start_ms=offset_ms + ms,
                end_ms=offset_ms + max(ms, min(next_ms, duration_ms)),
                char_start=char_offset + start,
                char_end=char_offset + end,
            )
        )
    return words


class EspeakStream:
    """One assistant item's speech (:class:`~gateway.providers.pipeline.ports.TtsStream`)."""

    timestamps: bool = True

    def __init__(self, engine: EspeakEngine, *, voice: str, wpm: int, name: str) -> None:
        self._engine = engine
        self._voice = voice
        self._wpm = wpm
        self._clauses: deque[str] = deque()
        self._flushed = False
        self._cancelled = False
        self._events: deque[TtsEvent | None] = deque()
        self._wakeup = asyncio.Event()  # events for the reader
        self._work = asyncio.Event()  # text or flush for the task
        self._samples = 0  # 24 kHz samples produced so far
        self._chars = 0  # characters pushed before the clause being spoken
        self._task = asyncio.get_running_loop().create_task(self._speak(), name=f"espeak-stream-{name}")

    async def push(self, text: str) -> None:
        if self._cancelled or self._flushed or not text:
            return
        if len(self._clauses) >= _MAX_CLAUSES:
            self._emit(TtsFailed(message=f"espeak-ng: more than {_MAX_CLAUSES} clauses waiting", retryable=True))
            return
        self._clauses.append(text)
        self._work.set()

    async def flush(self) -> None:
        self._flushed = True
        self._work.set()

    async def cancel(self) -> None:
        self._cancelled = True
        self._clauses.clear()
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._events.clear()
        self._events.append(None)
        self._wakeup.set()

    async def events(self) -> AsyncIterator[TtsEvent]:
        while True:
            while not self._events:
                self._wakeup.clear()
                await self._wakeup.wait()
            event = self._events.popleft()
            if event is None:
                return
            yield event

    def _emit(self, event: TtsEvent | None) -> None:
        if self._cancelled and event is not None:
            return
        if event is not None and len(self._events) >= _MAX_EVENTS:
            if not isinstance(self._events[-1], TtsFailed):
                self._events[-1] = TtsFailed(message="espeak-ng: events not consumed, queue full", retryable=True)
            return
        self._events.append(event)
        self._wakeup.set()

    async def _speak(self) -> None:
        while True:
            while not self._clauses:
                if self._flushed:
                    self._emit(TtsDone())
                    self._emit(None)
                    return
                self._work.clear()
                await self._work.wait()
            text = self._clauses.popleft()
            try:
                synthesis = await self._engine.synthesize(text, voice=self._voice, wpm=self._wpm)
                audio = _to_output_rate(synthesis.pcm, synthesis.rate)
            except EspeakError as exc:
                self._emit(TtsFailed(message=str(exc), retryable=exc.retryable))
                self._emit(None)
                return
            duration_ms = audio.size * 1000 // OUTPUT_RATE
            offset_ms = self._samples * 1000 // OUTPUT_RATE
            words = clause_words(text, synthesis, offset_ms=offset_ms, char_offset=self._chars, duration_ms=duration_ms)
            self._chars += len(text)
            self._samples += audio.size
            if words:
                self._emit(TtsWords(words=tuple(words)))
            if audio.size:
                self._emit(TtsAudio(pcm=audio.astype("<i2").tobytes()))


class EspeakTts:
    """:class:`~gateway.providers.pipeline.ports.TextToSpeech` on one espeak-ng helper process: its own, or a
    shared ``engine`` that its ``aclose()`` leaves running (the worker's, shared by every call)."""

    def __init__(self, config: EspeakConfig | None = None, *, engine: EspeakEngine | None = None) -> None:
        self.config = config or EspeakConfig()
        self._owns_engine = engine is None
        self.engine = engine or EspeakEngine()
        self._streams = 0

    async def open(self, utterance_id: str, *, voice: str = "") -> EspeakStream:
        self._streams += 1
        return EspeakStream(
            self.engine, voice=voice or self.config.voice, wpm=self.config.wpm, name=utterance_id or str(self._streams)
        )

    async def aclose(self) -> None:
        if self._owns_engine:
            with contextlib.suppress(EspeakError):
                await self.engine.aclose()
