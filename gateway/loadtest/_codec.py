"""Whole-signal encode and decode for the load generator: a call's send plan in, 20 ms payloads out, and back.

The generator never encodes in its send path: a call's payloads are encoded once when the call is planned
(and shared by calls that use the same plan), and received payloads are decoded after the load, so the
generator's own CPU use stays flat whatever the codec. G.711 uses the telcodecs lookup tables; Opus uses
telcodecs.opus when present, else PyAV's libopus directly (same library underneath).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gateway.loadtest.analysis import Pcm
from gateway.loadtest.config import Codec
from telcodecs.g711 import ALAW_SILENCE, ULAW_SILENCE, alaw_decode, alaw_encode, ulaw_decode, ulaw_encode

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
        try:
            from telcodecs.opus import OpusEncoder
        except ImportError:
            return _av_encode(pcm)
        encoder = OpusEncoder(channels=1, bitrate=OPUS_BITRATE)
        return [encoder.encode(pcm[i : i + 960]) for i in range(0, pcm.size, 960)]

    def decode(self, payloads: Sequence[bytes | None]) -> Pcm:
        out = np.zeros(len(payloads) * 960, dtype=np.int16)
        try:
            from telcodecs.opus import OpusDecoder
        except ImportError:
            return _av_decode(payloads, out)
        decoder = OpusDecoder(channels_out=1)
        for i, payload in enumerate(payloads):
            if payload is not None:
                try:
                    out[i * 960 : (i + 1) * 960] = decoder.decode(payload)[:960]
                except Exception:  # a corrupt payload is the peer's bug: counted as silence, measured as such
                    continue
        return out


def _av_encode(pcm: Pcm) -> list[bytes]:
    import av

    encoder = av.CodecContext.create("libopus", "w")
    encoder.sample_rate = 48000
    encoder.layout = "mono"
    encoder.format = "s16"
    encoder.bit_rate = OPUS_BITRATE
    out: list[bytes] = []
    for k, i in enumerate(range(0, pcm.size, 960)):
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(pcm[i : i + 960]).reshape(1, -1), format="s16", layout="mono"
        )
        frame.sample_rate = 48000
        frame.pts = k * 960
        out.extend(bytes(packet) for packet in encoder.encode(frame))
    out.extend(bytes(packet) for packet in encoder.encode(None))
    frames = pcm.size // 960
    return (out + [out[-1]] * frames)[:frames] if out else []


def _av_decode(payloads: Sequence[bytes | None], out: Pcm) -> Pcm:
    import av

    decoder = av.CodecContext.create("libopus", "r")
    decoder.sample_rate = 48000
    decoder.layout = "mono"
    for i, payload in enumerate(payloads):
        if payload is None:
            continue
        try:
            frames = decoder.decode(av.Packet(payload))
        except Exception:  # a corrupt payload: silence, and the correlation says so
            continue
        pcm = np.concatenate([f.to_ndarray().reshape(-1) for f in frames]) if frames else np.zeros(0, np.int16)
        out[i * 960 : i * 960 + min(960, pcm.size)] = pcm[:960]
    return out
