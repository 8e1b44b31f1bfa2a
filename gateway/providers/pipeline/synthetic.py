"""Offline stand-ins for a recogniser and a voice, for tests, load and demos with no keys and no models.

* :class:`ScriptedStt` (component ``stt = "scripted"``) hears utterances with an energy level and gives each the
  next of its scripted texts: an interim result after ``partial_after_ms`` of speech and a final when asked to
  finalize (after ``final_delay_ms``, the recogniser's latency).
* :class:`SyntheticTts` (component ``tts = "synthetic"``) speaks each word as a voice-like tone of
  ``ms_per_char`` per character with a gap of one character between words, and reports exact word timings (or
  none, with ``timestamps=False``, so the pipeline's estimate is exercised).

Both implement the ports exactly as a vendor adapter does, so the pipeline cannot tell them apart.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Generic, TypeVar

import numpy as np

from gateway.providers.pipeline.ports import (
    SttEvent,
    SttFailed,
    SttFinal,
    SttPartial,
    TtsAudio,
    TtsDone,
    TtsEvent,
    TtsWords,
    Word,
)
from gateway.providers.pipeline.words import word_spans

_FRAME = 480
_RATE = 24_000


T = TypeVar("T")


class _Queue(Generic[T]):
    """A bounded event queue whose overflow is reported, never silent: ``put`` returns False when full."""

    def __init__(self, size: int) -> None:
        self.queue: asyncio.Queue[T] = asyncio.Queue(maxsize=size)

    def put(self, item: T) -> bool:
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            return False
        return True


class ScriptedStt:
    input_rate = _RATE

    def __init__(
        self,
        *,
        texts: tuple[str, ...],
        final_delay_ms: int = 0,
        partial_after_ms: int = 300,
        threshold_dbfs: float = -40.0,
    ) -> None:
        self._texts = itertools.cycle(texts or ("hello",))
        self._current = ""
        self._final_delay_s = final_delay_ms / 1000.0
        self._partial_after = partial_after_ms // 20
        self._threshold = (32768.0 * 10 ** (threshold_dbfs / 20.0)) ** 2
        self._speech_frames = 0
        self._carry = b""
        self._events: _Queue[SttEvent] = _Queue(256)
        self._closed = False
        self._timers: list[asyncio.TimerHandle] = []
        self.fed_bytes = 0

    def feed(self, pcm: bytes) -> None:
        self.fed_bytes += len(pcm)
        data = self._carry + pcm
        whole = len(data) - len(data) % (2 * _FRAME)
        self._carry = data[whole:]
        if not whole:
            return
        frames = np.frombuffer(data[:whole], dtype="<i2").astype(np.float32).reshape(-1, _FRAME)
        for power in np.mean(frames * frames, axis=1):
            if power < self._threshold:
                continue
            if self._speech_frames == 0:
                self._current = next(self._texts)
            self._speech_frames += 1
            if self._speech_frames == self._partial_after:
                self._put(SttPartial(text=self._current))

    def finalize(self) -> None:
        if not self._speech_frames:
            self._put(SttFinal(text="", speech_final=True, from_finalize=True))
            return
        final = SttFinal(text=self._current, speech_final=True, from_finalize=True)
        self._speech_frames = 0
        if self._final_delay_s:
            loop = asyncio.get_running_loop()
            self._timers.append(loop.call_later(self._final_delay_s, self._put, final))
        else:
            self._put(final)

    def _put(self, event: SttEvent) -> None:
        if not self._closed and not self._events.put(event):
            self._closed = True
            self._events.queue.get_nowait()
            self._events.put(SttFailed(message="recogniser event queue overflowed", retryable=True))

    async def events(self) -> AsyncIterator[SttEvent]:
        while True:
            event = await self._events.queue.get()
            yield event
            if isinstance(event, SttFailed):
                return

    async def aclose(self) -> None:
        self._closed = True
        for timer in self._timers:
            timer.cancel()


def voice(duration_ms: int, *, seed: int) -> bytes:
    """A voice-like tone: two partials under a syllable-rate envelope, about -14 dBFS."""
    n = _RATE * duration_ms // 1000
    t = np.arange(n) / _RATE
    f0 = 140.0 + 15.0 * (seed % 5)
    envelope = 0.6 + 0.4 * np.sin(2 * np.pi * 4.0 * t) ** 2
    wave = (np.sin(2 * np.pi * f0 * t) + 0.5 * np.sin(2 * np.pi * 3 * f0 * t)) * envelope
    return (wave * 0.2 * 32767).astype("<i2").tobytes()


class SyntheticStream:
    def __init__(self, *, ms_per_char: int, timestamps: bool, first_audio_ms: int) -> None:
        self.timestamps = timestamps
        self._ms_per_char = ms_per_char
        self._first_audio_s = first_audio_ms / 1000.0
        self._text = ""
        self._audio_ms = 0
        self._events: asyncio.Queue[TtsEvent] = asyncio.Queue()
        self._cancelled = False
        self._started = False

    async def push(self, text: str) -> None:
        if self._cancelled:
            return
        if not self._started and self._first_audio_s:
            await asyncio.sleep(self._first_audio_s)
        self._started = True
        base = len(self._text)
        self._text += text
        words: list[Word] = []
        audio: list[bytes] = []
        for start, end in word_spans(text, offset=base):
            length = (end - start) * self._ms_per_char
            words.append(
                Word(
                    text=self._text[start:end],
                    start_ms=self._audio_ms,
                    end_ms=self._audio_ms + length,
                    char_start=start,
                    char_end=end,
                )
            )
            audio.append(voice(length, seed=start))
            gap = self._ms_per_char
            audio.append(bytes(48 * gap))
            self._audio_ms += length + gap
        if words and self.timestamps:
            self._events.put_nowait(TtsWords(words=tuple(words)))
        pcm = b"".join(audio)
        for offset in range(0, len(pcm), 4800):  # 100 ms chunks
            self._events.put_nowait(TtsAudio(pcm=pcm[offset : offset + 4800]))

    async def flush(self) -> None:
        if not self._cancelled:
            self._events.put_nowait(TtsDone())

    async def cancel(self) -> None:
        self._cancelled = True
        self._events.put_nowait(TtsDone())

    async def events(self) -> AsyncIterator[TtsEvent]:
        while True:
            event = await self._events.get()
            if self._cancelled and not isinstance(event, TtsDone):
                continue
            yield event
            if isinstance(event, TtsDone):
                return


class SyntheticTts:
    def __init__(self, *, ms_per_char: int = 60, timestamps: bool = True, first_audio_ms: int = 0) -> None:
        self.ms_per_char = ms_per_char
        self.timestamps = timestamps
        self.first_audio_ms = first_audio_ms
        self.opened = 0

    async def open(self, utterance_id: str, *, voice: str = "") -> SyntheticStream:
        self.opened += 1
        return SyntheticStream(
            ms_per_char=self.ms_per_char, timestamps=self.timestamps, first_audio_ms=self.first_audio_ms
        )

    async def aclose(self) -> None:
        return None
