"""Test audio for the real-peer tests: speech from espeak-ng, WAV I/O, alignment and correlation.

- `speech_wav` renders real speech with espeak-ng and converts it with sox to the rate/channels a phone
  plays (8 kHz mono for G.711 phones, 48 kHz stereo for Opus phones); results are cached on disk, keyed by
  text, voice, speed, rate and channels, so a suite renders each sentence once.
- WAV files are read and written with the stdlib `wave` module as int16 numpy arrays shaped
  (frames, channels).
- `align_and_correlate` answers "is what the far end recorded what we sent?": it finds the lag by
  cross-correlation (so leading silence, jitter-buffer delay and call set-up time do not matter) and
  returns the Pearson correlation of the aligned overlap (so codec noise lowers it only a little).
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import subprocess
import tempfile
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from scipy import signal

__all__ = [
    "Wav",
    "align_and_correlate",
    "chirp_marker",
    "envelope",
    "peak_dbfs",
    "read_wav",
    "resample",
    "rms",
    "rms_dbfs",
    "silence",
    "speech_wav",
    "to_mono",
    "tone",
    "with_silence",
    "write_wav",
]

FloatArray = npt.NDArray[np.float64]
Int16Array = npt.NDArray[np.int16]


@dataclass(frozen=True, kw_only=True)
class Wav:
    """PCM16 audio: `samples` has shape (frames, channels)."""

    samples: Int16Array
    rate: int

    @property
    def channels(self) -> int:
        return int(self.samples.shape[1])

    @property
    def duration(self) -> float:
        return float(self.samples.shape[0] / self.rate)

    def mono(self) -> FloatArray:
        return to_mono(self.samples)


def read_wav(path: Path | str) -> Wav:
    """A PCM16 WAV file as int16 samples shaped (frames, channels)."""
    with wave.open(str(path), "rb") as wav:
        if wav.getsampwidth() != 2:
            raise ValueError(f"{path}: {8 * wav.getsampwidth()}-bit samples, expected 16-bit PCM")
        channels = wav.getnchannels()
        data = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").astype(np.int16)
        return Wav(samples=data.reshape(-1, channels), rate=wav.getframerate())


def write_wav(path: Path | str, samples: npt.ArrayLike, rate: int) -> Path:
    """Write int16 (or float in [-1, 1]) samples, shaped (frames,) or (frames, channels), as PCM16 WAV."""
    array = np.asarray(samples)
    if array.dtype.kind == "f":
        array = np.clip(np.round(array * 32767.0), -32768, 32767)
    array = array.astype("<i2")
    if array.ndim == 1:
        array = array[:, None]
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(array.shape[1])
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(array.tobytes())
    return Path(path)


def to_mono(samples: npt.ArrayLike) -> FloatArray:
    """Float64 mono in [-1, 1] from int16 or float samples, (frames,) or (frames, channels)."""
    array = np.asarray(samples)
    scale = 32768.0 if array.dtype.kind in "iu" else 1.0
    floats = array.astype(np.float64) / scale
    if floats.ndim == 2:
        floats = floats.mean(axis=1)
    return floats


def resample(samples: npt.ArrayLike, from_rate: int, to_rate: int) -> FloatArray:
    """Polyphase resampling of mono audio (float64 out) for comparing signals of different rates."""
    mono = to_mono(samples)
    if from_rate == to_rate:
        return mono
    g = math.gcd(from_rate, to_rate)
    return np.asarray(signal.resample_poly(mono, to_rate // g, from_rate // g), dtype=np.float64)


def rms(samples: npt.ArrayLike) -> float:
    """Root mean square of the mono signal, full scale = 1.0."""
    mono = to_mono(samples)
    return float(np.sqrt(np.mean(mono**2))) if mono.size else 0.0


def rms_dbfs(samples: npt.ArrayLike) -> float:
    """RMS level in dBFS (-inf for digital silence)."""
    value = rms(samples)
    return 20.0 * math.log10(value) if value > 0 else -math.inf


def peak_dbfs(samples: npt.ArrayLike) -> float:
    mono = to_mono(samples)
    peak = float(np.max(np.abs(mono))) if mono.size else 0.0
    return 20.0 * math.log10(peak) if peak > 0 else -math.inf


def envelope(samples: npt.ArrayLike, rate: int, *, window: float = 0.01) -> FloatArray:
    """Amplitude envelope: rectified signal smoothed over `window` seconds (same length as the input)."""
    mono = np.abs(to_mono(samples))
    width = max(1, round(window * rate))
    return np.asarray(np.convolve(mono, np.ones(width) / width, mode="same"), dtype=np.float64)


def silence(seconds: float, rate: int, channels: int = 1) -> Int16Array:
    return np.zeros((round(seconds * rate), channels), dtype=np.int16)


def tone(freq: float, seconds: float, rate: int, *, amplitude: float = 0.5) -> Int16Array:
    t = np.arange(round(seconds * rate)) / rate
    return np.round(amplitude * 32767 * np.sin(2 * np.pi * freq * t)).astype(np.int16)


def chirp_marker(
    rate: int, *, seconds: float = 0.25, f0: float = 300.0, f1: float = 3400.0, amplitude: float = 0.5
) -> Int16Array:
    """A linear sweep inside the telephone band with raised-cosine edges: an unmistakable alignment mark."""
    n = round(seconds * rate)
    t = np.arange(n) / rate
    sweep = signal.chirp(t, f0=f0, t1=seconds, f1=f1, method="linear")
    fade = np.ones(n)
    edge = max(1, n // 10)
    ramp = 0.5 - 0.5 * np.cos(np.linspace(0, np.pi, edge))
    fade[:edge], fade[-edge:] = ramp, ramp[::-1]
    return np.round(amplitude * 32767 * sweep * fade).astype(np.int16)


def with_silence(wav: Wav, *, lead: float = 0.0, tail: float = 0.0) -> Wav:
    """The same audio with silence before and after (baresip hangs up when its source WAV ends)."""
    parts = [silence(lead, wav.rate, wav.channels), wav.samples, silence(tail, wav.rate, wav.channels)]
    return Wav(samples=np.concatenate(parts, axis=0), rate=wav.rate)


def align_and_correlate(
    sent: npt.ArrayLike,
    received: npt.ArrayLike,
    rate: int,
    *,
    max_lag_seconds: float | None = None,
    use_envelope: bool = False,
    max_slip_seconds: float = 0.03,
    window_seconds: float = 0.25,
) -> tuple[float, int]:
    """(correlation of the aligned signals, lag in samples) of `received` against `sent`.

    Both are mono or multichannel at the same `rate` (resample first if needed). The lag is where the
    cross-correlation peaks: received[n + lag] corresponds to sent[n], so leading silence and set-up
    delay do not matter.

    With `max_slip_seconds=0` the correlation is the Pearson correlation of the whole aligned overlap.
    Otherwise (the default) a real receiver's jitter buffer may have dropped or inserted a frame or two
    mid-call, so the sent signal is cut into `window_seconds` windows, each window is re-aligned within
    +-`max_slip_seconds` of where the window before it was found (the first within a window of the global
    lag), so slips that add up over a call are followed, and the result is the energy-weighted mean of the windows'
    Pearson correlations; a window whose counterpart is missing from `received` counts as 0.

    `use_envelope` compares amplitude envelopes instead of waveforms: for codecs that keep loudness
    but not the waveform.
    """
    s = to_mono(sent)
    r = to_mono(received)
    if s.size == 0 or r.size == 0:
        return 0.0, 0
    if use_envelope:
        s, r = envelope(s, rate), envelope(r, rate)
    s = s - s.mean()
    r = r - r.mean()
    corr = signal.correlate(r, s, mode="full", method="fft")
    lags = signal.correlation_lags(r.size, s.size, mode="full")
    if max_lag_seconds is not None:
        keep = np.abs(lags) <= round(max_lag_seconds * rate)
        corr, lags = corr[keep], lags[keep]
    lag = int(lags[int(np.argmax(corr))])
    if max_slip_seconds <= 0:
        start = max(0, -lag)
        stop = min(s.size, r.size - lag)
        return (_pearson(s[start:stop], r[start + lag : stop + lag]) if stop - start >= 2 else 0.0), lag
    return _windowed_correlation(s, r, lag, round(window_seconds * rate), round(max_slip_seconds * rate)), lag


def _pearson(a: FloatArray, b: FloatArray) -> float:
    if a.size < 2 or np.std(a) == 0 or np.std(b) == 0:
        return 0.0
    return float(np.corrcoef(a, b)[0, 1])


def _windowed_correlation(s: FloatArray, r: FloatArray, lag: int, window: int, slip: int) -> float:
    window = max(2, min(window, s.size))
    quiet = 0.05 * float(np.sqrt(np.mean(s**2)))
    total_weight = 0.0
    total = 0.0
    followed = False
    for start in range(0, s.size - window + 1, window):
        piece = s[start : start + window]
        energy = float(np.sum(piece**2))
        if np.sqrt(energy / window) <= quiet:
            continue  # silence in what was sent says nothing about the path
        total_weight += energy
        reach = slip if followed else window  # the global lag may sit between slips: the first looks wider
        low = max(0, start + lag - reach)
        high = min(r.size, start + lag + window + reach)
        if high - low < window:
            continue  # the receiver does not have this part at all: counts as 0
        region = r[low:high]
        local = signal.correlate(region, piece, mode="valid", method="fft")
        offset = int(np.argmax(local))
        total += energy * _pearson(piece, region[offset : offset + window])
        lag = low + offset - start  # slips add up: the next window is looked for where this one was found
        followed = True
    return total / total_weight if total_weight > 0 else 0.0


# -- speech ----------------------------------------------------------------------------------------------


def _cache_dir() -> Path:
    path = Path(os.environ.get("VGW_TEST_AUDIO_CACHE", Path(tempfile.gettempdir()) / "vgw-speech-cache"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def speech_wav(
    text: str,
    path: Path | str,
    rate: int = 8000,
    channels: int = 1,
    *,
    voice: str = "en-us",
    words_per_minute: int = 150,
) -> Path:
    """Render `text` with espeak-ng into a PCM16 WAV at `rate`/`channels` (via sox); cached; returns `path`."""
    key = hashlib.sha256(f"{voice}|{words_per_minute}|{rate}|{channels}|{text}".encode()).hexdigest()[:24]
    cached = _cache_dir() / f"{key}.wav"
    if not cached.exists():
        with tempfile.TemporaryDirectory(dir=cached.parent) as work:
            raw = Path(work) / "espeak.wav"
            converted = Path(work) / "converted.wav"
            subprocess.run(
                ["espeak-ng", "-v", voice, "-s", str(words_per_minute), "-w", str(raw), text],
                check=True,
                capture_output=True,
                timeout=60,
            )
            subprocess.run(
                [
                    "sox",
                    str(raw),
                    "-r",
                    str(rate),
                    "-c",
                    str(channels),
                    "-b",
                    "16",
                    "-e",
                    "signed-integer",
                    str(converted),
                ],
                check=True,
                capture_output=True,
                timeout=60,
            )
            # Atomic, so parallel workers rendering the same sentence never see half a file.
            os.replace(converted, cached)
    target = Path(path)
    if target.resolve() != cached.resolve():
        shutil.copyfile(cached, target)
    return target
