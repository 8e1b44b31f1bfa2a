"""What the synthetic callers say: source audio and each call's planned send signal with its markers.

Sources (at the codec's sampling rate: 8 kHz for G.711, 16 kHz for G.722, 48 kHz for Opus):

- ``speech``: a WAV file when given; else real speech rendered once with espeak-ng and cached under
  ``$XDG_CACHE_HOME/voice-gateway/loadtest``; else (no espeak-ng) a built-in speech-like signal (a glottal
  pulse train with a wandering pitch through three moving formant resonators, in syllables).
- ``tone``: 440 Hz + 1 kHz, -12 dBFS. ``silence``: zeros (no markers either: there is nothing to find).

Speech has its pauses capped at ``PAUSE_CAP_MS`` (:func:`cap_pauses`): a sentence break of espeak-ng (up to
470 ms) or of the built-in signal (560 ms) inside a planned talk spurt comes close to a turn detector's
end-of-turn silence (500 ms in the fake provider and OpenAI's default), and one frame a jitter buffer inserts
there would end the caller's turn in the middle of a spurt.

:func:`plan_call_audio` lays a call out as talk spurts and pauses (:class:`~gateway.loadtest.config.TalkPattern`).
Every spurt is the next slice of the source with the marker chirp (:func:`gateway.loadtest.analysis.chirp`)
put in place of 60 ms of it, 200 ms in, so the marker's media time is known exactly and it never overlaps
speech it could be confused with.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import wave
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
from scipy import signal

from gateway.loadtest.analysis import Pcm, chirp
from gateway.loadtest.config import AudioKind, LoadConfigError, TalkPattern

log = logging.getLogger(__name__)

SPEECH_TEXT = (
    "Hello, I am calling about my order. It was supposed to arrive on Tuesday, but I have not seen it yet. "
    "Could you please check the status for me and tell me when it will be delivered? Thank you very much."
)
MARKER_MS = 60
MARKER_AT_MS = 200  # where in each talk spurt the marker sits
LEAD_IN_MS = 1000  # silence before the first spurt
_FADE_MS = 5
PAUSE_CAP_MS = 250  # longest quiet stretch left inside the speech source
_QUIET_DBFS = -35.0  # 10 ms blocks below this RMS count as quiet (turn detectors use about -45 dBFS)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "voice-gateway" / "loadtest"


def read_wav(path: str | Path) -> tuple[Pcm, int]:
    """Mono PCM16 samples and rate of a WAV file (stereo is averaged). Raises LoadConfigError otherwise."""
    try:
        with wave.open(str(path), "rb") as wav:
            if wav.getsampwidth() != 2:
                raise LoadConfigError(f"{path}: only 16-bit PCM WAV is supported")
            rate, channels = wav.getframerate(), wav.getnchannels()
            data = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
    except (OSError, wave.Error, EOFError) as exc:
        raise LoadConfigError(f"cannot read WAV {path}: {exc}") from exc
    if channels > 1:
        data = data.reshape(-1, channels).mean(axis=1)
    return np.asarray(data, dtype=np.int16), rate


def write_wav(path: str | Path, pcm: Pcm, rate: int) -> None:
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(np.asarray(pcm, dtype="<i2").tobytes())


def resample(pcm: Pcm, from_rate: int, to_rate: int) -> Pcm:
    if from_rate == to_rate:
        return pcm
    ratio = Fraction(to_rate, from_rate)
    y = signal.resample_poly(pcm.astype(np.float64), ratio.numerator, ratio.denominator)
    return np.clip(np.round(y), -32768, 32767).astype(np.int16)


def espeak_speech(rate: int, *, text: str = SPEECH_TEXT, directory: Path | None = None) -> Pcm | None:
    """Speech from espeak-ng at ``rate`` (rendered once, cached as a WAV), or None without espeak-ng."""
    directory = directory or cache_dir()
    key = hashlib.sha256(f"{text}|{rate}".encode()).hexdigest()[:16]
    path = directory / f"speech-{rate}-{key}.wav"
    if path.exists():
        pcm, file_rate = read_wav(path)
        if file_rate == rate:
            return pcm
    binary = shutil.which("espeak-ng")
    if binary is None:
        return None
    with tempfile.TemporaryDirectory() as work:
        raw = Path(work) / "espeak.wav"
        try:
            subprocess.run([binary, "-s", "150", "-w", str(raw), text], check=True, capture_output=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("espeak-ng failed (%s); using the built-in speech-like signal", exc)
            return None
        pcm, file_rate = read_wav(raw)
    pcm = _normalize(resample(pcm, file_rate, rate), -16.0)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    write_wav(tmp, pcm, rate)
    tmp.replace(path)  # atomic: concurrent workers never read half a file
    return pcm


def speech_like(rate: int, seconds: float = 8.0, *, seed: int = 7) -> Pcm:
    """A deterministic speech-like signal: voiced syllables with moving pitch and formants, short gaps."""
    rng = np.random.default_rng(seed)
    n = int(rate * seconds)
    t = np.arange(n) / rate
    f0 = 140 + 30 * np.sin(2 * np.pi * 0.7 * t) + 15 * np.sin(2 * np.pi * 2.3 * t)
    phase = np.cumsum(f0 / rate)
    pulses = (np.diff(np.floor(phase), prepend=0.0) > 0).astype(np.float64)
    excitation = pulses + 0.03 * rng.standard_normal(n)
    out = np.zeros(n)
    block = rate // 50
    formant_sets = ((700, 1200, 2600), (400, 2000, 2800), (300, 900, 2300), (550, 1700, 2500))
    zi: list[np.ndarray] = []
    for k in range(0, n, block):
        chunk = excitation[k : k + block]
        vowel = formant_sets[(k // (rate // 5)) % len(formant_sets)]
        y = np.zeros_like(chunk)
        for j, freq in enumerate(vowel):
            b, a = signal.iirpeak(min(freq, rate / 2 - 100), Q=8.0, fs=rate)
            if len(zi) <= j:
                zi.append(signal.lfilter_zi(b, a) * 0.0)
            part, zi[j] = signal.lfilter(b, a, chunk, zi=zi[j])
            y += part / (j + 1)
        out[k : k + block] = y
    syllables = 0.5 - 0.5 * np.cos(2 * np.pi * 4.0 * t)  # ~4 syllables per second
    words = (np.sin(2 * np.pi * 0.45 * t) > -0.7).astype(np.float64)
    return _normalize(out * syllables * words, -16.0)


def tone(rate: int, seconds: float = 4.0) -> Pcm:
    t = np.arange(int(rate * seconds)) / rate
    x = 0.5 * np.sin(2 * np.pi * 440 * t) + 0.5 * np.sin(2 * np.pi * 1000 * t)
    return np.round(x * 32767 * 10 ** (-12 / 20)).astype(np.int16)


def _normalize(x: np.ndarray, dbfs: float) -> Pcm:
    x = np.asarray(x, dtype=np.float64)
    rms = float(np.sqrt(np.mean(x * x))) if x.size else 0.0
    if rms == 0:
        return np.zeros(x.size, dtype=np.int16)
    y = x * (32767 * 10 ** (dbfs / 20) / rms)
    return np.clip(np.round(y), -32767, 32767).astype(np.int16)


def cap_pauses(pcm: Pcm, rate: int, *, max_ms: int = PAUSE_CAP_MS, quiet_dbfs: float = _QUIET_DBFS) -> Pcm:
    """``pcm`` with every quiet stretch (10 ms blocks below ``quiet_dbfs`` RMS) cut to at most ``max_ms``."""
    block = rate // 100
    whole = pcm.size // block * block
    blocks = pcm[:whole].reshape(-1, block)
    rms = np.sqrt(np.mean(blocks.astype(np.float64) ** 2, axis=1))
    quiet = rms < 32767 * 10 ** (quiet_dbfs / 20)
    keep = np.ones(quiet.size, dtype=bool)
    limit, run = max_ms // 10, 0
    for i, is_quiet in enumerate(quiet.tolist()):
        run = run + 1 if is_quiet else 0
        keep[i] = run <= limit
    return np.concatenate([blocks[keep].reshape(-1), pcm[whole:]])


def source_audio(kind: AudioKind, rate: int, *, wav: str | None = None) -> Pcm:
    """The audio the callers loop through, at ``rate`` (speech with its pauses capped)."""
    if kind == "silence":
        return np.zeros(rate, dtype=np.int16)
    if kind == "tone":
        return tone(rate)
    if wav is not None:
        pcm, file_rate = read_wav(wav)
        return cap_pauses(_normalize(resample(pcm, file_rate, rate), -16.0), rate)
    speech = espeak_speech(rate)
    return cap_pauses(speech if speech is not None else speech_like(rate), rate)


@dataclass(frozen=True, slots=True, kw_only=True)
class CallAudio:
    """One call's planned send signal and where its markers and talk spurts are (sample indices)."""

    rate: int
    pcm: Pcm
    markers: tuple[int, ...]  # sample index of each marker start (one per spurt, MARKER_AT_MS into it)
    spurts: tuple[tuple[int, int], ...]  # [start, end) of each talk spurt
    barged: tuple[bool, ...]  # spurt i is followed by a barge-in (its reply is expected to be cut off)
    first_pause: int  # sample index where the first pause starts (DTMF goes there)

    @property
    def frames(self) -> int:
        return self.pcm.size * 50 // self.rate


def silent_call_reason(seconds: float, pattern: TalkPattern, audio: AudioKind) -> str | None:
    """Why a call of ``seconds`` would send only silence (no talk spurt fits with its reply), or None.

    :func:`plan_call_audio` plans a spurt only when the lead-in, the spurt and its whole pause fit in the call.
    """
    needed_ms = LEAD_IN_MS + pattern.talk_ms + pattern.pause_ms
    if audio == "silence" or round(seconds * 50) * 20 >= needed_ms:
        return None
    return (
        f"a call of {seconds:g} s has no room for one talk spurt and its reply ({LEAD_IN_MS / 1000:g} s lead-in "
        f"+ {pattern.talk_ms / 1000:g} s talk + {pattern.pause_ms / 1000:g} s pause = {needed_ms / 1000:g} s): "
        f"its callers send only silence, with no marker and no round trip to measure; give --duration "
        f"{-(-needed_ms // 1000)} or more, or a shorter --talk-ms or --pause-ms"
    )


def plan_call_audio(
    source: Pcm, rate: int, *, seconds: float, pattern: TalkPattern, offset: int = 0, with_markers: bool = True
) -> CallAudio:
    """Lay ``seconds`` of a call out as spurts and pauses; ``offset`` picks where in ``source`` it starts.

    The call opens with ``LEAD_IN_MS`` of silence (the agent connects meanwhile), and each spurt's marker
    sits ``MARKER_AT_MS`` into it, after speech: an agent that treats the start of caller speech as a
    barge-in may drop what it had queued at that moment (the echo agent's echo of the spurt's first frames),
    and the marker must not be part of what an agent is entitled to drop.
    """
    frame = rate // 50
    total = round(seconds * 50) * frame
    pcm = np.zeros(total, dtype=np.int16)
    marker = chirp(rate, ms=MARKER_MS)
    talk = pattern.talk_ms * rate // 1000
    marker_at = MARKER_AT_MS * rate // 1000
    fade = np.linspace(0.0, 1.0, max(1, rate * _FADE_MS // 1000))
    markers: list[int] = []
    spurts: list[tuple[int, int]] = []
    barged: list[bool] = []
    position = LEAD_IN_MS * rate // 1000
    cursor = offset % max(1, source.size)
    k = 0
    silent = not source.any()
    long_pause = pattern.pause_ms * rate // 1000
    # A spurt is planned only when its full pause fits too: its reply must come back before the hang-up.
    while position + talk + long_pause <= total:
        piece = np.resize(np.roll(source, -cursor), talk).astype(np.float64)
        cursor = (cursor + piece.size) % max(1, source.size)
        piece[: fade.size] *= fade
        piece[-fade.size :] *= fade[::-1]
        start = position
        pcm[start : start + talk] = np.round(piece).astype(np.int16)
        if with_markers and not silent:
            at = start + marker_at
            pcm[at : at + marker.size] = marker  # replaces that slice of speech: nothing to confuse it with
            markers.append(at)
        spurts.append((start, start + talk))
        barge = pattern.barge_in_ms > 0 and k % 2 == 0
        barged.append(barge)
        pause = (pattern.barge_in_ms if barge else pattern.pause_ms) * rate // 1000
        position = start + talk + pause
        k += 1
    first_pause = spurts[0][1] if spurts else 0
    return CallAudio(
        rate=rate,
        pcm=pcm,
        markers=tuple(markers),
        spurts=tuple(spurts),
        barged=tuple(barged),
        first_pause=first_pause,
    )
