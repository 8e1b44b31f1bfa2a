"""The local Whisper as AMD's greeting recogniser (greeting.py over LocalWhisperStt): an espeak-ng voicemail greeting,
fed as the session feeds it (24 kHz, 20 ms frames), yields a text with a machine phrase; a person's "hello?"
yields a person's words. The packaged tiny.en only: nothing is downloaded."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from gateway.media.amd import AmdResult
from gateway.media.amd_words import judge_words
from gateway.providers.pipeline.greeting import GreetingTranscriber
from gateway.providers.pipeline.local.stt import LocalWhisperStt
from gateway.providers.pipeline.local.vad import SileroVad
from gateway.providers.pipeline.local.whisper import WhisperRuntime
from tests.support.audio import read_wav, speech_wav
from tests.support.peers import require_binary

pytestmark = pytest.mark.peer


async def _first_texts(greeting: GreetingTranscriber, text: str, tmp_path: Path) -> list[str]:
    require_binary("espeak-ng", package="espeak-ng")
    pcm = read_wav(speech_wav(text, tmp_path / "greeting.wav", 24_000)).samples[:, 0]
    pcm = np.concatenate([pcm, np.zeros(24_000, dtype=np.int16)])
    for start in range(0, pcm.size - 480 + 1, 480):
        greeting.feed(pcm[start : start + 480])
    texts: list[str] = []

    async def collect() -> None:
        async for got in greeting.texts():
            texts.append(got)
            if judge_words(" ".join(texts)).result is not None:
                return

    await asyncio.wait_for(collect(), 30)
    return texts


@pytest.mark.parametrize(
    ("spoken", "result"),
    [
        ("Hi, you have reached Alex. Please leave a message after the tone.", AmdResult.MACHINE),
        ("Hello?", AmdResult.HUMAN),
    ],
)
async def test_the_local_whisper_hears_the_greeting(
    whisper_runtime: WhisperRuntime, tmp_path: Path, spoken: str, result: AmdResult
) -> None:
    greeting = GreetingTranscriber(LocalWhisperStt(whisper_runtime, SileroVad()), endpoint_ms=300)
    try:
        texts = await _first_texts(greeting, spoken, tmp_path)
    finally:
        await greeting.aclose()
    assert judge_words(" ".join(texts)).result is result, texts
