"""A browser caller's audio on its way in: Opus from aiortc's receiver -> 24 kHz 20 ms frames.

aiortc's ``RTCRtpReceiver`` reassembles encoded frames in its jitter buffer and hands each one, through a
``queue.Queue``, to a decoder thread of its own per receiver; the thread decodes with PyAV and posts every
decoded frame back to the event loop (``run_coroutine_threadsafe``) into the remote track's queue, which a task
of ours awaited. Per 20 ms packet that is two thread hand-offs and a loop wake-up, and the decoder thread takes
the GIL from the loop that paces every call: in a profile of 8 browser calls the hand-offs were about a third of
the worker's samples, more than libopus' encoding (docs/performance.md, "Browser calls";
docs/adr/0011-browser-audio-decoded-on-the-loop.md).

:class:`OpusReceiveSink` stands in for that queue. Installed before the connection starts (:func:`install`),
it receives each encoded frame in the receiver's own packet handler, on the loop, and decodes it there with
:class:`telcodecs.opus.OpusDecoder` (mono, as the SIP path decodes): no thread, no hand-off. A gap in the
frames' timestamps of up to :data:`MAX_CONCEAL_FRAMES` is filled by the decoder's concealment, so the frames
the session gets stay on the caller's timeline; a longer gap is the sender pausing (DTX, a muted microphone).
The thread aiortc still starts reads ``None`` from the sink and ends at once.

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

from telcodecs.frames import Frame
from telcodecs.opus import OpusDecoder, OpusError
from telcodecs.resample import StreamResampler

log = logging.getLogger(__name__)

OPUS_RATE = 48_000
WIRE_SAMPLES = OPUS_RATE // 50  # 960: 20 ms at 48 kHz
MAX_CONCEAL_FRAMES = 5  # a longer gap in the timestamps is the sender pausing, not loss

# aiortc's receiver keeps the decoder's queue and thread in private (name-mangled) attributes.
_QUEUE_ATTR = "_RTCRtpReceiver__decoder_queue"
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
    """48 kHz caller audio (mono PCM, or aiortc's decoded s16/s16p frames) -> 24 kHz 20 ms frames."""

    def __init__(self) -> None:
        self._resampler = StreamResampler(OPUS_RATE, 24_000)
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
        if not self._pending.size and pcm.size == WIRE_SAMPLES:  # the usual case: one packet, one frame
            frame = Frame(index=self._index, pcm=self._resampler.process(pcm))
            self._index += 1
            return [frame]
        pending = np.concatenate((self._pending, pcm)) if self._pending.size else pcm
        out = []
        start = 0
        while pending.size - start >= WIRE_SAMPLES:
            piece = np.ascontiguousarray(pending[start : start + WIRE_SAMPLES])
            start += WIRE_SAMPLES
            out.append(Frame(index=self._index, pcm=self._resampler.process(piece)))
            self._index += 1
        self._pending = pending[start:].copy()
        return out


class OpusReceiveSink:
    """Takes the place of an aiortc receiver's decoder queue: each encoded Opus frame is decoded when the
    receiver hands it over, on the loop, and its 48 kHz mono PCM goes to ``on_pcm``.

    Speaks the two calls aiortc makes on the queue: ``put((codec, frame))`` from the packet handler (``None``
    to stop) and ``get()`` from its decoder thread, which gets ``None`` and ends.
    """

    def __init__(self, on_pcm: Callable[[npt.NDArray[np.int16]], None]) -> None:
        self._on_pcm = on_pcm
        self._decoder = OpusDecoder(channels_out=1)
        self._next_ts: int | None = None
        self.closed = False
        self.frames = 0  # encoded frames decoded
        self.concealed = 0  # 20 ms frames filled in for a short gap or a packet libopus rejected
        self.bad_packets = 0  # packets libopus rejected
        self.late = 0  # frames at or before a timestamp already played (dropped)
        self.other_codec = 0  # frames of a codec other than Opus (dropped)
        self.errors = 0  # frames whose handling raised (dropped, logged once)

    # --- the queue.Queue surface aiortc uses

    def get(self, block: bool = True, timeout: float | None = None) -> None:
        return None

    def put(self, item: tuple[Any, Any] | None, block: bool = True, timeout: float | None = None) -> None:
        if item is None:
            self.closed = True
            return
        if self.closed:
            return
        codec, encoded = item
        if str(getattr(codec, "name", "")).lower() != "opus":
            self.other_codec += 1  # the answer offers Opus alone; anything else is not the caller's voice
            return
        try:
            self.receive(bytes(encoded.data), int(encoded.timestamp))
        except Exception:  # in aiortc's packet handler: a bug here must not end the call's transport
            self.errors += 1
            if self.errors == 1:
                log.exception("handling a browser caller's Opus frame failed")

    # --- the work

    def receive(self, payload: bytes, timestamp: int) -> None:
        """One encoded frame with its (unwrapped, 48 kHz) RTP timestamp."""
        expected = self._next_ts
        if expected is not None:
            missing = timestamp - expected
            if missing < 0:
                self.late += 1
                return
            if 0 < missing <= MAX_CONCEAL_FRAMES * WIRE_SAMPLES:
                for _ in range(missing // WIRE_SAMPLES):
                    self._conceal()
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
        self._next_ts = timestamp + pcm.size
        self._on_pcm(pcm)

    def _conceal(self) -> None:
        self.concealed += 1
        self._on_pcm(self._decoder.conceal())


def install(receiver: Any, sink: OpusReceiveSink) -> bool:
    """Put ``sink`` where ``receiver`` (an aiortc ``RTCRtpReceiver`` not started yet) queues encoded frames for
    its decoder thread. False, with nothing changed, when this aiortc keeps them otherwise or has started."""
    if not isinstance(getattr(receiver, _QUEUE_ATTR, None), queue.Queue):
        return False
    if getattr(receiver, _THREAD_ATTR, "missing") is not None:
        return False
    setattr(receiver, _QUEUE_ATTR, sink)
    return True
