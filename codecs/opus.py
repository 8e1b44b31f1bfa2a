"""Opus (RFC 6716) for 48 kHz, 20 ms frames, through PyAV's libopus encoder and decoder.

This module owns one encoder and one decoder object per call direction. PCM is int16; stereo is
interleaved. RTP payloading (RFC 7587: one Opus packet per RTP payload, 48 kHz clock) is the media
layer's job; these objects take and return whole Opus packets.

Packet loss: FFmpeg's libopus wrapper, and so PyAV, treats an empty packet as end of stream and offers no
``decode_fec``, so neither libopus PLC nor in-band FEC recovery is reachable through it. The decoder
therefore conceals with :class:`telcodecs.plc.Concealer`: :meth:`OpusDecoder.conceal` repeats the last
pitch period with a fade (G.711 Appendix I), and :meth:`OpusDecoder.decode_fec` uses the *next* packet to
interpolate the lost one and keeps that packet's decoded audio for the following :meth:`decode` call.
Why, and what was rejected: docs/adr/0004-opus-packet-loss.md.

Silence: libopus costs about as much to encode a frame of digital silence as a frame of speech (233 against
340 µs at complexity 5 on the development VM, ``gateway bench codecs``), and an agent is silent for much of a
call. Once the encoder has been fed :data:`SILENCE_SETTLE_FRAMES` all-zero frames in a row, its state is silence
and so is the packet it makes (with its in-band FEC copy of the frame before); further all-zero frames get that
same packet back without calling libopus. The first frame that is not all zeros is encoded from the state the
silence left, as it would have been. ``reuse_silence=False`` encodes every frame.
"""

from __future__ import annotations

from typing import Final

import av
import av.error
import numpy as np
import numpy.typing as npt

from telcodecs.plc import Concealer

__all__ = ["OPUS_FRAME_SAMPLES", "OPUS_SAMPLE_RATE", "SILENCE_SETTLE_FRAMES", "OpusDecoder", "OpusEncoder", "OpusError"]

OPUS_SAMPLE_RATE: Final = 48_000
OPUS_FRAME_SAMPLES: Final = 960  # 20 ms per channel
SILENCE_SETTLE_FRAMES: Final = 3  # all-zero frames encoded before their packet is reused


class OpusError(ValueError):
    """Bad settings, PCM of the wrong shape, or a packet libopus rejects (translated from PyAV errors)."""


def _layout(channels: int) -> str:
    if channels == 1:
        return "mono"
    if channels == 2:
        return "stereo"
    raise OpusError(f"channels must be 1 or 2, got {channels}")


class OpusEncoder:
    """20 ms Opus packets from 48 kHz int16 PCM (``960 * channels`` interleaved samples per call)."""

    __slots__ = ("_channels", "_context", "_layout", "_pts", "_quiet", "_quiet_packet", "_reuse", "reused")

    def __init__(
        self,
        *,
        channels: int = 1,
        bitrate: int = 32000,
        complexity: int = 5,
        fec: bool = True,
        packet_loss_pct: int = 10,
        reuse_silence: bool = True,
    ) -> None:
        self._layout = _layout(channels)
        if not 6000 <= bitrate <= 510000:
            raise OpusError(f"bitrate must be 6000..510000 bit/s, got {bitrate}")
        if not 0 <= complexity <= 10:
            raise OpusError(f"complexity must be 0..10, got {complexity}")
        if not 0 <= packet_loss_pct <= 100:
            raise OpusError(f"packet_loss_pct must be 0..100, got {packet_loss_pct}")
        self._channels = channels
        context = av.CodecContext.create("libopus", "w")
        context.sample_rate = OPUS_SAMPLE_RATE
        context.layout = self._layout
        context.format = "s16"
        context.bit_rate = bitrate
        # libopus only adds in-band FEC (LBRR) when told to expect loss.
        context.options = {
            "application": "voip",
            "frame_duration": "20",
            "fec": "1" if fec else "0",
            "packet_loss": str(packet_loss_pct if fec else 0),
            "compression_level": str(complexity),  # libopusenc maps this to OPUS_SET_COMPLEXITY
        }
        try:
            context.open()
        except av.error.FFmpegError as exc:
            raise OpusError(f"libopus encoder refused the settings: {exc}") from exc
        self._context = context
        self._pts = 0
        self._reuse = reuse_silence
        self._quiet = 0  # all-zero frames in a row
        self._quiet_packet: bytes | None = None
        self.reused = 0  # frames answered with the settled silence packet, libopus not called

    @property
    def channels(self) -> int:
        return self._channels

    def encode(self, pcm: npt.NDArray[np.int16]) -> bytes:
        """One 20 ms packet from ``960 * channels`` interleaved int16 samples at 48 kHz."""
        want = OPUS_FRAME_SAMPLES * self._channels
        if not isinstance(pcm, np.ndarray) or pcm.dtype != np.int16 or pcm.shape != (want,):
            raise OpusError(f"encode needs int16[{want}], got {getattr(pcm, 'dtype', type(pcm))}")
        if self._reuse:
            if pcm.any():
                self._quiet = 0
            else:
                self._quiet += 1
                if self._quiet > SILENCE_SETTLE_FRAMES and self._quiet_packet is not None:
                    self._pts += OPUS_FRAME_SAMPLES
                    self.reused += 1
                    return self._quiet_packet
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, want), format="s16", layout=self._layout)
        frame.sample_rate = OPUS_SAMPLE_RATE
        frame.pts = self._pts
        self._pts += OPUS_FRAME_SAMPLES
        try:
            packets = self._context.encode(frame)
        except av.error.FFmpegError as exc:
            raise OpusError(f"libopus failed to encode: {exc}") from exc
        # With 20 ms input frames and frame_duration=20, libopus emits exactly one packet per frame.
        out = b"".join(bytes(packet) for packet in packets)
        if self._quiet == SILENCE_SETTLE_FRAMES:
            self._quiet_packet = out
        return out


class OpusDecoder:
    """48 kHz int16 PCM from Opus packets; mono or stereo packets, downmixed when ``channels_out=1``."""

    __slots__ = ("_channels", "_concealer", "_context", "_pending")

    def __init__(self, *, channels_out: int = 1) -> None:
        layout = _layout(channels_out)
        self._channels = channels_out
        context = av.CodecContext.create("libopus", "r")
        context.sample_rate = OPUS_SAMPLE_RATE
        context.layout = layout  # libopus downmixes stereo packets for a mono decoder itself
        context.format = "s16"
        self._context = context
        self._concealer = Concealer(sample_rate=OPUS_SAMPLE_RATE, channels=channels_out)
        self._pending: tuple[bytes, npt.NDArray[np.int16]] | None = None

    @property
    def channels_out(self) -> int:
        return self._channels

    def decode(self, payload: bytes) -> npt.NDArray[np.int16]:
        """PCM of one packet: 960 samples (mono) or 1920 interleaved (stereo) per 20 ms."""
        if self._pending is not None:
            pending_payload, pending_pcm = self._pending
            self._pending = None
            if pending_payload == payload:  # already decoded by decode_fec()
                return pending_pcm
        return self._flatten(self._concealer.observe(self._decode_raw(payload)))

    def conceal(self) -> npt.NDArray[np.int16]:
        """PCM for one missing 20 ms packet (pitch repetition with fade, continuous with the past)."""
        self._pending = None
        return self._flatten(self._concealer.conceal(OPUS_FRAME_SAMPLES))

    def decode_fec(self, next_payload: bytes) -> npt.NDArray[np.int16]:
        """PCM for the missing packet just before ``next_payload``, recovered with the next packet's help.

        ``next_payload`` is decoded now and its PCM is returned by the next :meth:`decode` call with the same
        bytes, so the decoder state advances once. The lost frame is interpolated between the past and the
        next packet (see the module docstring for why libopus LBRR data is not used).
        """
        following = self._decode_raw(next_payload)
        bridged = self._concealer.bridge(OPUS_FRAME_SAMPLES, following)
        observed = self._concealer.observe(following)
        self._pending = (bytes(next_payload), self._flatten(observed))
        return self._flatten(bridged)

    def _decode_raw(self, payload: bytes) -> npt.NDArray[np.int16]:
        if not payload:
            raise OpusError("empty Opus packet: call conceal() for a missing packet")
        try:
            frames = self._context.decode(av.Packet(payload))
        except (av.error.FFmpegError, ValueError) as exc:
            raise OpusError(f"libopus rejected a packet of {len(payload)} bytes: {exc}") from exc
        if not frames:
            raise OpusError("libopus returned no audio for a packet")
        parts = [frame.to_ndarray().reshape(-1) for frame in frames]  # packed s16: interleaved
        pcm = np.concatenate(parts) if len(parts) > 1 else parts[0]
        return np.ascontiguousarray(pcm, dtype=np.int16)

    @staticmethod
    def _flatten(pcm: npt.NDArray[np.int16]) -> npt.NDArray[np.int16]:
        flat: npt.NDArray[np.int16] = pcm.reshape(-1)
        return flat
