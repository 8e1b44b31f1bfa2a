"""Opus (RFC 6716), 20 ms frames, through libopus's own API.

This module owns one encoder and one decoder object per call direction. PCM is int16; stereo is
interleaved. The PCM side runs at 48 kHz unless told otherwise: libopus encodes from and decodes to 8, 12, 16
or 24 kHz as well, so a 24 kHz session needs no resampler in either direction (an encoder fed 24 kHz codes up
to 12 kHz of audio, all there is). The packets are the same Opus whatever the rate. RTP payloading (RFC 7587: one
Opus packet per RTP payload, a 48 kHz clock whatever the PCM's rate) is the media layer's job; these objects
take and return whole Opus packets.

libopus is called directly (:mod:`telcodecs._libopus`, ctypes), not through PyAV's codec contexts: that costs
less on every frame, and it reaches what FFmpeg's wrapper hides, libopus's own packet loss concealment
(:meth:`OpusDecoder.conceal`) and the recovery of a lost frame from the in-band FEC copy the next packet
carries (:meth:`OpusDecoder.decode_fec`). Why, and the figures: docs/adr/0012-libopus-called-directly.md.

Silence: libopus costs about as much to encode a frame of digital silence as a frame of speech, and an agent is
silent for much of a call. Once the encoder has been fed :data:`SILENCE_SETTLE_FRAMES` all-zero frames in a row,
its state is silence and so is the packet it makes (with its in-band FEC copy of the frame before); further
all-zero frames get that same packet back without calling libopus. The first frame that is not all zeros is
encoded from the state the silence left, as it would have been. ``reuse_silence=False`` encodes every frame.
"""

from __future__ import annotations

import ctypes
from typing import Final

import numpy as np
import numpy.typing as npt

from telcodecs._libopus import (
    MAX_PACKET_BYTES,
    OPUS_APPLICATION_VOIP,
    OPUS_OK,
    OPUS_SET_BITRATE,
    OPUS_SET_COMPLEXITY,
    OPUS_SET_INBAND_FEC,
    OPUS_SET_PACKET_LOSS_PERC,
    Libopus,
    LibopusNotFoundError,
    load,
)

__all__ = [
    "OPUS_FRAME_SAMPLES",
    "OPUS_SAMPLE_RATE",
    "PCM_RATES",
    "SILENCE_SETTLE_FRAMES",
    "OpusDecoder",
    "OpusEncoder",
    "OpusError",
    "libopus_version",
]

OPUS_SAMPLE_RATE: Final = 48_000
OPUS_FRAME_SAMPLES: Final = 960  # 20 ms per channel at 48 kHz
PCM_RATES: Final = (8000, 12000, 16000, 24000, 48000)  # what libopus encodes from and decodes to
SILENCE_SETTLE_FRAMES: Final = 3  # all-zero frames encoded before their packet is reused


class OpusError(ValueError):
    """Bad settings, PCM of the wrong shape, a packet libopus rejects, or no libopus to load."""


def _library() -> Libopus:
    try:
        return load()
    except LibopusNotFoundError as exc:
        raise OpusError(str(exc)) from exc


def libopus_version() -> str:
    """The loaded libopus's version string and path, e.g. ``libopus 1.3.1 (/lib/.../libopus.so.0)``."""
    opus = _library()
    return f"{opus.version} ({opus.path})"


def _channels(channels: int) -> int:
    if channels not in (1, 2):
        raise OpusError(f"channels must be 1 or 2, got {channels}")
    return channels


def _frame_samples(sample_rate: int) -> int:
    if sample_rate not in PCM_RATES:
        raise OpusError(f"sample_rate must be one of {', '.join(map(str, PCM_RATES))} Hz, got {sample_rate}")
    return sample_rate // 50


def _address(pcm: npt.NDArray[np.int16]) -> int:
    address: int = pcm.__array_interface__["data"][0]
    return address


class OpusEncoder:
    """20 ms Opus packets from int16 PCM at ``sample_rate`` (``sample_rate / 50 * channels`` interleaved samples
    per call: 960 at 48 kHz, 480 at 24 kHz)."""

    __slots__ = (
        "_channels",
        "_encode",
        "_frame",
        "_out",
        "_quiet",
        "_quiet_packet",
        "_reuse",
        "_state",
        "_strerror",
        "reused",
    )

    def __init__(
        self,
        *,
        channels: int = 1,
        bitrate: int = 32000,
        complexity: int = 5,
        fec: bool = True,
        packet_loss_pct: int = 10,
        reuse_silence: bool = True,
        sample_rate: int = OPUS_SAMPLE_RATE,
    ) -> None:
        self._channels = _channels(channels)
        self._frame = _frame_samples(sample_rate)
        if not 6000 <= bitrate <= 510000:
            raise OpusError(f"bitrate must be 6000..510000 bit/s, got {bitrate}")
        if not 0 <= complexity <= 10:
            raise OpusError(f"complexity must be 0..10, got {complexity}")
        if not 0 <= packet_loss_pct <= 100:
            raise OpusError(f"packet_loss_pct must be 0..100, got {packet_loss_pct}")
        opus = _library()
        lib = opus.lib
        self._state = ctypes.create_string_buffer(lib.opus_encoder_get_size(channels))
        status = lib.opus_encoder_init(self._state, sample_rate, channels, OPUS_APPLICATION_VOIP)
        # libopus only adds in-band FEC (LBRR) when told to expect loss.
        for request, value in (
            (OPUS_SET_BITRATE, bitrate),
            (OPUS_SET_COMPLEXITY, complexity),
            (OPUS_SET_INBAND_FEC, int(fec)),
            (OPUS_SET_PACKET_LOSS_PERC, packet_loss_pct if fec else 0),
        ):
            if status != OPUS_OK:
                break
            status = lib.opus_encoder_ctl(self._state, request, value)
        if status != OPUS_OK:
            raise OpusError(f"libopus encoder refused the settings: {opus.strerror(status)}")
        self._encode = lib.opus_encode
        self._strerror = opus.strerror
        self._out = ctypes.create_string_buffer(MAX_PACKET_BYTES)
        self._reuse = reuse_silence
        self._quiet = 0  # all-zero frames in a row
        self._quiet_packet: bytes | None = None
        self.reused = 0  # frames answered with the settled silence packet, libopus not called

    @property
    def channels(self) -> int:
        return self._channels

    @property
    def frame_samples(self) -> int:
        """Samples per channel in one 20 ms frame at this encoder's rate."""
        return self._frame

    @property
    def settled_silence(self) -> bytes | None:
        """The packet the last :meth:`encode` returned when it was the settled silence (exact zeros for longer than
        :data:`SILENCE_SETTLE_FRAMES`), else None: a packet that may be repeated or left out without a sound."""
        if self._reuse and self._quiet > SILENCE_SETTLE_FRAMES:
            return self._quiet_packet
        return None

    def encode(self, pcm: npt.NDArray[np.int16]) -> bytes:
        """One 20 ms packet from ``frame_samples * channels`` interleaved int16 samples."""
        want = self._frame * self._channels
        if not isinstance(pcm, np.ndarray) or pcm.dtype != np.int16 or pcm.shape != (want,):
            raise OpusError(f"encode needs int16[{want}], got {getattr(pcm, 'dtype', type(pcm))}")
        if self._reuse:
            if pcm.any():
                self._quiet = 0
            else:
                self._quiet += 1
                if self._quiet > SILENCE_SETTLE_FRAMES and self._quiet_packet is not None:
                    self.reused += 1
                    return self._quiet_packet
        if not pcm.flags.c_contiguous:
            pcm = np.ascontiguousarray(pcm)
        size = self._encode(self._state, _address(pcm), self._frame, self._out, MAX_PACKET_BYTES)
        if size < 0:
            raise OpusError(f"libopus failed to encode: {self._strerror(size)}")
        out = self._out.raw[:size]
        if self._quiet == SILENCE_SETTLE_FRAMES:
            self._quiet_packet = out
        return out


class OpusDecoder:
    """int16 PCM at ``sample_rate`` from Opus packets; mono or stereo packets, downmixed when ``channels_out=1``."""

    __slots__ = ("_channels", "_decode", "_frame", "_rate", "_samples", "_state", "_strerror")

    def __init__(self, *, channels_out: int = 1, sample_rate: int = OPUS_SAMPLE_RATE) -> None:
        self._channels = _channels(channels_out)
        self._frame = _frame_samples(sample_rate)
        self._rate = sample_rate
        opus = _library()
        lib = opus.lib
        self._state = ctypes.create_string_buffer(lib.opus_decoder_get_size(channels_out))
        status = lib.opus_decoder_init(self._state, sample_rate, channels_out)  # downmixes stereo itself
        if status != OPUS_OK:
            raise OpusError(f"libopus decoder refused the settings: {opus.strerror(status)}")
        self._decode = lib.opus_decode
        self._samples = lib.opus_packet_get_nb_samples
        self._strerror = opus.strerror

    @property
    def channels_out(self) -> int:
        return self._channels

    @property
    def frame_samples(self) -> int:
        """Samples per channel in one 20 ms frame at this decoder's rate."""
        return self._frame

    def decode(self, payload: bytes) -> npt.NDArray[np.int16]:
        """PCM of one packet: per 20 ms, ``frame_samples`` samples (mono) or twice that interleaved (stereo)."""
        if not payload:
            raise OpusError("empty Opus packet: call conceal() for a missing packet")
        samples = self._samples(payload, len(payload), self._rate)
        if samples <= 0:
            reason = self._strerror(samples) if samples < 0 else "no audio in it"
            raise OpusError(f"libopus rejected a packet of {len(payload)} bytes: {reason}")
        return self._run(payload, samples, fec=0)

    def conceal(self) -> npt.NDArray[np.int16]:
        """PCM for one missing 20 ms packet: libopus's concealment, continuous with the past and fading."""
        return self._run(None, self._frame, fec=0)

    def decode_fec(self, next_payload: bytes) -> npt.NDArray[np.int16]:
        """PCM for the 20 ms packet missing just before ``next_payload``, from the in-band FEC (LBRR) copy of it
        that the next packet carries; libopus conceals instead when that packet carries none.

        ``next_payload`` itself is not consumed: decode it with :meth:`decode` as usual.
        """
        if not next_payload:
            raise OpusError("empty Opus packet: call conceal() for a missing packet")
        return self._run(next_payload, self._frame, fec=1)

    def _run(self, payload: bytes | None, samples: int, *, fec: int) -> npt.NDArray[np.int16]:
        pcm = np.empty(samples * self._channels, dtype=np.int16)
        size = len(payload) if payload is not None else 0
        got = self._decode(self._state, payload, size, _address(pcm), samples, fec)
        if got < 0:
            raise OpusError(f"libopus rejected a packet of {size} bytes: {self._strerror(got)}")
        return pcm if got == samples else pcm[: got * self._channels]
