"""G.722 cases of ``gateway bench codecs``: what the media tick does, and the three implementations side by side.

* ``g722<->24k``: one tick for N calls as gateway/media/g722calls.py runs it: a 160-octet payload decoded per call
  (libg722) into one (N, 320) batch, 16k->24k as one batch | the agent's 24 kHz frames 24k->16k as one batch,
  each row encoded per call. Beside it the same with a StreamResampler per call.
* ``g722 codec``: one 20 ms frame encoded and one decoded per call, through libg722 (telcodecs.g722, the one in
  use), spandsp (ctypes) and FFmpeg (PyAV codec contexts): the measurement behind docs/adr/0021. spandsp is left
  out where it is not installed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from telcodecs.g722 import G722Decoder, G722Encoder
from telcodecs.g722_peers import (
    FfmpegDecoder,
    FfmpegEncoder,
    SpandspDecoder,
    SpandspEncoder,
    spandsp_available,
)
from telcodecs.resample import BatchResampler, StreamResampler

Tick = Callable[[], None]
Signal = Callable[[int, float], npt.NDArray[np.int16]]


def _speech_frames(signal: Signal, rate: int, count: int) -> npt.NDArray[np.int16]:
    size = rate // 50
    return signal(rate, count * 0.02)[: size * count].reshape(count, size)


def _payloads(signal: Signal) -> list[bytes]:
    frames = _speech_frames(signal, 16000, 25)
    encoder = G722Encoder()
    return [encoder.encode(np.ascontiguousarray(f)) for f in frames]


def batched(calls: int, signal: Signal) -> Tick:
    up, down = BatchResampler(16000, 24000, capacity=calls), BatchResampler(24000, 16000, capacity=calls)
    rows = np.array([up.open() for _ in range(calls)], dtype=np.intp)
    for _ in range(calls):
        down.open()
    decoders = [G722Decoder() for _ in range(calls)]
    encoders = [G722Encoder() for _ in range(calls)]
    payloads = _payloads(signal)
    outbound = np.tile(_speech_frames(signal, 24000, 1), (calls, 1))
    position = [0]

    def tick() -> None:
        payload = payloads[position[0] % len(payloads)]
        position[0] += 1
        pcm16 = np.empty((calls, 320), dtype=np.int16)
        for i, decoder in enumerate(decoders):
            pcm16[i] = decoder.decode(payload)
        up.process(rows, pcm16)  # -> sessions
        for encoder, row in zip(encoders, down.process(rows, outbound)):
            encoder.encode(row)  # -> RTP payloads

    return tick


def per_call(calls: int, signal: Signal) -> Tick:
    ups = [StreamResampler(16000, 24000) for _ in range(calls)]
    downs = [StreamResampler(24000, 16000) for _ in range(calls)]
    decoders = [G722Decoder() for _ in range(calls)]
    encoders = [G722Encoder() for _ in range(calls)]
    payloads = _payloads(signal)
    outbound = np.ascontiguousarray(_speech_frames(signal, 24000, 1)[0])
    position = [0]

    def tick() -> None:
        payload = payloads[position[0] % len(payloads)]
        position[0] += 1
        for decoder, encoder, up, down in zip(decoders, encoders, ups, downs):
            up.process(decoder.decode(payload))
            encoder.encode(down.process(outbound))

    return tick


def _implementation(name: str) -> tuple[Callable[[], Any], Callable[[], Any]]:
    if name == "libg722":
        return G722Encoder, G722Decoder
    if name == "spandsp":
        return SpandspEncoder, SpandspDecoder
    return FfmpegEncoder, FfmpegDecoder


def codec(calls: int, signal: Signal, *, implementation: str, direction: str) -> Tick:
    """One 20 ms frame per call per tick, encoded (``direction="encode"``) or decoded, by ``implementation``."""
    make_encoder, make_decoder = _implementation(implementation)
    frames = _speech_frames(signal, 16000, 25)
    payloads = _payloads(signal)
    coders = [make_encoder() if direction == "encode" else make_decoder() for _ in range(calls)]
    position = [0]

    def tick() -> None:
        k = position[0] % 25
        position[0] += 1
        if direction == "encode":
            frame = frames[k]
            for encoder in coders:
                encoder.encode(frame)
        else:
            payload = payloads[k]
            for decoder in coders:
                decoder.decode(payload)

    return tick


def implementations() -> tuple[str, ...]:
    return ("libg722", "spandsp", "ffmpeg") if spandsp_available() else ("libg722", "ffmpeg")
