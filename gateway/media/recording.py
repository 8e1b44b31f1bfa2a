"""Call recordings, sans-I/O: what one tick of a call adds to its recording, and the WAV header around it.

The worker's tick hands each recorded call's two frames of that tick to a writer off the tick
(gateway/worker/recorder.py): what the caller sent, as decoded into the session (24 kHz PCM), and what was sent
to the caller (a 24 kHz :class:`~telcodecs.frames.Frame`, a :class:`~gateway.media.tick.G711Frame` of codes, or
``None`` for silence). :class:`RecordingMixdown` turns them, for every recording of the tick at once, into each
recording's interleaved PCM16 at its own rate: mono (``caller`` or ``agent``) or stereo (``both``: caller left,
agent right). Both sides of a tick land on the same samples, so the recording runs on the call's media clock and
a barge-in overlap is heard as it happened. A tick the writer never got (its queue was full) is written as
silence of the same length, so what follows stays aligned. Rates other than 24 kHz go through the exact batched
resamplers of :mod:`telcodecs.resample` (a row per recorded side, bit-identical to a streaming resampler).

WAV (RIFF, PCM16): :func:`wav_header` with ``data_bytes=None`` writes the streaming header (sizes at their
maximum), which readers take as "until the end of the file": a recording cut short by a killed worker plays up
to its last flushed chunk. The writer rewrites the header with the real sizes when it closes the file.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final, Literal

import numpy as np
import numpy.typing as npt

from gateway.media.tick import G711Frame, OutboundFrame
from telcodecs.frames import FRAME_SAMPLES, SAMPLE_RATE, Frame
from telcodecs.g711 import alaw_decode, ulaw_decode
from telcodecs.resample import BatchResampler, StreamResampler

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
    "RecordingMixdown",
    "RecordingTrack",
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


class RecordingTrack:
    """One recording's place in a :class:`RecordingMixdown`: its mode, rate, resampler rows and tick count."""

    __slots__ = ("_g711_up", "_next_tick", "agent_row", "caller_row", "channels", "frame_bytes", "mode", "rate")

    def __init__(self, mode: RecordMode, rate: int, caller_row: int, agent_row: int) -> None:
        self.mode: RecordMode = mode
        self.rate = rate
        self.channels = channels_of(mode)
        self.frame_bytes = 2 * self.channels * (rate // 50)
        self.caller_row = caller_row  # -1: not recorded, or no resampling (24 kHz)
        self.agent_row = agent_row
        self._g711_up: StreamResampler | None = None  # made at the first G.711 frame the agent sends
        self._next_tick: int | None = None

    def gap(self, tick: int) -> int:
        """Ticks missed before ``tick`` (never handed to the writer); ``tick`` becomes the last one seen."""
        gap = 0 if self._next_tick is None else max(0, tick - self._next_tick)
        self._next_tick = tick + 1
        return gap

    def agent_pcm(self, agent: OutboundFrame) -> npt.NDArray[np.int16]:
        if agent is None:
            return _ZERO_24K
        if isinstance(agent, G711Frame):
            pcm8 = ulaw_decode(agent.g711) if agent.g711_law == "pcmu" else alaw_decode(agent.g711)
            if self._g711_up is None:
                self._g711_up = StreamResampler(8000, SAMPLE_RATE)
            return self._g711_up.process(pcm8)
        return agent.pcm


class RecordingMixdown:
    """Every recording of one writer: each tick's frames of all of them in, each one's PCM16 bytes out.

    The sides of all recordings at one rate are resampled as one batch (a
    :class:`~telcodecs.resample.BatchResampler` row per recorded side, bit-identical to a streaming resampler per
    side), so a tick of many recorded calls costs one resampling call per rate, not two per call.
    """

    def __init__(self) -> None:
        self._down: dict[int, BatchResampler] = {}

    def open(self, *, mode: RecordMode, sample_rate: int) -> RecordingTrack:
        if mode == "off":
            raise ValueError("a recording needs a mode other than off")
        if sample_rate not in RECORD_RATES:
            raise ValueError(f"sample rate must be one of {', '.join(map(str, RECORD_RATES))}, got {sample_rate}")
        caller_row = agent_row = -1
        if sample_rate != SAMPLE_RATE:
            down = self._down.get(sample_rate)
            if down is None:
                down = self._down[sample_rate] = BatchResampler(SAMPLE_RATE, sample_rate, capacity=16)
            caller_row = down.open() if mode != "agent" else -1
            agent_row = down.open() if mode != "caller" else -1
        return RecordingTrack(mode, sample_rate, caller_row, agent_row)

    def close(self, track: RecordingTrack) -> None:
        down = self._down.get(track.rate)
        for row in (track.caller_row, track.agent_row):
            if down is not None and row >= 0:
                down.close(row)
        track.caller_row = track.agent_row = -1

    def mix(self, tick: int, entries: Sequence[tuple[RecordingTrack, Frame | None, OutboundFrame]]) -> list[bytes]:
        """The bytes each recording gets for tick number ``tick``, in the order of ``entries`` (ticks a
        recording missed come first, as silence)."""
        # Each recording's sides at 24 kHz, as (track, side index in `pcm`) per recorded side.
        pcm: list[npt.NDArray[np.int16]] = []
        sides: list[tuple[int, int]] = []  # per entry: index of its caller side and of its agent side, -1 if none
        for track, caller, agent in entries:
            mode = track.mode
            left = right = -1
            if mode != "agent":
                left = len(pcm)
                pcm.append(caller.pcm if caller is not None else _ZERO_24K)
            if mode != "caller":
                right = len(pcm)
                pcm.append(track.agent_pcm(agent))
            sides.append((left, right))
        out: list[npt.NDArray[np.int16]] = list(pcm)
        for rate, down in self._down.items():
            picked = [
                (index, row)
                for (track, _, _), pair in zip(entries, sides, strict=True)
                if track.rate == rate
                for index, row in zip(pair, (track.caller_row, track.agent_row), strict=True)
                if index >= 0
            ]
            if picked:
                rows = np.fromiter((row for _, row in picked), dtype=np.intp, count=len(picked))
                resampled = down.process(rows, np.stack([pcm[index] for index, _ in picked]))
                for k, (index, _) in enumerate(picked):
                    out[index] = resampled[k]
        chunks: list[bytes] = []
        for (track, _, _), (left, right) in zip(entries, sides, strict=True):
            if left >= 0 and right >= 0:
                data = np.stack((out[left], out[right]), axis=1).astype("<i2", copy=False).tobytes()
            else:
                data = out[left if left >= 0 else right].astype("<i2", copy=False).tobytes()
            gap = track.gap(tick)
            chunks.append(bytes(gap * track.frame_bytes) + data if gap else data)
        return chunks
