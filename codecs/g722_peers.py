"""Two other G.722 implementations, to check :mod:`telcodecs.g722` against and to measure it by: not on the media path.

- :class:`SpandspEncoder` / :class:`SpandspDecoder`: spandsp's G.722 (Debian ``libspandsp2``, what baresip's
  g722 module and FreeSWITCH use) through ctypes. ``itu_test_mode=True`` turns on spandsp's ITU test
  configuration, the QMFs bypassed (ITU-T G.722 Appendix II configurations 1 and 2): the encoder takes one
  15-bit word per code, the decoder gives the lower and upper band reconstructions as pairs. spandsp keeps the
  switch as the first ``int`` of its state (``itu_test_mode`` in ``spandsp/private/g722.h`` of 0.0.6, the version
  Debian 12 ships); it has no setter, so it is written there, and :meth:`SpandspEncoder.encode` checks that it
  took effect (one code per input word instead of one per two samples).
- :class:`FfmpegEncoder` / :class:`FfmpegDecoder`: FFmpeg's ``g722`` encoder and decoder through PyAV's codec
  contexts (PyAV is a dependency).

Both have the interface of :class:`~telcodecs.g722.G722Encoder` / :class:`~telcodecs.g722.G722Decoder`
(``encode(pcm) -> bytes``, ``decode(codes) -> int16``), 64 kbit/s, 16 kHz. :func:`spandsp_available` says
whether spandsp loads here; tests skip (or, under CI, fail) through their own peer helpers when it does not.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from telcodecs.g722 import BIT_RATE, FRAME_SAMPLES, SAMPLE_RATE, G722Error

__all__ = [
    "FfmpegDecoder",
    "FfmpegEncoder",
    "SpandspDecoder",
    "SpandspEncoder",
    "spandsp_available",
    "spandsp_path",
]

_SPANDSP_NAMES: Final = ("spandsp", "libspandsp.so.3", "libspandsp.so.2")


@functools.cache
def _spandsp() -> tuple[str, ctypes.CDLL] | None:
    candidates = [ctypes.util.find_library("spandsp"), *_SPANDSP_NAMES[1:]]
    for name in candidates:
        if name is None:
            continue
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        void_p, c_int = ctypes.c_void_p, ctypes.c_int
        for prefix in ("g722_encode", "g722_decode"):
            init = getattr(lib, f"{prefix}_init")
            init.restype, init.argtypes = void_p, [void_p, c_int, c_int]
            free = getattr(lib, f"{prefix}_free")
            free.restype, free.argtypes = c_int, [void_p]
            run = getattr(lib, prefix)
            run.restype, run.argtypes = c_int, [void_p, void_p, void_p, c_int]
        return name, lib
    return None


def spandsp_available() -> bool:
    return _spandsp() is not None


def spandsp_path() -> str:
    found = _spandsp()
    return found[0] if found is not None else ""


def _lib() -> ctypes.CDLL:
    found = _spandsp()
    if found is None:
        raise G722Error("spandsp not found (Debian: apt-get install libspandsp2)")
    return found[1]


class _SpandspState:
    __slots__ = ("_free", "_state")

    def __init__(self, prefix: str, bit_rate: int, itu_test_mode: bool) -> None:
        lib = _lib()
        state = getattr(lib, f"{prefix}_init")(None, bit_rate, 0)
        if not state:
            raise G722Error(f"spandsp {prefix}_init refused {bit_rate} bit/s")
        self._state: int = state
        self._free = getattr(lib, f"{prefix}_free")
        if itu_test_mode:
            ctypes.c_int.from_address(state).value = 1

    def __del__(self) -> None:
        if getattr(self, "_state", 0):
            self._free(self._state)
            self._state = 0


class SpandspEncoder:
    """spandsp's G.722 encoder; with ``itu_test_mode`` the QMF is bypassed and each 15-bit input word makes a code."""

    __slots__ = ("_encode", "_state", "itu_test_mode")

    def __init__(self, *, itu_test_mode: bool = False) -> None:
        self._state = _SpandspState("g722_encode", BIT_RATE, itu_test_mode)
        self._encode = _lib().g722_encode
        self.itu_test_mode = itu_test_mode

    def encode(self, pcm: npt.NDArray[np.int16]) -> bytes:
        pcm = np.ascontiguousarray(pcm, dtype=np.int16)
        want = pcm.shape[0] if self.itu_test_mode else pcm.shape[0] // 2
        out = ctypes.create_string_buffer(max(1, pcm.shape[0]))
        made: int = self._encode(self._state._state, out, pcm.ctypes.data, pcm.shape[0])
        if made != want:
            raise G722Error(f"spandsp made {made} codes from {pcm.shape[0]} samples, expected {want}")
        return out.raw[:made]


class SpandspDecoder:
    """spandsp's G.722 decoder at ``bit_rate`` (64000, 56000 or 48000); with ``itu_test_mode`` the QMF is bypassed
    and each code gives (lower band, upper band) reconstructions, each shifted left one bit."""

    __slots__ = ("_decode", "_state")

    def __init__(self, *, bit_rate: int = BIT_RATE, itu_test_mode: bool = False) -> None:
        self._state = _SpandspState("g722_decode", bit_rate, itu_test_mode)
        self._decode = _lib().g722_decode

    def decode(self, codes: bytes) -> npt.NDArray[np.int16]:
        out = np.empty(2 * len(codes), dtype=np.int16)
        made: int = self._decode(self._state._state, out.ctypes.data, codes, len(codes))
        return out[:made]


class FfmpegEncoder:
    """FFmpeg's G.722 encoder (``g722``, no trellis) through a PyAV codec context."""

    __slots__ = ("_context", "_pts")

    def __init__(self) -> None:
        import av

        context: Any = av.CodecContext.create("g722", "w")
        context.sample_rate, context.format, context.layout = SAMPLE_RATE, "s16", "mono"
        context.open()
        self._context = context
        self._pts = 0

    def encode(self, pcm: npt.NDArray[np.int16]) -> bytes:
        """Whole 20 ms frames only (a multiple of 320 samples): FFmpeg holds back a partial frame's codes."""
        import av

        if pcm.shape[0] % FRAME_SAMPLES:
            raise G722Error(f"FFmpeg's G.722 encoder takes multiples of {FRAME_SAMPLES} samples, got {pcm.shape[0]}")
        samples = np.ascontiguousarray(pcm, dtype=np.int16).reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
        frame.sample_rate = SAMPLE_RATE
        frame.pts = self._pts
        self._pts += pcm.shape[0]
        return b"".join(bytes(packet) for packet in self._context.encode(frame))


class FfmpegDecoder:
    """FFmpeg's G.722 decoder (``g722``) through a PyAV codec context."""

    __slots__ = ("_context",)

    def __init__(self) -> None:
        import av

        context: Any = av.CodecContext.create("g722", "r")
        context.sample_rate, context.layout = SAMPLE_RATE, "mono"
        self._context = context

    def decode(self, codes: bytes) -> npt.NDArray[np.int16]:
        import av

        frames = self._context.decode(av.Packet(codes))
        parts = [np.asarray(frame.to_ndarray(), dtype=np.int16).reshape(-1) for frame in frames]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int16)
