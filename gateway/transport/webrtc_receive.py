"""A browser caller's audio on its way in: RTP from aiortc's receiver -> Opus decoded -> 24 kHz 20 ms frames.

aiortc's ``RTCRtpReceiver`` puts each audio packet (after SRTP, RTCP statistics and depayloading) into its
``JitterBuffer``, which hands out a frame only once four more are buffered (80 ms), and only in unbroken
order: after one lost packet it waits until 16 packets are queued behind the hole, then goes on from there
with them all still queued, so the caller's audio reaches the agent late for the rest of the call. Each frame
then goes through a ``queue.Queue`` to a decoder thread per receiver, which decodes with PyAV and posts every
decoded frame back to the loop (``run_coroutine_threadsafe``) for a task of ours to read; in a profile the thread
hand-offs outweighed the decoding (docs/adr/0011-browser-audio-decoded-on-the-loop.md).

:class:`OpusReceiveSink` takes the place of both, installed before the connection starts (:func:`install`):

- order: a packet in sequence is decoded as it arrives; one after a hole waits for the missing packet for at
  most :data:`REORDER_PACKETS` packets, then the hole is taken as lost. A packet from behind what was decoded
  is late and dropped. Sequence numbers and timestamps are unwrapped; a jump far back is a new stream.
- decoding: on the loop, with :class:`telcodecs.opus.OpusDecoder` (mono, to 24 kHz, as the SIP path decodes). A gap in
  the timestamps of up to :data:`MAX_CONCEAL_FRAMES` frames is filled by the decoder's concealment, its last
  frame rebuilt from the in-band FEC copy the packet after it carries (``decode_fec``), so the frames the
  session gets stay on the caller's timeline; a longer gap is the sender pausing (DTX, mute).

There is no playout delay: the frames go to the session (and the provider) as they come, which is what the
provider wants; the agent's audio towards the caller is paced by the agent track.

:class:`InboundAudio` turns 48 kHz mono PCM (from the sink, or from aiortc's decoded ``av.AudioFrame`` when
``decoder="aiortc"``) into 24 kHz :class:`~telcodecs.frames.Frame` s of 20 ms.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable
from typing import Any

import av
import numpy as np
import numpy.typing as npt
from aiortc.jitterbuffer import JitterBuffer

from telcodecs.frames import FRAME_SAMPLES, SAMPLE_RATE, Frame
from telcodecs.opus import OpusDecoder, OpusError
from telcodecs.resample import StreamResampler

log = logging.getLogger(__name__)

OPUS_RATE = 48_000
WIRE_SAMPLES = OPUS_RATE // 50  # 960: 20 ms at 48 kHz
_CLOCK_PER_SAMPLE = OPUS_RATE // SAMPLE_RATE  # RTP clock ticks per decoded 24 kHz sample
MAX_CONCEAL_FRAMES = 5  # a longer gap in the timestamps is the sender pausing, not loss
REORDER_PACKETS = 2  # packets that wait behind a hole before it is taken as lost (40 ms at 20 ms a packet)
_RESTART_PACKETS = 100  # a sequence number further back than this: the sender started a new stream
_RESTART_FRAMES = 50  # a timestamp further back than 1 s: likewise

# aiortc's receiver keeps the decoder's queue and thread in private (name-mangled) attributes.
_QUEUE_ATTR = "_RTCRtpReceiver__decoder_queue"
_JITTER_ATTR = "_RTCRtpReceiver__jitter_buffer"
_THREAD_ATTR = "_RTCRtpReceiver__decoder_thread"


def downmix_s16(frame: av.AudioFrame) -> npt.NDArray[np.int16]:
    """An s16 or s16p frame (packed or planar, any channel count) as mono int16: the channels' mean."""
    data = frame.to_ndarray()
    channels = len(frame.layout.channels)
    if channels == 1:
        return data.reshape(-1).astype(np.int16, copy=False)
    per_channel = data.reshape(channels, -1) if frame.format.is_planar else data.reshape(-1, channels).T
    mono: npt.NDArray[np.int16] = (per_channel.astype(np.int32).sum(axis=0) // channels).astype(np.int16)
    return mono


class InboundAudio:
    """Caller audio -> 24 kHz 20 ms frames: 24 kHz mono PCM as the gateway's decoder makes it (no resampling), or
    48 kHz (mono PCM, or aiortc's decoded s16/s16p frames) through a resampler."""

    def __init__(self) -> None:
        self._resampler: StreamResampler | None = None  # made for the first 48 kHz audio
        self._pending = np.zeros(0, dtype=np.int16)
        self._index = 0
        self._fallback: av.AudioResampler | None = None

    def _mono48k(self, frame: av.AudioFrame) -> npt.NDArray[np.int16]:
        if frame.sample_rate != OPUS_RATE or frame.format.name not in ("s16", "s16p"):
            # Not what aiortc's Opus decoder produces; let libswresample convert it.
            if self._fallback is None:
                self._fallback = av.AudioResampler(format="s16", layout="mono", rate=OPUS_RATE)
            parts = [f.to_ndarray().reshape(-1) for f in self._fallback.resample(frame)]
            return np.concatenate(parts).astype(np.int16) if parts else np.zeros(0, dtype=np.int16)
        return downmix_s16(frame)

    def feed(self, frame: av.AudioFrame) -> list[Frame]:
        """The whole 24 kHz frames this piece of decoded audio completes."""
        return self.feed_pcm48(self._mono48k(frame))

    def feed_pcm48(self, pcm: npt.NDArray[np.int16]) -> list[Frame]:
        """The whole 24 kHz frames these 48 kHz mono samples complete (usually exactly one per 20 ms packet)."""
        resampler = self._resampler
        if resampler is None:
            resampler = self._resampler = StreamResampler(OPUS_RATE, SAMPLE_RATE)
        return self._reframe(pcm, WIRE_SAMPLES, resampler.process)

    def feed_pcm24(self, pcm: npt.NDArray[np.int16]) -> list[Frame]:
        """The whole 24 kHz frames these 24 kHz mono samples complete (usually exactly one per 20 ms packet)."""
        return self._reframe(pcm, FRAME_SAMPLES, None)

    def _reframe(
        self,
        pcm: npt.NDArray[np.int16],
        size: int,
        convert: Callable[[npt.NDArray[np.int16]], npt.NDArray[np.int16]] | None,
    ) -> list[Frame]:
        # A call feeds one rate only, so one carry-over buffer serves both.
        if not self._pending.size and pcm.size == size:  # the usual case: one packet, one frame
            frame = Frame(index=self._index, pcm=pcm if convert is None else convert(pcm))
            self._index += 1
            return [frame]
        pending = np.concatenate((self._pending, pcm)) if self._pending.size else pcm
        out = []
        start = 0
        while pending.size - start >= size:
            piece = np.ascontiguousarray(pending[start : start + size])
            start += size
            out.append(Frame(index=self._index, pcm=piece if convert is None else convert(piece)))
            self._index += 1
        self._pending = pending[start:].copy()
        return out


class OpusReceiveSink:
    """Takes the place of an aiortc receiver's audio jitter buffer and decoder queue: each RTP packet is put in
    order as it arrives and decoded on the loop, and its 24 kHz mono PCM (libopus decodes to the session's rate)
    goes to ``on_pcm`` at once.

    aiortc's receiver calls ``add(packet)`` (its ``JitterBuffer`` surface) for every packet after SRTP, RTCP
    statistics and depayloading; the sink answers ``(False, None)``, so aiortc queues nothing for its decoder
    thread, which reads ``None`` from ``get()`` and ends; ``put(None)`` is aiortc stopping it.
    """

    def __init__(self, on_pcm: Callable[[npt.NDArray[np.int16]], None]) -> None:
        self._on_pcm = on_pcm
        self._decoder = OpusDecoder(channels_out=1, sample_rate=SAMPLE_RATE)
        self._next_ts: int | None = None  # the timestamp the next frame should have (unwrapped)
        self._expected: int | None = None  # the next sequence number to decode (unwrapped)
        self._held: dict[int, tuple[int, bytes]] = {}  # packets after a hole: seq -> (timestamp, payload)
        self._ts_raw = 0  # the last RTP timestamp seen, and its unwrapped value
        self._ts_ext = 0
        self.closed = False
        self.frames = 0  # packets decoded
        self.concealed = 0  # 20 ms frames filled in for a short gap or a packet libopus rejected
        self.bridged = 0  # of those, the last frame of a gap, rebuilt from the FEC copy in the packet after it
        self.bad_packets = 0  # packets libopus rejected
        self.late = 0  # packets behind what was already decoded (dropped)
        self.errors = 0  # packets whose handling raised (dropped, logged once)

    # --- the surfaces aiortc's receiver uses: its jitter buffer's add(), its decoder queue's get() and put()

    def add(self, packet: Any) -> tuple[bool, None]:
        if not self.closed:
            payload = getattr(packet, "_data", None)
            try:
                self.arrived(
                    int(packet.sequence_number),
                    int(packet.timestamp),
                    bytes(packet.payload if payload is None else payload),
                )
            except Exception:  # in aiortc's packet handler: a bug here must not end the call's transport
                self._failed()
        return False, None  # nothing for aiortc's decoder (and no picture-loss indication)

    def get(self, block: bool = True, timeout: float | None = None) -> None:
        return None

    def put(self, item: object, block: bool = True, timeout: float | None = None) -> None:
        # aiortc stopping its decoder (None). add() never leaves it a frame to queue, so nothing else comes.
        if item is None:
            self.closed = True

    def _failed(self) -> None:
        self.errors += 1
        if self.errors == 1:
            log.exception("handling a browser caller's Opus packet failed")

    # --- order

    def arrived(self, sequence: int, timestamp: int, payload: bytes) -> None:
        """One RTP packet as it arrived (16-bit sequence number, 32-bit timestamp). In order, it is decoded at
        once; after a hole it waits for the missing packet for at most :data:`REORDER_PACKETS` packets."""
        ts = self._unwrap_ts(timestamp)
        expected = self._expected
        if expected is None:
            self._expected = expected = sequence
        seq = expected + ((sequence - expected + 0x8000) & 0xFFFF) - 0x8000
        if seq < expected:
            if expected - seq > _RESTART_PACKETS:  # the sender started over (a new stream): follow it
                self._restart(seq)
            else:
                self.late += 1
                return
            expected = seq
        if seq > expected:
            self._held[seq] = (ts, payload)
            if len(self._held) <= REORDER_PACKETS:
                return
            self._expected = expected = min(self._held)  # the hole is lost: concealment fills it
            seq, (ts, payload) = expected, self._held.pop(expected)
        self._expected = seq + 1
        self.receive(payload, ts)
        while self._held and (waiting := self._held.pop(self._expected, None)) is not None:
            self._expected += 1
            self.receive(waiting[1], waiting[0])

    def _unwrap_ts(self, timestamp: int) -> int:
        step = ((timestamp - self._ts_raw + 0x8000_0000) & 0xFFFF_FFFF) - 0x8000_0000
        self._ts_raw = timestamp
        self._ts_ext += step
        return self._ts_ext

    def _restart(self, sequence: int) -> None:
        self._held.clear()
        self._expected = sequence
        self._next_ts = None

    # --- decoding

    def receive(self, payload: bytes, timestamp: int) -> None:
        """One encoded frame, in order, with its unwrapped 48 kHz RTP timestamp."""
        expected = self._next_ts
        if expected is not None:
            missing = timestamp - expected  # far back: the timestamps started over, nothing to fill
            if -_RESTART_FRAMES * WIRE_SAMPLES <= missing < 0:
                self.late += 1
                return
            if 0 < missing <= MAX_CONCEAL_FRAMES * WIRE_SAMPLES:
                lost = missing // WIRE_SAMPLES
                for _ in range(lost - 1):
                    self._conceal()
                if lost:
                    self._bridge(payload)
        try:
            pcm = self._decoder.decode(payload)
        except OpusError as exc:
            self.bad_packets += 1
            if self.bad_packets == 1:
                log.warning("a browser caller's Opus packet was rejected: %s", exc)
            self._next_ts = timestamp + WIRE_SAMPLES
            self._conceal()
            return
        self.frames += 1
        self._next_ts = timestamp + pcm.size * _CLOCK_PER_SAMPLE
        self._on_pcm(pcm)

    def _conceal(self) -> None:
        self.concealed += 1
        self._on_pcm(self._decoder.conceal())

    def _bridge(self, following: bytes) -> None:
        """The frame just before ``following``, from the FEC copy of it that ``following`` carries (libopus
        conceals when it carries none), as the SIP path does when the next packet is at hand; ``following`` is
        decoded after it as usual."""
        try:
            pcm = self._decoder.decode_fec(following)
        except OpusError:  # following is bad too: decode() counts it
            self._conceal()
            return
        self.concealed += 1
        self.bridged += 1
        self._on_pcm(pcm)


def install(receiver: Any, sink: OpusReceiveSink) -> bool:
    """Put ``sink`` in place of ``receiver``'s (an aiortc ``RTCRtpReceiver`` not started yet) audio jitter
    buffer and decoder queue. False, with nothing changed, when this aiortc keeps them otherwise or has
    started its decoder."""
    if not isinstance(getattr(receiver, _QUEUE_ATTR, None), queue.Queue):
        return False
    if not isinstance(getattr(receiver, _JITTER_ATTR, None), JitterBuffer):
        return False
    if getattr(receiver, _THREAD_ATTR, "missing") is not None:
        return False
    setattr(receiver, _JITTER_ATTR, sink)
    setattr(receiver, _QUEUE_ATTR, sink)
    return True
