"""Whole-signal encode and decode for the load generator: a call's send plan in, 20 ms payloads out, and back.

The generator never encodes in its send path: a call's payloads are encoded once when the call is planned
(and shared by calls that use the same plan), and received payloads are decoded after the load, so the
generator's own CPU use stays flat whatever the codec. G.711 uses the telcodecs lookup tables, Opus
telcodecs.opus (libopus).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gateway.loadtest.analysis import Pcm
from gateway.loadtest.config import Codec
from telcodecs.g711 import ALAW_SILENCE, ULAW_SILENCE, alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from telcodecs.opus import OpusDecoder, OpusEncoder, OpusError

PAYLOAD_TYPES: dict[str, int] = {"PCMU": 0, "PCMA": 8, "opus": 111}
OPUS_BITRATE = 32000


def samples_per_frame(codec: Codec) -> int:
    return 960 if codec == "opus" else 160


def silence_payload(codec: Codec) -> bytes:
    if codec == "PCMU":
        return bytes([ULAW_SILENCE]) * 160
    if codec == "PCMA":
        return bytes([ALAW_SILENCE]) * 160
    return encode(np.zeros(960 * 3, dtype=np.int16), "opus")[-1]


def encode(pcm: Pcm, codec: Codec) -> list[bytes]:
    """One payload per 20 ms frame of ``pcm`` (whose length is a whole number of frames)."""
    n = samples_per_frame(codec)
    if pcm.size % n:
        raise ValueError(f"{pcm.size} samples is not a whole number of {n}-sample frames")
    if codec == "opus":
        return _OpusCodec().encode(pcm)
    data = ulaw_encode(pcm) if codec == "PCMU" else alaw_encode(pcm)
    return [data[i : i + n] for i in range(0, len(data), n)]


def decode(payloads: Sequence[bytes | None], codec: Codec) -> Pcm:
    """Decode frames in order; ``None`` (a lost packet) becomes 20 ms of zeros (no concealment: we measure)."""
    n = samples_per_frame(codec)
    if codec == "opus":
        return _OpusCodec().decode(payloads)
    silent = b"\x00" * n
    blob = b"".join(p if p is not None and len(p) == n else silent for p in payloads)
    pcm = ulaw_decode(blob) if codec == "PCMU" else alaw_decode(blob)
    out = np.array(pcm, dtype=np.int16)
    for i, p in enumerate(payloads):
        if p is None or len(p) != n:
            out[i * n : (i + 1) * n] = 0
    return out


class _OpusCodec:
    """Opus at 48 kHz mono, 20 ms frames."""

    def encode(self, pcm: Pcm) -> list[bytes]:
        encoder = OpusEncoder(channels=1, bitrate=OPUS_BITRATE)
        return [encoder.encode(pcm[i : i + 960]) for i in range(0, pcm.size, 960)]

    def decode(self, payloads: Sequence[bytes | None]) -> Pcm:
        out = np.zeros(len(payloads) * 960, dtype=np.int16)
        decoder = OpusDecoder(channels_out=1)
        for i, payload in enumerate(payloads):
            if payload is not None:
                try:
                    out[i * 960 : (i + 1) * 960] = decoder.decode(payload)[:960]
                except OpusError:  # a corrupt payload is the peer's bug: counted as silence, measured as such
                    continue
        return out
