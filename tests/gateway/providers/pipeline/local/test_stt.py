"""The per-call local STT: utterances bounded by the VAD, one decode per finalize, bounded queues."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest

from gateway.providers.pipeline.local.stt import LocalWhisperStt
from gateway.providers.pipeline.local.vad import SileroVad
from gateway.providers.pipeline.local.whisper import WhisperRuntime
from gateway.providers.pipeline.ports import SttEvent, SttFailed, SttFinal, SttSpeechStarted, VoiceActivity
from tests.gateway.providers.pipeline.local.conftest import require_local_extra
from tests.gateway.providers.pipeline.local.speech import SENTENCES, normalise, speech_16k

CHUNK = 640  # 20 ms at 16 kHz


class RecordingTranscriber:
    def __init__(self, text: str = "words") -> None:
        self.audio: list[int] = []
        self.text = text
        self.gate = asyncio.Event()
        self.gate.set()

    async def transcribe(self, pcm: np.ndarray) -> str:  # type: ignore[type-arg]
        await self.gate.wait()
        self.audio.append(pcm.size)
        return self.text


def _feed(stt: LocalWhisperStt, pcm: bytes) -> None:
    for start in range(0, len(pcm), CHUNK):
        stt.feed(pcm[start : start + CHUNK])


async def _next(events: AsyncIterator[SttEvent]) -> SttEvent:
    return await asyncio.wait_for(anext(events), timeout=60)


@pytest.mark.peer
async def test_leading_silence_is_not_decoded_and_speech_start_is_reported() -> None:
    require_local_extra()
    transcriber = RecordingTranscriber()
    stt = LocalWhisperStt(transcriber, SileroVad(), preroll_ms=300)
    speech = speech_16k(SENTENCES[0]).tobytes()
    try:
        events = stt.events()
        _feed(stt, bytes(32000))  # 1 s of silence
        _feed(stt, speech)
        started = await _next(events)
        assert isinstance(started, SttSpeechStarted)
        assert 700 <= started.at_ms <= 1200
        _feed(stt, bytes(16000))
        stt.finalize()
        final = await _next(events)
        assert final == SttFinal(text="words", speech_final=True, from_finalize=True)
        seconds = transcriber.audio[0] / 16000
        speech_s = len(speech) / 32000
        assert speech_s - 0.3 <= seconds <= speech_s + 0.3 + 0.5 + 0.1
    finally:
        await stt.aclose()


@pytest.mark.peer
async def test_finalize_without_speech_answers_empty_without_decoding() -> None:
    require_local_extra()
    transcriber = RecordingTranscriber()
    stt = LocalWhisperStt(transcriber, SileroVad())
    try:
        events = stt.events()
        _feed(stt, bytes(32000))
        stt.finalize()
        assert await _next(events) == SttFinal(text="", speech_final=True, from_finalize=True)
        assert transcriber.audio == []
    finally:
        await stt.aclose()


async def test_long_speech_is_decoded_in_parts_as_it_goes() -> None:
    transcriber = RecordingTranscriber()
    stt = LocalWhisperStt(transcriber, None, max_utterance_s=1.0)
    try:
        events = stt.events()
        _feed(stt, b"\x10\x00" * 16000 * 2 + b"\x10\x00" * 8000)  # 2.5 s
        stt.finalize()
        got = [await _next(events) for _ in range(3)]
        assert got == [
            SttFinal(text="words", speech_final=False, from_finalize=False),
            SttFinal(text="words", speech_final=False, from_finalize=False),
            SttFinal(text="words", speech_final=True, from_finalize=True),
        ]
        assert transcriber.audio == [16000, 16000, 8000]
    finally:
        await stt.aclose()


async def test_too_many_waiting_decodes_is_an_error_event_not_a_drop() -> None:
    transcriber = RecordingTranscriber()
    transcriber.gate.clear()
    stt = LocalWhisperStt(transcriber, None, max_pending=1)
    try:
        events = stt.events()
        for _ in range(3):  # one decoding (blocked), one waiting, the third has no room
            stt.feed(b"\x10\x00" * 160)
            stt.finalize()
            await asyncio.sleep(0)
        failed = await _next(events)
        assert isinstance(failed, SttFailed) and failed.retryable
        assert "decodes waiting" in failed.message
        transcriber.gate.set()
        assert isinstance(await _next(events), SttFinal)
    finally:
        await stt.aclose()


async def test_aclose_ends_the_events_and_later_audio_is_ignored() -> None:
    stt = LocalWhisperStt(RecordingTranscriber(), None)
    events = stt.events()
    await stt.aclose()
    with pytest.raises(StopAsyncIteration):
        await _next(events)
    stt.feed(b"\x00\x00")
    stt.finalize()
    await stt.aclose()


@pytest.mark.peer
async def test_a_spoken_sentence_becomes_its_text(whisper_runtime: WhisperRuntime) -> None:
    stt = LocalWhisperStt(whisper_runtime, SileroVad())
    try:
        events = stt.events()
        _feed(stt, bytes(8000) + speech_16k(SENTENCES[3]).tobytes() + bytes(16000))
        assert isinstance(await _next(events), SttSpeechStarted)
        stt.finalize()
        final = await _next(events)
        assert isinstance(final, SttFinal) and final.from_finalize
        assert len(set(normalise(final.text)) ^ set(normalise(SENTENCES[3]))) <= 3, final.text
    finally:
        await stt.aclose()


class LoudnessVad:
    """A scripted VoiceDetector: a 20 ms window is speech when its first sample is not zero."""

    sample_rate = 16000
    window_ms = 20

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, pcm: bytes) -> list[VoiceActivity]:
        data = self._pending + pcm
        whole = len(data) // CHUNK * CHUNK
        self._pending = data[whole:]
        return [VoiceActivity(speech=data[i : i + 2] != b"\x00\x00") for i in range(0, whole, CHUNK)]

    def reset(self) -> None:
        self._pending = b""


SPEECH = b"\x10\x00" * 320
QUIET = b"\x00\x00" * 320


async def test_an_early_decode_after_short_silence_answers_the_finalize() -> None:
    transcriber = RecordingTranscriber("early words")
    stt = LocalWhisperStt(transcriber, LoudnessVad(), preroll_ms=0, early_decode_ms=200)
    try:
        events = stt.events()
        _feed(stt, SPEECH * 50)  # 1 s
        assert isinstance(await _next(events), SttSpeechStarted)
        _feed(stt, QUIET * 9)
        await asyncio.sleep(0)
        assert stt.early_decodes == 0  # 180 ms: not yet
        _feed(stt, QUIET * 16)  # to 500 ms of silence, where the pipeline's endpoint would finalize
        assert stt.early_decodes == 1
        stt.finalize()
        assert await _next(events) == SttFinal(text="early words", speech_final=True, from_finalize=True)
        assert transcriber.audio == [16000 + 10 * 320]  # decoded once, at 200 ms of silence
        assert stt.early_used == 1
    finally:
        await stt.aclose()


async def test_speech_after_an_early_decode_drops_it() -> None:
    transcriber = RecordingTranscriber()
    stt = LocalWhisperStt(transcriber, LoudnessVad(), preroll_ms=0, early_decode_ms=200)
    try:
        events = stt.events()
        _feed(stt, SPEECH * 50 + QUIET * 12)  # an early decode starts at 200 ms
        _feed(stt, SPEECH * 25 + QUIET * 25)  # ...but the caller goes on
        stt.finalize()
        assert isinstance(await _next(events), SttSpeechStarted)
        assert isinstance(await _next(events), SttFinal)
        assert stt.early_decodes == 2 and stt.early_used == 1
        assert len(transcriber.audio) == 2  # the dropped early decode and the one of the whole utterance
        assert max(transcriber.audio) == (50 + 12 + 25 + 10) * 320
    finally:
        await stt.aclose()
