"""The labelled set answering-machine detection is measured on, built from espeak-ng speech and tones.

Each case is what the callee's side sends in the first seconds after answering, at 24 kHz, with its label:

- human:   a short greeting ("Hello?", "Yes, this is Dana.") then silence, as a person waits for an answer;
           some say two short phrases with a pause between; some answer after a moment of silence;
- machine: a long greeting (personal voicemail, carrier voicemail, a business's recording) then a beep
           (400-1400 Hz, 0.2-0.8 s) then silence; some with a short "Hi!" and a pause first, the case
           that fools timing-only detectors; some carrier greetings without a beep;
- fax:     CNG (1100 Hz, 0.5 s on, 3 s off), with or without silence first.

Voices (espeak-ng's en-us, en-gb and variants), speeds, levels and a noise floor vary per case, from a seed,
so the set is the same on every machine that has espeak-ng. `build()` renders it once into a cache directory.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from gateway.loadtest.audio import cache_dir, read_wav, resample, write_wav

RATE = 24_000

HUMAN_GREETINGS = (
    "Hello?",
    "Hello, who is this?",
    "Yes?",
    "Hi, this is Dana.",
    "Good morning.",
    "Hello, Sam speaking.",
    "Yeah, hello?",
    "Speaking.",
)
MACHINE_GREETINGS = (
    "Hi, you have reached Alex. I can't take your call right now. Please leave your name and number after the "
    "tone and I will call you back.",
    "The person you are calling is not available. Please leave a message after the tone.",
    "Thank you for calling Riverside Dental. Our office is currently closed. Our opening hours are nine to five, "
    "Monday to Friday. Please leave a message.",
    "Hello, this is Maria. Sorry I missed you. Leave a message and I will get back to you as soon as I can.",
    "You have reached the voicemail box of extension two four one. Please record your message after the beep.",
    "Hey, it's Chris. Leave a message.",
)
VOICES = ("en-us", "en-gb", "en-us+f3", "en-us+m3", "en-gb+f2")


@dataclass(frozen=True, kw_only=True)
class Case:
    name: str
    label: str  # human, machine, fax
    path: Path
    beep_at_s: float | None = None  # where the machine's beep starts (machines with one)
    spoken: tuple[Spoken, ...] = ()  # what is said, where: the oracle STT's text and the utterances' bounds


@dataclass(frozen=True, kw_only=True)
class Spoken:
    text: str
    start_s: float
    end_s: float


def _espeak(text: str, voice: str, speed: int, directory: Path) -> npt.NDArray[np.int16]:
    key = hashlib.sha256(f"{text}|{voice}|{speed}".encode()).hexdigest()[:16]
    path = directory / f"amd-speech-{key}.wav"
    if not path.exists():
        binary = shutil.which("espeak-ng")
        if binary is None:
            raise RuntimeError("the AMD set needs espeak-ng (Debian espeak-ng)")
        with tempfile.TemporaryDirectory() as work:
            raw = Path(work) / "espeak.wav"
            subprocess.run(
                [binary, "-v", voice, "-s", str(speed), "-w", str(raw), text],
                check=True,
                capture_output=True,
                timeout=60,
            )
            pcm, rate = read_wav(raw)
            write_wav(path, resample(pcm, rate, RATE), RATE)
    pcm, _ = read_wav(path)
    return pcm


def _level(x: npt.NDArray[np.float64], dbfs: float) -> npt.NDArray[np.float64]:
    rms = float(np.sqrt(np.mean(x * x))) or 1.0
    return x * (32768.0 * 10 ** (dbfs / 20) / rms)


def _sine(hz: float, seconds: float, dbfs: float) -> npt.NDArray[np.float64]:
    t = np.arange(int(RATE * seconds)) / RATE
    ramp = np.minimum(1.0, np.minimum(t, seconds - t) / 0.005)  # 5 ms edges, as real beeps have
    return np.sin(2 * np.pi * hz * t) * ramp * 32768.0 * 10 ** ((dbfs + 3.0) / 20)


def _silence(seconds: float) -> npt.NDArray[np.float64]:
    return np.zeros(int(RATE * seconds))


def _finish(parts: list[npt.NDArray[np.float64]], rng: np.random.Generator, noise_dbfs: float) -> npt.NDArray[np.int16]:
    x = np.concatenate(parts)
    x = x + rng.standard_normal(x.size) * 32768.0 * 10 ** (noise_dbfs / 20)
    return np.clip(np.round(x), -32768, 32767).astype(np.int16)


def build(directory: Path | None = None, *, per_label: int = 40, seed: int = 2026) -> list[Case]:
    """Render the set (once; cached) and return its cases."""
    directory = directory or cache_dir() / "amd-set"
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    cases: list[Case] = []

    texts: dict[int, str] = {}  # id() of a speech part -> its text, for the case's `spoken`

    def speech(text: str) -> npt.NDArray[np.float64]:
        voice = VOICES[int(rng.integers(len(VOICES)))]
        pcm = _espeak(text, voice, int(rng.integers(140, 190)), directory)
        part = _level(pcm.astype(np.float64), float(rng.uniform(-26, -14)))
        texts[id(part)] = text
        return part

    def save(
        name: str, label: str, parts: list[npt.NDArray[np.float64]], noise: float, beep_at: float | None = None
    ) -> None:
        path = directory / f"{name}.wav"
        spoken: list[Spoken] = []
        at = 0
        for part in parts:
            if id(part) in texts:
                spoken.append(Spoken(text=texts[id(part)], start_s=at / RATE, end_s=(at + part.size) / RATE))
            at += part.size
        write_wav(path, _finish(parts, rng, noise), RATE)
        cases.append(Case(name=name, label=label, path=path, beep_at_s=beep_at, spoken=tuple(spoken)))
        texts.clear()

    for i in range(per_label):
        noise = float(rng.uniform(-70, -50))
        first = _silence(float(rng.uniform(0.05, 0.9)))
        parts = [first, speech(HUMAN_GREETINGS[i % len(HUMAN_GREETINGS)])]
        if i % 5 == 4:  # "Hello?" ... "Hello, anyone there?"
            parts += [_silence(float(rng.uniform(1.2, 2.0))), speech("Hello, anyone there?")]
        parts.append(_silence(3.0))
        save(f"human-{i:03d}", "human", parts, noise)

    for i in range(per_label):
        noise = float(rng.uniform(-70, -50))
        parts = [_silence(float(rng.uniform(0.05, 0.9)))]
        if i % 6 == 5:  # "Hi!" ... then the recording: a pause that looks like a person waiting
            parts += [speech("Hi!"), _silence(float(rng.uniform(0.3, 0.6)))]
        parts.append(speech(MACHINE_GREETINGS[i % len(MACHINE_GREETINGS)]))
        beep_at = None
        if i % 8 != 7:  # a few carriers' greetings end without a beep
            parts.append(_silence(float(rng.uniform(0.2, 0.8))))
            beep_at = sum(p.size for p in parts) / RATE
            parts.append(
                _sine(float(rng.uniform(400, 1400)), float(rng.uniform(0.2, 0.8)), float(rng.uniform(-20, -10)))
            )
        parts.append(_silence(3.0))
        save(f"machine-{i:03d}", "machine", parts, noise, beep_at)

    for i in range(per_label // 4):
        noise = float(rng.uniform(-70, -50))
        parts = [_silence(float(rng.uniform(0.0, 1.5)))]
        for _ in range(2):
            parts += [_sine(1100.0, 0.5, float(rng.uniform(-24, -12))), _silence(3.0)]
        save(f"fax-{i:03d}", "fax", parts, noise)
    return cases
