"""G.711 µ-law and A-law (ITU-T G.711), bit-exact to the ITU-T G.191 reference (``g711.c``).

This module owns the two companding laws as lookup tables. Each law's reference rule is written once,
as a small pure function on one sample or one code (:func:`ulaw_compress_sample` and friends); the tables
are built from those functions at import time and every public function is a table lookup:

* encode: a 65,536-entry ``uint8`` table indexed by the sample's bits read as ``uint16``;
* decode: a 256-entry ``int16`` table indexed by the code.

Why the reference and not "a" G.711: implementations disagree at segment edges. The stdlib ``audioop``
µ-law encoder negates a negative sample before shifting where G.191 takes the one's complement
(508 of the 65,536 inputs differ); FFmpeg's tables differ on 964 inputs per law. Peers that follow G.191
(and the G.711 conformance vectors) expect the reference rule, so that is what these tables hold.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import numpy as np
import numpy.typing as npt

__all__ = [
    "ALAW_SILENCE",
    "ULAW_SILENCE",
    "G711Error",
    "alaw_compress_sample",
    "alaw_decode",
    "alaw_decode_batch",
    "alaw_encode",
    "alaw_encode_batch",
    "alaw_expand_code",
    "alaw_to_ulaw",
    "ulaw_compress_sample",
    "ulaw_decode",
    "ulaw_decode_batch",
    "ulaw_encode",
    "ulaw_encode_batch",
    "ulaw_expand_code",
    "ulaw_to_alaw",
]

ULAW_SILENCE: Final = 0xFF
"""µ-law code of a zero sample (positive zero)."""
ALAW_SILENCE: Final = 0xD5
"""A-law code of a zero sample (positive zero, even bits toggled)."""


class G711Error(ValueError):
    """Input of the wrong dtype or shape for a G.711 function."""


# --- the reference rules (ITU-T G.191 g711.c), one sample / one code at a time -------------------------


def ulaw_compress_sample(sample: int) -> int:
    """µ-law code of one 16-bit sample, following G.191 ``ulaw_compress``.

    Only the 14 most significant bits are used. Negative samples take the one's complement (``~x``)
    before the shift, so -1..-4 map to the same code as 0..3 with the sign bit cleared.
    """
    magnitude = ((~sample if sample < 0 else sample) >> 2) + 33  # 33: bias between A-law and µ-law thresholds
    magnitude = min(magnitude, 0x1FFF)
    segment = magnitude.bit_length() - 5  # 1..8: position of the leading one above bit 5
    high_nibble = 8 - segment
    low_nibble = 0xF - ((magnitude >> segment) & 0xF)
    code = (high_nibble << 4) | low_nibble
    return code | 0x80 if sample >= 0 else code


def ulaw_expand_code(code: int) -> int:
    """16-bit sample of one µ-law code, following G.191 ``ulaw_expand`` (14 bits, left justified)."""
    sign = 1 if code & 0x80 else -1
    inverted = ~code & 0xFF
    exponent = (inverted >> 4) & 0x7
    mantissa = inverted & 0xF
    step = 4 << (exponent + 1)
    return sign * ((0x80 << exponent) + step * mantissa + step // 2 - 4 * 33)


def alaw_compress_sample(sample: int) -> int:
    """A-law code of one 16-bit sample, following G.191 ``alaw_compress`` (13 MSBs used)."""
    magnitude = (~sample if sample < 0 else sample) >> 4  # one's complement for negatives, as G.191
    if magnitude > 15:
        exponent = 1
        while magnitude > 16 + 15:
            magnitude >>= 1
            exponent += 1
        magnitude = magnitude - 16 + (exponent << 4)
    if sample >= 0:
        magnitude |= 0x80
    return magnitude ^ 0x55  # toggle the even bits


def alaw_expand_code(code: int) -> int:
    """16-bit sample of one A-law code, following G.191 ``alaw_expand`` (13 bits, left justified)."""
    toggled = (code ^ 0x55) & 0x7F
    exponent = toggled >> 4
    mantissa = toggled & 0xF
    if exponent > 0:
        mantissa += 16
    mantissa = (mantissa << 4) + 0x8
    if exponent > 1:
        mantissa <<= exponent - 1
    return mantissa if code > 127 else -mantissa


# --- tables, built once ---------------------------------------------------------------------------------


def _encode_table(compress: Callable[[int], int]) -> npt.NDArray[np.uint8]:
    # Index i is the uint16 view of the int16 sample: 0..32767 are themselves, 32768..65535 are -32768..-1.
    samples = np.arange(65536, dtype=np.int64)
    samples[samples >= 32768] -= 65536
    table = np.fromiter((compress(int(s)) for s in samples), dtype=np.uint8, count=65536)
    table.flags.writeable = False
    return table


def _decode_table(expand: Callable[[int], int]) -> npt.NDArray[np.int16]:
    table = np.fromiter((expand(code) for code in range(256)), dtype=np.int16, count=256)
    table.flags.writeable = False
    return table


ULAW_ENCODE_TABLE: Final = _encode_table(ulaw_compress_sample)
ULAW_DECODE_TABLE: Final = _decode_table(ulaw_expand_code)
ALAW_ENCODE_TABLE: Final = _encode_table(alaw_compress_sample)
ALAW_DECODE_TABLE: Final = _decode_table(alaw_expand_code)


# --- public API (np.take: about twice as fast as fancy indexing for these small tables) -------------------


def _as_uint16_view(pcm: npt.NDArray[np.int16], ndim: int) -> npt.NDArray[np.uint16]:
    if not isinstance(pcm, np.ndarray) or pcm.dtype != np.int16 or pcm.ndim != ndim:
        shape = getattr(pcm, "shape", None)
        raise G711Error(f"need a {ndim}-D int16 array, got {getattr(pcm, 'dtype', type(pcm))} {shape}")
    # Native-endian int16 reinterpreted as uint16: the table index is the sample's bit pattern.
    return pcm.view(np.uint16)


def _as_codes(data: bytes | bytearray | memoryview | npt.NDArray[np.uint8], ndim: int) -> npt.NDArray[np.uint8]:
    if isinstance(data, bytes | bytearray | memoryview):
        if ndim != 1:
            raise G711Error("batched decode needs a 2-D uint8 array, not bytes")
        return np.frombuffer(data, dtype=np.uint8)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != ndim:
        raise G711Error(f"need {ndim}-D uint8 codes, got {getattr(data, 'dtype', type(data))}")
    return data


def ulaw_encode(pcm: npt.NDArray[np.int16]) -> bytes:
    """µ-law codes of a 1-D int16 signal, one byte per sample."""
    return np.take(ULAW_ENCODE_TABLE, _as_uint16_view(pcm, 1)).tobytes()


def ulaw_decode(data: bytes | bytearray | memoryview | npt.NDArray[np.uint8]) -> npt.NDArray[np.int16]:
    """int16 samples of µ-law codes (bytes or a 1-D uint8 array)."""
    return np.take(ULAW_DECODE_TABLE, _as_codes(data, 1))


def alaw_encode(pcm: npt.NDArray[np.int16]) -> bytes:
    """A-law codes of a 1-D int16 signal, one byte per sample."""
    return np.take(ALAW_ENCODE_TABLE, _as_uint16_view(pcm, 1)).tobytes()


def alaw_decode(data: bytes | bytearray | memoryview | npt.NDArray[np.uint8]) -> npt.NDArray[np.int16]:
    """int16 samples of A-law codes (bytes or a 1-D uint8 array)."""
    return np.take(ALAW_DECODE_TABLE, _as_codes(data, 1))


def ulaw_encode_batch(pcm: npt.NDArray[np.int16]) -> npt.NDArray[np.uint8]:
    """µ-law codes of N calls at once: int16 (N, S) -> uint8 (N, S)."""
    return np.take(ULAW_ENCODE_TABLE, _as_uint16_view(pcm, 2))


def ulaw_decode_batch(codes: npt.NDArray[np.uint8]) -> npt.NDArray[np.int16]:
    """Samples of N calls' µ-law codes at once: uint8 (N, S) -> int16 (N, S)."""
    return np.take(ULAW_DECODE_TABLE, _as_codes(codes, 2))


def alaw_encode_batch(pcm: npt.NDArray[np.int16]) -> npt.NDArray[np.uint8]:
    """A-law codes of N calls at once: int16 (N, S) -> uint8 (N, S)."""
    return np.take(ALAW_ENCODE_TABLE, _as_uint16_view(pcm, 2))


def alaw_decode_batch(codes: npt.NDArray[np.uint8]) -> npt.NDArray[np.int16]:
    """Samples of N calls' A-law codes at once: uint8 (N, S) -> int16 (N, S)."""
    return np.take(ALAW_DECODE_TABLE, _as_codes(codes, 2))


# --- one law's codes to the other's, code by code (decode, then encode), as bytes.translate tables -------

_ALL_CODES = bytes(range(256))
_ALAW_TO_ULAW: Final = ulaw_encode(alaw_decode(_ALL_CODES))
_ULAW_TO_ALAW: Final = alaw_encode(ulaw_decode(_ALL_CODES))


def alaw_to_ulaw(codes: bytes) -> bytes:
    """µ-law codes of the samples that A-law ``codes`` stand for (no resampling: one table lookup a code)."""
    return codes.translate(_ALAW_TO_ULAW)


def ulaw_to_alaw(codes: bytes) -> bytes:
    """A-law codes of the samples that µ-law ``codes`` stand for (no resampling: one table lookup a code)."""
    return codes.translate(_ULAW_TO_ALAW)


# --- quiet frames: where a playout buffer can drop a frame unheard -----------------------------------------

#: A frame is quiet when no sample in it reaches this magnitude (-36 dBFS): a pause or line noise, not speech.
QUIET_PEAK: Final = 512

_ULAW_LOUD: Final = bytes(int(abs(int(v)) >= QUIET_PEAK) for v in ULAW_DECODE_TABLE)
_ALAW_LOUD: Final = bytes(int(abs(int(v)) >= QUIET_PEAK) for v in ALAW_DECODE_TABLE)


def ulaw_is_quiet(codes: bytes) -> bool:
    """True when no µ-law code in ``codes`` stands for a sample of ``QUIET_PEAK`` or more (one table pass)."""
    return 1 not in codes.translate(_ULAW_LOUD)


def alaw_is_quiet(codes: bytes) -> bool:
    """True when no A-law code in ``codes`` stands for a sample of ``QUIET_PEAK`` or more (one table pass)."""
    return 1 not in codes.translate(_ALAW_LOUD)


def pcm_is_quiet(pcm: npt.NDArray[np.int16]) -> bool:
    """The same test on linear samples (any rate): no sample's magnitude reaches ``QUIET_PEAK``."""
    return int(pcm.max()) < QUIET_PEAK and int(pcm.min()) > -QUIET_PEAK
