"""espeak-ng through its helper process: 24 kHz audio, words whose start matches the audio, cancel."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from gateway.providers.errors import ProviderConfigError
from gateway.providers.pipeline.local.espeak import EspeakConfig, EspeakStream, EspeakTts
from gateway.providers.pipeline.ports import TtsAudio, TtsDone, TtsEvent, TtsFailed, TtsWords, Word
from tests.support.peers import require_binary

pytestmark = pytest.mark.peer


@pytest.fixture
async def tts() -> AsyncIterator[EspeakTts]:
    require_binary("espeak-ng")  # libespeak-ng1 comes with it
    engine = EspeakTts(EspeakConfig(voice="en-us", wpm=160))
    try:
        yield engine
    finally:
        await engine.aclose()


async def _collect(stream: EspeakStream) -> list[TtsEvent]:
    async def run() -> list[TtsEvent]:
        return [event async for event in stream.events()]

    return await asyncio.wait_for(run(), timeout=30)


def _audio(events: list[TtsEvent]) -> np.ndarray:  # type: ignore[type-arg]
    return np.frombuffer(b"".join(e.pcm for e in events if isinstance(e, TtsAudio)), dtype="<i2")


def _words(events: list[TtsEvent]) -> list[Word]:
    return [w for e in events if isinstance(e, TtsWords) for w in e.words]


def _onsets(pcm: np.ndarray, *, rate: int = 24000, quiet_ms: int = 80) -> list[int]:  # type: ignore[type-arg]
    """Starts (ms) of sound after at least ``quiet_ms`` of near silence, on a 5 ms energy envelope."""
    step = rate // 200
    env = [float(np.sqrt(np.mean(pcm[i : i + step].astype(np.float64) ** 2))) for i in range(0, len(pcm) - step, step)]
    onsets, quiet = [], quiet_ms // 5
    for i, level in enumerate(env):
        if level < 100:
            quiet += 1
            continue
        if quiet >= quiet_ms // 5:
            onsets.append(i * 5)
        quiet = 0
    return onsets


async def test_word_starts_match_the_onsets_in_the_audio(tts: EspeakTts) -> None:
    text = "Alpha. Bravo, café. Charlie; delta! Four five."
    stream = await tts.open("item_1")
    await stream.push(text)
    await stream.flush()
    events = await _collect(stream)
    assert isinstance(events[-1], TtsDone)
    words = _words(events)
    assert [w.text for w in words] == ["Alpha", "Bravo", "café", "Charlie", "delta", "Four", "five"]
    assert all(text[w.char_start : w.char_end] == w.text for w in words)
    audio = _audio(events)
    duration_ms = len(audio) * 1000 // 24000
    starts = [w.start_ms for w in words]
    assert starts == sorted(starts) and starts[0] == 0
    assert all(w.start_ms <= w.end_ms <= duration_ms for w in words)
    onsets = _onsets(audio)  # after pauses of 80 ms or more: between words, not a stop's closure inside one
    # Every word after a pause begins where the audio does: espeak puts a word's start at its first phoneme,
    # a stop's closure included, so the audible onset follows it by at most a closure (< 90 ms), never precedes.
    for word in words[1:]:
        if word.text == "five":
            continue  # no pause before it: "four five" runs together
        near = [o for o in onsets if word.start_ms - 10 <= o <= word.start_ms + 90]
        assert near, (word, onsets)
    # ...and no onset appears where no word starts.
    assert all(any(w.start_ms - 10 <= o <= w.start_ms + 90 for w in words) for o in onsets), (onsets, starts)


async def test_clauses_continue_the_item_timelines(tts: EspeakTts) -> None:
    first, second = "Your order has shipped.", " It arrives on Friday."
    alone = await tts.open("alone")
    await alone.push(first)
    await alone.flush()
    first_events = await _collect(alone)
    first_ms = len(_audio(first_events)) * 1000 // 24000

    stream = await tts.open("item_2")
    await stream.push(first)
    await stream.push(second)
    await stream.flush()
    events = await _collect(stream)
    words = _words(events)
    text = first + second
    assert [w.text for w in words] == ["Your", "order", "has", "shipped", "It", "arrives", "on", "Friday"]
    assert all(text[w.char_start : w.char_end] == w.text for w in words)
    later = words[4:]
    assert later[0].start_ms >= first_ms and later[0].start_ms - first_ms < 50
    assert words[:4] == _words(first_events)


async def test_audio_is_resampled_once_to_24khz(tts: EspeakTts) -> None:
    stream = await tts.open("rate")
    await stream.push("Testing the sample rate.")
    await stream.flush()
    events = await _collect(stream)
    helper_samples = tts.engine.rate  # 22050 per second of speech
    assert helper_samples == 22050
    pcm = _audio(events)
    spectrum = np.abs(np.fft.rfft(pcm.astype(np.float64)))
    freqs = np.fft.rfftfreq(len(pcm), 1 / 24000)
    # Nothing above espeak's own Nyquist (11.025 kHz): a resampled signal, not a relabelled one.
    assert spectrum[freqs > 11300].sum() < 0.001 * spectrum.sum()


async def test_cancel_stops_synthesis_and_events(tts: EspeakTts) -> None:
    stream = await tts.open("long")
    for i in range(40):
        await stream.push(f"This is clause number {i}, which nobody will hear.")
    await stream.flush()
    events = stream.events()
    first = await asyncio.wait_for(anext(events), timeout=30)
    assert isinstance(first, TtsWords | TtsAudio)
    await stream.cancel()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(events), timeout=5)
    spoken = tts.engine.synthesised
    assert spoken < 40
    # The engine serves requests in order: once a new stream's clause is spoken, everything queued before it
    # has been dealt with. At most the clause that was in flight at the cancel was spoken (and discarded).
    after = await tts.open("after")
    await after.push("Next.")
    await after.flush()
    assert isinstance((await _collect(after))[-1], TtsDone)
    assert tts.engine.synthesised <= spoken + 2 < 40


async def test_an_unknown_voice_fails_without_retry(tts: EspeakTts) -> None:
    stream = await tts.open("bad", voice="no-such-voice")
    await stream.push("Hello.")
    await stream.flush()
    events = await _collect(stream)
    assert len(events) == 1 and isinstance(events[0], TtsFailed)
    assert not events[0].retryable and "no-such-voice" in events[0].message


async def test_the_engine_runs_in_another_process(tts: EspeakTts) -> None:
    stream = await tts.open("where")
    await stream.push("Hello.")
    await stream.flush()
    await _collect(stream)
    maps = await asyncio.to_thread(Path("/proc/self/maps").read_text)
    assert "libespeak-ng" not in maps  # never linked into the gateway's own process (GPL at arm's length)


def test_config_is_checked() -> None:
    with pytest.raises(ProviderConfigError, match="words per minute"):
        EspeakConfig(wpm=10)
    with pytest.raises(ProviderConfigError, match="voice"):
        EspeakConfig(voice="en us")
