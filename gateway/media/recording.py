"""Call recordings, sans-I/O: what one tick of a call adds to its recording, and the WAV header around it.

The worker's tick hands each recorded call's two frames of that tick to a writer off the tick
(gateway/worker/recorder.py): what the caller sent, as decoded into the session (24 kHz PCM), and what was sent
to the caller (a 24 kHz :class:`~telcodecs.frames.Frame`, a :class:`~gateway.media.tick.G711Frame` of codes, or
``None`` for silence). :class:`RecordingMixer` turns them into the recording's interleaved PCM16 at its own rate:
mono (``caller`` or ``agent``) or stereo (``both``: caller left, agent right). Both sides of a tick land on the
same samples, so the recording runs on the call's media clock and a barge-in overlap is heard as it happened.
A tick the writer never got (its queue was full) is written as silence of the same length, so what follows
stays aligned. Rates other than 24 kHz go through the exact streaming resamplers of :mod:`telcodecs.resample`.

WAV (RIFF, PCM16): :func:`wav_header` with ``data_bytes=None`` writes the streaming header (sizes at their
maximum), which readers take as "until the end of the file": a recording cut short by a killed worker plays up
to its last flushed chunk. The writer rewrites the header with the real sizes when it closes the file.
"""

from __future__ import annotations

import struct
from typing import Final, Literal

import numpy as np
import numpy.typing as npt

from gateway.media.tick import G711Frame, OutboundFrame
from telcodecs.frames import FRAME_SAMPLES, SAMPLE_RATE, Frame
from telcodecs.g711 import alaw_decode, ulaw_decode
from telcodecs.resample import StreamResampler

RecordMode = Literal["off", "caller", "agent", "both"]
RecordFormat = Literal["wav", "ogg"]
RECORD_RATES: Final = (8000, 16000, 24000, 48000)
WAV_HEADER_BYTES: Final = 44
_STREAMING_SIZE: Final = 0xFFFFFFFF
_ZERO_24K = np.zeros(FRAME_SAMPLES, dtype=np.int16)

__all__ = [
    "RECORD_RATES",
    "WAV_HEADER_BYTES",
    "RecordFormat",
    "RecordMode",
    "RecordingMixer",
    "channels_of",
    "wav_header",
]


def channels_of(mode: RecordMode) -> int:
    return 2 if mode == "both" else 1


def wav_header(*, sample_rate: int, channels: int, data_bytes: int | None) -> bytes:
    """A 44-byte canonical PCM16 WAV header; ``data_bytes=None``: the streaming form (sizes unknown yet)."""
    block_align = 2 * channels
    if data_bytes is None:
        riff_size = data_size = _STREAMING_SIZE
    else:
        data_size = min(data_bytes, _STREAMING_SIZE - 36)
        riff_size = 36 + data_size
    return (
        b"RIFF"
        + struct.pack("<I", riff_size)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block_align, block_align, 16)
        + b"data"
        + struct.pack("<I", data_size)
    )


class RecordingMixer:
    """One call's recording, one tick at a time: its two frames in, interleaved PCM16 at ``sample_rate`` out."""

    __slots__ = ("_agent_down", "_caller_down", "_g711_up", "_next_tick", "channels", "frame_samples", "mode", "rate")

    def __init__(self, *, mode: RecordMode, sample_rate: int) -> None:
        if mode == "off":
            raise ValueError("a recording needs a mode other than off")
        if sample_rate not in RECORD_RATES:
            raise ValueError(f"sample rate must be one of {', '.join(map(str, RECORD_RATES))}, got {sample_rate}")
        self.mode: RecordMode = mode
        self.rate = sample_rate
        self.channels = channels_of(mode)
        self.frame_samples = sample_rate // 50
        down = sample_rate != SAMPLE_RATE
        self._caller_down = StreamResampler(SAMPLE_RATE, sample_rate) if down and mode != "agent" else None
        self._agent_down = StreamResampler(SAMPLE_RATE, sample_rate) if down and mode != "caller" else None
        self._g711_up: StreamResampler | None = None  # made at the first G.711 frame the agent sends
        self._next_tick: int | None = None

    @property
    def frame_bytes(self) -> int:
        return 2 * self.channels * self.frame_samples

    def tick(self, tick: int, caller: Frame | None, agent: OutboundFrame) -> bytes:
        """The samples of tick number ``tick`` (ticks count up; missed ones come out as silence before it)."""
        gap = 0 if self._next_tick is None else max(0, tick - self._next_tick)
        self._next_tick = tick + 1
        parts: list[npt.NDArray[np.int16]] = []
        if self.mode != "agent":
            parts.append(self._down(self._caller_down, caller.pcm if caller is not None else _ZERO_24K))
        if self.mode != "caller":
            parts.append(self._down(self._agent_down, self._agent_pcm(agent)))
        pcm = parts[0] if len(parts) == 1 else np.stack(parts, axis=1).reshape(-1)
        data = pcm.astype("<i2", copy=False).tobytes()
        if gap:
            return bytes(gap * self.frame_bytes) + data
        return data

    def silence(self, ticks: int) -> bytes:
        return bytes(max(0, ticks) * self.frame_bytes)

    def _agent_pcm(self, agent: OutboundFrame) -> npt.NDArray[np.int16]:
        if agent is None:
            return _ZERO_24K
        if isinstance(agent, G711Frame):
            pcm8 = ulaw_decode(agent.g711) if agent.g711_law == "pcmu" else alaw_decode(agent.g711)
            if self._g711_up is None:
                self._g711_up = StreamResampler(8000, SAMPLE_RATE)
            return self._g711_up.process(pcm8)
        return agent.pcm

    @staticmethod
    def _down(resampler: StreamResampler | None, pcm: npt.NDArray[np.int16]) -> npt.NDArray[np.int16]:
        return pcm if resampler is None else resampler.process(pcm)
