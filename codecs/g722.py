"""G.722 (ITU-T G.722, 64 kbit/s mode): 16 kHz wideband audio as 8 bits per pair of samples.

This module owns one encoder and one decoder object per call direction, each with its own state (the two
sub-band ADPCM coders and the QMF histories); PCM is int16 at 16 kHz, the codes are one octet per two samples
(RFC 3551 §4.5.2: 20 ms is 320 samples in, 160 octets out). The RTP clock of G.722 is 8000 although the codec
samples at 16 kHz (RFC 3551 §4.5.2), so the timestamp advances 160 per 20 ms: that is the media layer's
business, not this module's.

The codec is libg722 (the PyPI package ``G722``, Sippy Software's packaging of the Bellcore / CMU / Steve
Underwood code that spandsp also grew from), a C extension with a NumPy output path (``G722-numpy``). Why this
one, and how it was checked against spandsp and FFmpeg bit for bit: docs/adr/0021-g722-through-libg722.md.

- :meth:`G722Encoder.encode` takes any even number of samples (a 20 ms frame is 320) and returns half as many
  octets; the encoder's state carries over, so a signal cut into frames codes exactly as the whole signal.
- :meth:`G722Decoder.decode` takes any number of octets and returns twice as many samples. Every octet is a
  valid code, so nothing a peer sends can make it fail; a payload whose size is wrong for the call is the media
  layer's to refuse before it reaches the decoder.
- ``reset()`` puts either back in its initial state (a new stream from a peer whose encoder restarted).
- The codec delays the signal by :data:`CODEC_DELAY_SAMPLES` (the transmit and receive QMFs together).
"""

from __future__ import annotations

from importlib import metadata
from typing import Any, Final

import numpy as np
import numpy.typing as npt

__all__ = [
    "BIT_RATE",
    "CODEC_DELAY_SAMPLES",
    "FRAME_BYTES",
    "FRAME_SAMPLES",
    "RTP_CLOCK_RATE",
    "SAMPLE_RATE",
    "G722Decoder",
    "G722Encoder",
    "G722Error",
    "library_version",
]

SAMPLE_RATE: Final = 16_000
RTP_CLOCK_RATE: Final = 8_000  # RFC 3551 §4.5.2: "erroneously" 8000, kept for compatibility
BIT_RATE: Final = 64_000  # mode 1: 6 bits for the lower band, 2 for the upper (the mode RTP payload type 9 carries)
FRAME_SAMPLES: Final = 320  # 20 ms at 16 kHz
FRAME_BYTES: Final = 160  # 20 ms at 64 kbit/s
CODEC_DELAY_SAMPLES: Final = 22  # encoder + decoder, at 16 kHz (measured: tests/telcodecs/test_g722.py)


class G722Error(ValueError):
    """PCM of the wrong dtype or shape, codes that are not bytes, or no libg722 to load."""


def _codec_class() -> Any:
    try:
        from G722 import G722
    except ImportError as exc:  # pragma: no cover - G722 is a dependency
        raise G722Error("libg722 not found: pip install 'G722[numpy]' (the G722 and G722-numpy packages)") from exc
    return G722


def _new_state() -> Any:
    # One libg722 object holds an encoder and a decoder state; each of our objects uses one side of its own.
    # use_numpy=True: decode returns an int16 ndarray that owns libg722's buffer (no copy, no array('h')).
    return _codec_class()(SAMPLE_RATE, BIT_RATE, use_numpy=True)


def library_version() -> str:
    """The libg722 package versions in use, e.g. ``libg722 1.2.8 (G722 1.2.8, G722-numpy 1.2.8)``."""
    try:
        core = metadata.version("G722")
    except metadata.PackageNotFoundError:  # pragma: no cover - G722 is a dependency
        return "libg722 absent"
    try:
        numpy_addon = metadata.version("G722-numpy")
    except metadata.PackageNotFoundError:  # pragma: no cover - G722-numpy is a dependency
        numpy_addon = "absent"
    return f"libg722 {core} (G722 {core}, G722-numpy {numpy_addon})"


class G722Encoder:
    """G.722 codes from 16 kHz int16 PCM, one call direction's worth of state."""

    __slots__ = ("_encode", "_state")

    def __init__(self) -> None:
        self._state = _new_state()
        self._encode = self._state.encode

    def encode(self, pcm: npt.NDArray[np.int16]) -> bytes:
        """Half as many octets as ``pcm`` has samples (an even number, 1-D int16): 160 for a 20 ms frame."""
        if not isinstance(pcm, np.ndarray) or pcm.dtype != np.int16 or pcm.ndim != 1 or pcm.shape[0] % 2:
            raise G722Error(
                f"encode needs a 1-D int16 array of an even length, got {getattr(pcm, 'dtype', type(pcm))}"
                f"{list(getattr(pcm, 'shape', []))}"
            )
        if not pcm.flags.c_contiguous:
            pcm = np.ascontiguousarray(pcm)
        codes: bytes = self._encode(pcm)  # read in place through the buffer protocol
        return codes

    def reset(self) -> None:
        """Back to the initial state, as a new encoder."""
        self._state = _new_state()
        self._encode = self._state.encode


class G722Decoder:
    """16 kHz int16 PCM from G.722 codes, one call direction's worth of state."""

    __slots__ = ("_decode", "_state")

    def __init__(self) -> None:
        self._state = _new_state()
        self._decode = self._state.decode

    def decode(self, codes: bytes) -> npt.NDArray[np.int16]:
        """Twice as many samples as ``codes`` has octets: 320 for a 20 ms payload of 160. Never fails on content."""
        if type(codes) is not bytes:
            if not isinstance(codes, bytes | bytearray | memoryview):
                raise G722Error(f"decode needs bytes, got {type(codes).__name__}")
            codes = bytes(codes)
        pcm: npt.NDArray[np.int16] = self._decode(codes)
        return pcm

    def reset(self) -> None:
        """Back to the initial state, as a new decoder (the peer's encoder restarted)."""
        self._state = _new_state()
        self._decode = self._state.decode
