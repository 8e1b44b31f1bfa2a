"""The frame contract: 24 kHz, mono, int16, 480 samples = 20 ms, with a monotonically increasing index.

Every part of the gateway that carries call audio (media, session, providers) uses this one type.
Providers that need another rate convert inside their adapter with :mod:`telcodecs.resample`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

SAMPLE_RATE = 24_000
FRAME_MS = 20
FRAME_SAMPLES = SAMPLE_RATE * FRAME_MS // 1000  # 480
FRAME_BYTES = FRAME_SAMPLES * 2  # 960: PCM16 little-endian

Pcm = npt.NDArray[np.int16]
G711Law = Literal["pcmu", "pcma"]
G711_FRAME_BYTES = 160  # 20 ms of 8 kHz G.711 codes

_SILENCE = np.zeros(FRAME_SAMPLES, dtype=np.int16)
_SILENCE.flags.writeable = False
_INT16 = np.dtype(np.int16)
_FULL_SCALE_ENERGY = 32768.0**2
_FRAME_SHAPE = (FRAME_SAMPLES,)


class FrameError(ValueError):
    """A buffer does not hold exactly one 20 ms, 24 kHz, mono PCM16 frame."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Frame:
    """One 20 ms frame of 24 kHz mono PCM16 audio.

    ``index`` counts frames of one direction of one call from 0 and never goes backwards.
    ``pcm`` is a read-only int16 array of exactly :data:`FRAME_SAMPLES` samples.
    ``g711`` optionally carries the same 20 ms as the caller's own G.711 codes (160 bytes of ``g711_law``),
    so a provider that takes G.711 gets them unchanged instead of a re-encoding of ``pcm`` (passthrough).
    """

    index: int
    pcm: Pcm
    g711: bytes | None = None
    g711_law: G711Law | None = None

    def __post_init__(self) -> None:
        pcm = self.pcm
        if pcm.dtype != _INT16 or pcm.shape != _FRAME_SHAPE:
            raise FrameError(f"frame needs int16[{FRAME_SAMPLES}], got {pcm.dtype}{list(pcm.shape)}")
        if self.index < 0:
            raise FrameError(f"frame index must be >= 0, got {self.index}")
        g711 = self.g711
        if g711 is not None and (len(g711) != G711_FRAME_BYTES or self.g711_law not in ("pcmu", "pcma")):
            raise FrameError(f"g711 needs {G711_FRAME_BYTES} codes and a law (pcmu or pcma)")

    @classmethod
    def from_bytes(cls, data: bytes, *, index: int) -> Frame:
        """Build a frame from 960 bytes of PCM16 little-endian."""
        if len(data) != FRAME_BYTES:
            raise FrameError(f"frame needs {FRAME_BYTES} bytes, got {len(data)}")
        pcm = np.frombuffer(data, dtype="<i2").astype(np.int16, copy=False)
        return cls(index=index, pcm=pcm)

    def to_bytes(self) -> bytes:
        """PCM16 little-endian, 960 bytes."""
        return self.pcm.astype("<i2", copy=False).tobytes()

    @property
    def level_dbfs(self) -> float:
        return dbfs(self.pcm)

    @property
    def is_silent(self) -> bool:
        return not self.pcm.any()


_new = object.__new__
_set_index = Frame.__dict__["index"].__set__  # the slots' own setters: what a frozen dataclass's __init__ calls
_set_pcm = Frame.__dict__["pcm"].__set__
_set_g711 = Frame.__dict__["g711"].__set__
_set_g711_law = Frame.__dict__["g711_law"].__set__


def unchecked_frame(index: int, pcm: Pcm, g711: bytes | None = None, g711_law: G711Law | None = None) -> Frame:
    """``Frame(index=..., pcm=..., g711=..., g711_law=...)`` without the checks of ``__post_init__``.

    For producers whose arrays meet the contract by construction: a row of an ``int16[n, 480]`` batch (the
    media tick), a 960-byte slice read as ``<i2`` (the playout), where every call makes one or two frames per
    20 ms and the checks were a measurable share (docs/performance/2026-12-01-frames-unchecked.md). The result is
    an ordinary, frozen ``Frame``; anything built from outside input goes through ``Frame(...)``.
    """
    frame: Frame = _new(Frame)
    _set_index(frame, index)
    _set_pcm(frame, pcm)
    _set_g711(frame, g711)
    _set_g711_law(frame, g711_law)
    return frame


def silence(*, index: int) -> Frame:
    """A frame of digital silence (shares one read-only buffer)."""
    return Frame(index=index, pcm=_SILENCE)


def dbfs(pcm: npt.NDArray[np.int16]) -> float:
    """RMS level relative to full scale (32768); -inf for digital silence.

    ``10 log10(energy / (n * 32768^2))`` with the energy as one dot product: the same figure as
    ``20 log10(rms / 32768)`` for a quarter of the cost of ``sqrt(mean(square(x)))`` on a 480-sample frame.
    """
    if pcm.size == 0:
        return float("-inf")
    samples = pcm.astype(np.float64)
    energy = float(np.dot(samples, samples))
    if energy == 0.0:
        return float("-inf")
    return 10.0 * math.log10(energy / (pcm.size * _FULL_SCALE_ENERGY))


def split_frames(pcm: npt.NDArray[np.int16], *, first_index: int = 0) -> tuple[list[Frame], Pcm]:
    """Cut a 24 kHz int16 signal into whole frames; returns the frames and the leftover samples."""
    whole = pcm.shape[0] // FRAME_SAMPLES
    frames = [
        Frame(index=first_index + i, pcm=np.ascontiguousarray(pcm[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES]))
        for i in range(whole)
    ]
    return frames, pcm[whole * FRAME_SAMPLES :]
