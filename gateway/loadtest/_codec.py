"""Whole-signal encode and decode for the load generator: a call's send plan in, 20 ms payloads out, and back.

The generator never encodes in its send path: a call's payloads are encoded once when the call is planned
(and shared by calls that use the same plan), and received payloads are decoded after the load, so the
generator's own CPU use stays flat whatever the codec. G.711 uses the telcodecs lookup tables, G.722
telcodecs.g722 (libg722, 16 kHz PCM, 8000 RTP clock), Opus telcodecs.opus (libopus).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gateway.loadtest.analysis import Pcm
from gateway.loadtest.config import Codec
from telcodecs.g711 import ALAW_SILENCE, ULAW_SILENCE, alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from telcodecs.g722 import G722Decoder, G722Encoder
from telcodecs.opus import OpusDecoder, OpusEncoder, OpusError

PAYLOAD_TYPES: dict[str, int] = {"PCMU": 0, "PCMA": 8, "opus": 111, "G722": 9}
OPUS_BITRATE = 32000
_AUDIO_RATES: dict[str, int] = {"PCMU": 8000, "PCMA": 8000, "opus": 48000, "G722": 16000}
_CLOCK_RATES: dict[str, int] = {"PCMU": 8000, "PCMA": 8000, "opus": 48000, "G722": 8000}


def audio_rate(codec: Codec) -> int:
    """The codec's PCM sampling rate (G.722: 16 kHz)."""
    return _AUDIO_RATES[codec]


def clock_rate(codec: Codec) -> int:
    """The codec's RTP clock (G.722: 8000, RFC 3551 §4.5.2)."""
    return _CLOCK_RATES[codec]


def samples_per_frame(codec: Codec) -> int:
    """PCM samples in 20 ms at the codec's sampling rate."""
    return audio_rate(codec) // 50


def timestamp_step(codec: Codec) -> int:
    """RTP timestamp units per 20 ms."""
    return clock_rate(codec) // 50


def silence_payload(codec: Codec) -> bytes:
    if codec == "PCMU":
        return bytes([ULAW_SILENCE]) * 160
    if codec == "PCMA":
        return bytes([ALAW_SILENCE]) * 160
    if codec == "G722":  # an encoder's codes for silence, from its idle state (what a phone's pause sends)
        return encode(np.zeros(320 * 3, dtype=np.int16), "G722")[-1]
    return encode(np.zeros(960 * 3, dtype=np.int16), "opus")[-1]


def encode(pcm: Pcm, codec: Codec) -> list[bytes]:
    """One payload per 20 ms frame of ``pcm`` (whose length is a whole number of frames)."""
    n = samples_per_frame(codec)
    if pcm.size % n:
        raise ValueError(f"{pcm.size} samples is not a whole number of {n}-sample frames")
    if codec == "opus":
        return _OpusCodec().encode(pcm)
    if codec == "G722":
        codes = G722Encoder().encode(np.ascontiguousarray(pcm, dtype=np.int16))
        return [codes[i : i + 160] for i in range(0, len(codes), 160)]
    data = ulaw_encode(pcm) if codec == "PCMU" else alaw_encode(pcm)
    return [data[i : i + n] for i in range(0, len(data), n)]


def decode(payloads: Sequence[bytes | None], codec: Codec) -> Pcm:
    """Decode frames in order; ``None`` (a lost packet) becomes 20 ms of zeros (no concealment: we measure)."""
    n = samples_per_frame(codec)
    if codec == "opus":
        return _OpusCodec().decode(payloads)
    if codec == "G722":
        return _g722_decode(payloads)
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


def _g722_decode(payloads: Sequence[bytes | None]) -> Pcm:
    """One decoder through the call (its state carries on over a loss, as a phone's would); a lost or wrong-sized
    payload is 20 ms of zeros."""
    out = np.zeros(len(payloads) * 320, dtype=np.int16)
    decoder = G722Decoder()
    for i, payload in enumerate(payloads):
        if payload is not None and len(payload) == 160:
            out[i * 320 : (i + 1) * 320] = decoder.decode(payload)
    return out
