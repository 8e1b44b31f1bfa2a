"""Audio helpers of the fake OpenAI-compatible server: G.711 tables, an energy VAD, generated agent audio.

G.711 follows ITU-T G.711 (μ-law and A-law segment decoding); encoding picks the nearest code, which is exact
for every decoded value and plenty for generated test audio. The VAD is deliberately simple and deterministic
(a per-20 ms RMS level against a dBFS threshold, with the silence window of the session's ``server_vad``) so
tests can compute exactly where a turn starts and ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

AudioFormat = Literal["audio/pcm", "audio/pcmu", "audio/pcma"]
SAMPLE_RATE = 24_000


def _ulaw_table() -> npt.NDArray[np.int16]:
    codes = ~np.arange(256, dtype=np.int32) & 0xFF
    exponent = (codes >> 4) & 0x07
    mantissa = codes & 0x0F
    magnitude = (((mantissa << 3) + 0x84) << exponent) - 0x84
    return np.where(codes & 0x80, -magnitude, magnitude).astype(np.int16)


def _alaw_table() -> npt.NDArray[np.int16]:
    codes = np.arange(256, dtype=np.int32) ^ 0x55
    exponent = (codes >> 4) & 0x07
    mantissa = codes & 0x0F
    magnitude = np.where(exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0))
    return np.where(codes & 0x80, magnitude, -magnitude).astype(np.int16)


_DECODE = {"audio/pcmu": _ulaw_table(), "audio/pcma": _alaw_table()}


def _encoding_table(table: npt.NDArray[np.int16]) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.int16]]:
    """(codes, values) sorted by value, one code per value: μ-law has two zeros (0x7F and 0xFF); encoding keeps
    0xFF, the positive zero, so that encode(decode(code)) is the same code for every value encode can produce."""
    order = np.argsort(table, kind="stable")
    values = table[order]
    last_of_run = np.append(values[1:] != values[:-1], True)
    return order[last_of_run], values[last_of_run]


_SORTED = {fmt: _encoding_table(table) for fmt, table in _DECODE.items()}


def bytes_per_ms(fmt: AudioFormat) -> int:
    """PCM16 at 24 kHz: 48 bytes per ms; G.711 at 8 kHz: 8."""
    return 48 if fmt == "audio/pcm" else 8


def sample_rate(fmt: AudioFormat) -> int:
    return SAMPLE_RATE if fmt == "audio/pcm" else 8000


def decode(fmt: AudioFormat, data: bytes | memoryview) -> npt.NDArray[np.int16]:
    if fmt == "audio/pcm":
        return np.frombuffer(data[: len(data) - len(data) % 2], dtype="<i2")
    return _DECODE[fmt][np.frombuffer(data, dtype=np.uint8)]


def encode(fmt: AudioFormat, pcm: npt.NDArray[np.int16]) -> bytes:
    if fmt == "audio/pcm":
        return pcm.astype("<i2").tobytes()
    order, values = _SORTED[fmt]
    idx = np.clip(np.searchsorted(values, pcm), 1, len(values) - 1)
    nearer_left = (pcm - values[idx - 1]) < (values[idx] - pcm)
    return order[np.where(nearer_left, idx - 1, idx)].astype(np.uint8).tobytes()


def tone(fmt: AudioFormat, duration_ms: int, *, frequency: float = 440.0, level: float = 0.3) -> bytes:
    rate = sample_rate(fmt)
    t = np.arange(rate * duration_ms // 1000) / rate
    return encode(fmt, (np.sin(2 * np.pi * frequency * t) * level * 32767).astype(np.int16))


def speech_like(fmt: AudioFormat, duration_ms: int, *, seed: int = 0) -> bytes:
    """Voiced-sounding audio: a gliding 110-220 Hz pulse train with formant-ish harmonics, 4 syllables a second."""
    rate = sample_rate(fmt)
    rng = np.random.default_rng(seed)
    t = np.arange(rate * duration_ms // 1000) / rate
    pitch = 150 + 50 * np.sin(2 * np.pi * 0.7 * t + rng.uniform(0, np.pi))
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    voice = sum(np.sin(k * phase) / k for k in (1, 2, 3, 5, 7))
    syllables = np.clip(np.sin(2 * np.pi * 4 * t + rng.uniform(0, np.pi)), 0, None) ** 0.5
    signal = voice * syllables
    signal /= max(float(np.max(np.abs(signal))), 1e-9)
    return encode(fmt, (signal * 0.3 * 32767).astype(np.int16))


@dataclass(frozen=True, slots=True, kw_only=True)
class VadDecision:
    kind: Literal["started", "stopped"]
    ms: int  # audio_start_ms for "started" (frame start), audio_end_ms for "stopped"


class EnergyVad:
    """Per-20 ms RMS against ``threshold_dbfs``; speech stops after ``silence_ms`` of quiet frames.

    Positions are milliseconds of input audio since the connection began (OpenAI's audio_start_ms/end_ms).
    """

    FRAME_MS = 20

    def __init__(self, fmt: AudioFormat, *, threshold_dbfs: float = -45.0, silence_ms: int = 500) -> None:
        self.fmt = fmt
        self.threshold_dbfs = threshold_dbfs
        self.silence_ms = silence_ms
        self._frame_bytes = bytes_per_ms(fmt) * self.FRAME_MS
        self._frame_samples = sample_rate(fmt) * self.FRAME_MS // 1000
        # dbfs(frame) > threshold, as energy > this: no logarithm per frame (telcodecs.frames.dbfs's formula).
        self._loud_energy = self._frame_samples * 32768.0**2 * 10.0 ** (threshold_dbfs / 10.0)
        self._pending = bytearray()
        self._position_ms = 0
        self._speaking = False
        self._quiet_ms = 0

    @property
    def speaking(self) -> bool:
        return self._speaking

    def feed(self, data: bytes) -> list[VadDecision]:
        # An append of whole frames with nothing pending (the usual case) is read in place.
        audio = bytes(self._pending) + data if self._pending else data
        n = self._frame_bytes
        whole = len(audio) - len(audio) % n
        self._pending = bytearray(audio[whole:])
        decisions: list[VadDecision] = []
        for loud in self._loud(memoryview(audio)[:whole]) if whole else ():
            start_ms = self._position_ms
            self._position_ms += self.FRAME_MS
            if not self._speaking and loud:
                self._speaking = True
                self._quiet_ms = 0
                decisions.append(VadDecision(kind="started", ms=start_ms))
            elif self._speaking:
                self._quiet_ms = 0 if loud else self._quiet_ms + self.FRAME_MS
                if self._quiet_ms >= self.silence_ms:
                    self._speaking = False
                    decisions.append(VadDecision(kind="stopped", ms=self._position_ms))
        return decisions

    def _loud(self, frames: memoryview) -> list[bool]:
        """Whether each whole frame is over the threshold: one dot product for a frame, one batch for several
        (a quiet caller's 100 ms appends), each frame's energy against :attr:`_loud_energy`."""
        samples = decode(self.fmt, frames)
        if samples.size == self._frame_samples:
            x = samples.astype(np.float64)
            return [float(np.dot(x, x)) > self._loud_energy]
        batch = samples.reshape(-1, self._frame_samples).astype(np.float64)
        return (np.einsum("ij,ij->i", batch, batch) > self._loud_energy).tolist()  # type: ignore[no-any-return]
