"""Speech fixtures for the local pipeline's tests: ten call-centre sentences spoken by espeak-ng (generated in the
test, never committed), the telephone path they take through the gateway, and word error rate.

Normalisation for scoring (PIPELINE.md §3.2): lower case, punctuation stripped, each digit spoken as its word,
"good bye" as "goodbye". WER is the word-level Levenshtein distance over the number of reference words.
"""

from __future__ import annotations

import io
import re
import subprocess
import wave

import numpy as np
import numpy.typing as npt

from telcodecs import g711
from telcodecs.resample import StreamResampler
from tests.support.peers import require_binary

Int16Array = npt.NDArray[np.int16]

SENTENCES = (
    "Hello, I would like to check my order status.",
    "My order number is four five seven two.",
    "I was charged twice for the same item.",
    "Can you transfer me to a human agent please?",
    "The package never arrived at my address.",
    "I need to change my delivery date to Friday.",
    "Please cancel my subscription today.",
    "What is the balance on my account?",
    "My phone number is five five five one two three four.",
    "Thank you very much, goodbye.",
)

_DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def normalise(text: str) -> list[str]:
    text = text.lower().replace("-", " ")
    text = re.sub(r"\d", lambda m: f" {_DIGITS[int(m.group())]} ", text)
    text = re.sub(r"[^a-z' ]", " ", text)
    return text.replace("good bye", "goodbye").split()


def word_errors(reference: str, hypothesis: str) -> int:
    ref, hyp = normalise(reference), normalise(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        previous, row[0] = row[:], i
        for j, h in enumerate(hyp, 1):
            row[j] = min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + (r != h))
    return row[-1]


def espeak(text: str, *, voice: str = "en-us", wpm: int = 150) -> tuple[Int16Array, int]:
    """espeak-ng's own output (22.05 kHz mono PCM16) and its rate."""
    binary = require_binary("espeak-ng")
    out = subprocess.run([binary, "-v", voice, "-s", str(wpm), "--stdout", text], capture_output=True, check=True)
    with wave.open(io.BytesIO(out.stdout)) as wav:
        rate = wav.getframerate()
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").astype(np.int16)
    return pcm, rate


def resample(pcm: Int16Array, in_rate: int, out_rate: int) -> Int16Array:
    import soxr

    out = soxr.resample(pcm.astype(np.float32) / 32768.0, in_rate, out_rate)
    return np.clip(np.round(out * 32768.0), -32768, 32767).astype(np.int16)


def _stream(pcm: Int16Array, in_rate: int, out_rate: int) -> Int16Array:
    resampler = StreamResampler(in_rate, out_rate)
    frame = resampler.in_frame
    padded = np.concatenate([pcm, np.zeros(-len(pcm) % frame + frame, dtype=np.int16)])
    return np.concatenate([resampler.process(padded[i : i + frame]) for i in range(0, len(padded), frame)])


def speech_16k(text: str) -> Int16Array:
    """espeak-ng en-us at 150 wpm, resampled to the local STT's 16 kHz."""
    pcm, rate = espeak(text)
    return resample(pcm, rate, 16000)


def telephone_16k(text: str) -> Int16Array:
    """The same speech as a G.711 phone sends it and the gateway hands it on: 8 kHz, mu-law both ways, the frame
    contract's 24 kHz, then 16 kHz for the STT (the gateway's own resamplers after the phone)."""
    pcm, rate = espeak(text)
    narrow = g711.ulaw_decode(g711.ulaw_encode(resample(pcm, rate, 8000)))
    return _stream(_stream(narrow, 8000, 24000), 24000, 16000)
