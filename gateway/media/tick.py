"""The worker's media tick: every call's inbound and outbound 20 ms of audio, DSP batched across calls.

One :class:`TickEngine` per media worker holds every call's :class:`~gateway.media.call.MediaCall`. The
transport glue (the only owner of sockets and clocks) drives it:

- ``packet_received`` from ``datagram_received``: parse the RTP header, hand the payload to the call's jitter
  buffer (or its RFC 4733 receiver). Malformed input is counted by reason and dropped; nothing raises.
- every 20 ms, at absolute deadlines: ``tick_outbound(frames, now)`` turns each call's outbound frame
  (``None`` = silence) into the RTP datagrams to send, and ``tick_inbound(now)`` pops one frame per call and
  returns a 24 kHz :class:`~telcodecs.frames.Frame` per call plus the DTMF presses. The two halves are
  independent; the worker sends first, so the caller's packets leave at the same point of every tick.
- ``encode_ahead()`` once the tick's datagrams are sent: while ``opus_ahead`` is set, Opus calls (moved over at a
  pause) have their frame encoded here and sent at the start of the next tick, so a tick's libopus encodes no
  longer hold back the packets of the calls after them (one tick of delay on the agent's voice).
- ``rtcp_due(now)`` (call it each tick; it is cheap) and ``rtcp_received`` for RTCP; ``remove_call`` returns
  the RTCP BYE to send.

Batching: all G.711 calls (PCMU rows first, then PCMA) are decoded with one ``*_decode_batch`` call per law
and resampled 8k->24k as one (N, 160) -> (N, 480) batch with per-call state rows of a
:class:`~telcodecs.resample.BatchResampler`; outbound runs the mirror image (24k->8k batch, encode batch).
G.722 calls (:mod:`gateway.media.g722calls`) decode and encode per call (ADPCM state is per call) and resample
16k<->24k as one batch each way. Opus calls decode/encode per call (libopus state is per call), at 24 kHz:
libopus decodes to and encodes from the session's rate itself, so Opus needs no resampler (the RTP clock stays
48 kHz, RFC 7587).
Every G.711 inbound frame also carries its 8 kHz codes (``Frame.g711``): the caller's own bytes when the frame
was played, the codes of the concealment otherwise, for sessions whose provider takes G.711 (passthrough).

G.711 passthrough outbound: an outbound frame that carries codes (a :class:`G711Frame`, or a ``Frame`` with
``g711``) is sent as those codes when their law is the call's codec and through a 256-entry code table when
it is not; only frames without codes are resampled 24k->8k (one batch) and encoded. Silence (``None``) is the
law's silence code, resampled only while the previous PCM frame's filter tail still has to play out.

PLC: G.711 repeats the last decoded 20 ms frame with a linear fade to silence over ``PLC_FADE_FRAMES``
frames, and so does G.722 at 16 kHz, its decoder's state kept through the gap; Opus uses the decoder's in-band
FEC when the next packet is already buffered, else its PLC.

Clocks: ``now`` is the transport's monotonic clock in seconds; RTCP needs wall-clock NTP timestamps, taken as
``now + wall_clock_offset`` (the transport measures the offset once, at start-up).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, final

import numpy as np
import numpy.typing as npt

from gateway.media import jitter
from gateway.media.call import Address, Direction, MediaCall, MediaCallConfig, MediaStats
from gateway.media.errors import LocalMediaError, RtpError
from gateway.media.g722calls import G722Calls
from gateway.media.plc import RepeatAndFade
from gateway.media.rfc4733 import DtmfReceived
from gateway.media.rtcp import build_bye, ntp_timestamp
from gateway.media.rtp import looks_like_rtcp, parse_rtp
from gateway.media.srtp import SrtpConfig, SrtpError
from telcodecs.frames import (
    FRAME_SAMPLES,
    G711_FRAME_BYTES,
    SAMPLE_RATE,
    Frame,
    FrameError,
    G711Law,
    Pcm,
    unchecked_frame,
)
from telcodecs.g711 import (
    ALAW_SILENCE,
    ULAW_SILENCE,
    alaw_decode_batch,
    alaw_encode_batch,
    alaw_to_ulaw,
    pcm_is_quiet,
    ulaw_decode_batch,
    ulaw_encode_batch,
    ulaw_to_alaw,
)
from telcodecs.opus import OpusDecoder, OpusEncoder, OpusError
from telcodecs.resample import BatchResampler

PLC_FADE_FRAMES = 3
G711_FRAME = 160

#: (call_id, destination address, datagram)
Datagram = tuple[str, Address, bytes]

_ZERO_24K = np.zeros(FRAME_SAMPLES, dtype=np.int16)
_SILENT_CODES = {"PCMU": bytes([ULAW_SILENCE]) * G711_FRAME, "PCMA": bytes([ALAW_SILENCE]) * G711_FRAME}
# Codes of the other law -> codes of the call's codec, code by code (telcodecs.g711), keyed by the call's codec.
_FROM_OTHER_LAW = {"PCMU": alaw_to_ulaw, "PCMA": ulaw_to_alaw}
_CODEC_LAW: dict[str, G711Law] = {"PCMU": "pcmu", "PCMA": "pcma"}
# State of a call's outbound 24k->8k resampler row. CLEAR: zero history, exactly a fresh stream. LIVE: the
# history holds the last PCM frame sent. STALE: PCM was sent, then code frames (which skip the resampler),
# so the history is out of date and is zeroed before the next PCM frame.
_CLEAR, _LIVE, _STALE = 0, 1, 2


@final
class G711Frame:
    """20 ms of outbound audio as 160 G.711 codes and nothing else, for a call whose codec is G.711.

    A :class:`~telcodecs.frames.Frame` always carries 24 kHz PCM; for a provider's G.711 audio that PCM costs
    an 8k->24k resampling that a G.711 caller never uses (the codes go out as they are). A session whose
    caller takes codes hands the tick this instead: it holds no PCM, so no consumer can read audio from it
    that was not made. ``index`` counts the call's outbound frames, as ``Frame.index`` does.

    A plain class, read-only by convention: one is built per call and frame the agent speaks, and in the
    compiled build a frozen dataclass is built through interpreted code (gateway/media/rtp.py).
    """

    __slots__ = ("g711", "g711_law", "index")

    def __init__(self, *, index: int, g711: bytes, g711_law: G711Law) -> None:
        if len(g711) != G711_FRAME_BYTES or g711_law not in ("pcmu", "pcma"):
            raise FrameError(f"g711 needs {G711_FRAME_BYTES} codes and a law (pcmu or pcma)")
        if index < 0:
            raise FrameError(f"frame index must be >= 0, got {index}")
        self.index = index
        self.g711 = g711
        self.g711_law = g711_law

    def __repr__(self) -> str:
        return f"G711Frame(index={self.index}, g711_law={self.g711_law!r})"


#: What a session hands the tick for one call: PCM (maybe with codes), codes only, or None for silence.
OutboundFrame = Frame | G711Frame | None


@dataclass(frozen=True, slots=True, kw_only=True)
class InboundTick:
    """What one inbound tick produced: one frame per call (silence when nothing arrived) and DTMF presses."""

    frames: dict[str, Frame]
    events: list[DtmfReceived]
    # Calls whose frame this tick carries a probed packet (MediaCall.probe): call id -> the packet's arrival.
    probes: dict[str, float] = field(default_factory=dict)


class _OpusLeg:
    __slots__ = ("ahead", "decoder", "encoder", "pending", "pending_audio")

    def __init__(self, decoder: OpusDecoder, encoder: OpusEncoder) -> None:
        self.decoder = decoder
        self.encoder = encoder
        self.ahead = False  # this call's frames are encoded a tick before they are sent
        self.pending = b""  # while ahead: the payload encoded last tick, sent this tick
        self.pending_audio = False


def _opus_encode(leg: _OpusLeg, frame: OutboundFrame) -> bytes:
    mono = frame.pcm if isinstance(frame, Frame) else _ZERO_24K  # the encoder takes the session's rate
    return leg.encoder.encode(np.repeat(mono, 2) if leg.encoder.channels == 2 else mono)


class TickEngine:
    """All calls of one worker; pure (no I/O, no clock). See the module docstring for the cycle."""

    def __init__(self, *, rtcp_interval: float = 5.0, wall_clock_offset: float = 0.0) -> None:
        if rtcp_interval <= 0:
            raise LocalMediaError("rtcp_interval must be positive")
        self.rtcp_interval = rtcp_interval
        self.wall_clock_offset = wall_clock_offset
        self._calls: dict[str, MediaCall] = {}
        self._takes_g711: list[tuple[str, bool]] = []  # (call id, its codec is G.711) for every call, in order
        self.dropped: dict[str, int] = {}
        # G.711: resampler rows per call, PLC history indexed by the inbound row (stable for the call's life).
        self._up8 = BatchResampler(8000, 24000)
        self._down8 = BatchResampler(24000, 8000)
        self._g711_rows: dict[str, tuple[int, int]] = {}
        self._g711_order: list[MediaCall] = []
        self._g711_in_rows = np.zeros(0, dtype=np.intp)
        self._g711_out_rows = np.zeros(0, dtype=np.intp)
        self._g711_out_list: list[int] = []
        self._g711_ulaw = 0
        self._down8_state: list[int] = []  # per row of _down8: _CLEAR, _LIVE or _STALE
        self._plc = RepeatAndFade(samples=G711_FRAME, fade_frames=PLC_FADE_FRAMES)
        self._g722 = G722Calls(fade_frames=PLC_FADE_FRAMES)
        # Opus.
        self._opus: dict[str, _OpusLeg] = {}
        self._opus_order: list[MediaCall] = []
        # Encoding Opus a tick ahead (see tick_outbound): wanted by the worker; the frames queued for encode_ahead.
        self.opus_ahead = False
        self._later: list[tuple[_OpusLeg, OutboundFrame]] = []
        self.opus_moves = {"ahead": 0, "inline": 0}  # calls moved to each mode, ever

    # ------------------------------------------------------------------------------------------ calls

    def add_call(self, config: MediaCallConfig, *, now: float) -> MediaCall:
        """Start a call's media (after SDP negotiation). Raises LocalMediaError if the id is in use."""
        if config.call_id in self._calls:
            raise LocalMediaError(f"call {config.call_id!r} already has media")
        call = MediaCall(config, now=now)
        if config.codec == "opus":
            leg = _OpusLeg(
                OpusDecoder(channels_out=1, sample_rate=SAMPLE_RATE),
                OpusEncoder(channels=config.channels, bitrate=config.opus_bitrate, sample_rate=SAMPLE_RATE),
            )
            self._opus[config.call_id] = leg
        elif config.codec == "G722":
            self._g722.add(config.call_id)
        else:
            row_in = self._up8.open()
            row_out = self._down8.open()  # a zeroed row
            self._g711_rows[config.call_id] = (row_in, row_out)
            if row_out >= len(self._down8_state):
                self._down8_state.extend([_CLEAR] * (row_out + 1 - len(self._down8_state)))
            self._down8_state[row_out] = _CLEAR
            self._plc.open(row_in)
        self._calls[config.call_id] = call
        self._rebuild()
        return call

    def remove_call(self, call_id: str) -> list[Datagram]:
        """Stop a call's media, free its DSP rows; returns the RTCP BYE to send (RFC 3550 §6.6)."""
        call = self._calls.pop(call_id, None)
        if call is None:
            return []
        rows = self._g711_rows.pop(call_id, None)
        if rows is not None:
            self._up8.close(rows[0])
            self._down8.close(rows[1])
        self._opus.pop(call_id, None)
        self._g722.remove(call_id)
        self._rebuild()
        cfg = call.config
        bye = build_bye(ssrc=cfg.ssrc, cname=cfg.cname)
        return [(call_id, call.rtcp_address, bye if call.srtp is None else call.srtp.protect_rtcp(bye))]

    def _rebuild(self) -> None:
        calls = self._calls.values()
        self._takes_g711 = [(c.config.call_id, c.config.codec in _CODEC_LAW) for c in calls]
        ulaw = [c for c in calls if c.config.codec == "PCMU"]
        alaw = [c for c in calls if c.config.codec == "PCMA"]
        self._g711_order = ulaw + alaw
        self._g711_ulaw = len(ulaw)
        rows = [self._g711_rows[c.config.call_id] for c in self._g711_order]
        self._g711_in_rows = np.array([r[0] for r in rows], dtype=np.intp)
        self._g711_out_list = [r[1] for r in rows]
        self._g711_out_rows = np.array(self._g711_out_list, dtype=np.intp)
        self._opus_order = [c for c in calls if c.config.codec == "opus"]
        self._g722.rebuild([c for c in calls if c.config.codec == "G722"])

    def call(self, call_id: str) -> MediaCall:
        call = self._calls.get(call_id)
        if call is None:
            raise LocalMediaError(f"no media for call {call_id!r}")
        return call

    @property
    def call_ids(self) -> list[str]:
        return list(self._calls)

    @property
    def takes_g711(self) -> list[tuple[str, bool]]:
        """(call id, whether its codec is G.711) for every call: what each call's outbound frame may be."""
        return self._takes_g711

    def __len__(self) -> int:
        return len(self._calls)

    def send_dtmf(self, call_id: str, digits: str, *, duration_ms: int = 100, volume: int = 10) -> None:
        """Queue RFC 4733 digits; they replace this call's audio packets while they play."""
        self.call(call_id).send_dtmf(digits, duration_ms=duration_ms, volume=volume)

    def set_direction(self, call_id: str, direction: Direction) -> None:
        self.call(call_id).set_direction(direction)

    def update_remote(self, call_id: str, remote_rtp: Address, remote_rtcp: Address | None = None) -> None:
        self.call(call_id).update_remote(remote_rtp, remote_rtcp)

    def set_srtp(self, call_id: str, config: SrtpConfig) -> None:
        """A re-offer's SRTP keys for an SRTP call (gateway/media/srtp.py: only a changed direction restarts)."""
        self.call(call_id).set_srtp(config)

    def stats(self, call_id: str, now: float) -> MediaStats:
        return self.call(call_id).stats(now)

    def inactive_for(self, call_id: str, now: float) -> float:
        return self.call(call_id).inactive_for(now)

    # -------------------------------------------------------------------------------------- receiving

    def _count(self, reason: str) -> str:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1
        return reason

    def packet_received(self, call_id: str, data: bytes, source: tuple[Any, ...], now: float) -> str | None:
        """One datagram from the call's RTP port. Returns None when used, else the (counted) drop reason."""
        call = self._calls.get(call_id)
        if call is None:
            return self._count("unknown_call")
        if call.config.rtcp_mux and looks_like_rtcp(data):
            return self.rtcp_received(call_id, data, source, now)
        srtp = call.srtp
        if srtp is not None:  # authenticated and decrypted before anything reads it (RFC 3711 §3.3)
            try:
                data = srtp.unprotect(data)
            except SrtpError as exc:
                return self._count(call.drop(call.srtp_drop_reason(exc.reason, data)))
        try:
            packet = parse_rtp(data)
        except RtpError as exc:
            return self._count(call.drop("malformed_" + exc.reason))
        reason = call.receive(packet, source, now)
        if reason is not None:
            self._count(reason)
        return reason

    def rtcp_received(self, call_id: str, data: bytes, source: tuple[Any, ...], now: float) -> str | None:
        """One datagram from the call's RTCP port (or muxed). None when used, else the (counted) drop reason."""
        call = self._calls.get(call_id)
        if call is None:
            return self._count("unknown_call")
        srtp = call.srtp
        if srtp is not None:
            try:
                data = srtp.unprotect_rtcp(data)
            except SrtpError as exc:
                return self._count(call.drop("srtcp_" + exc.reason))
        reason = call.rtcp_receive(data, source, ntp_timestamp(now + self.wall_clock_offset))
        if reason is not None:
            self._count(reason)
        return reason

    # ----------------------------------------------------------------------------------- inbound tick

    def tick_inbound(self, now: float) -> InboundTick:
        """Pop one 20 ms frame per call (PLC or silence when missing), decode and resample to 24 kHz."""
        frames: dict[str, Frame] = {}
        events: list[DtmfReceived] = []
        for call in self._calls.values():
            if call.events:
                events.extend(call.events)
                call.events.clear()
        probes: dict[str, float] = {}
        if self._g711_order:
            self._inbound_g711(frames, probes, now)
        if len(self._g722):
            self._g722.inbound(frames, probes, now)
        if self._opus_order:
            self._inbound_opus(frames, probes, now)
        return InboundTick(frames=frames, events=events, probes=probes)

    def _inbound_g711(self, frames: dict[str, Frame], probes: dict[str, float], now: float) -> None:
        calls = self._g711_order
        n = len(calls)
        nu = self._g711_ulaw
        parts: list[bytes] = []
        statuses: list[int] = []
        for call in calls:
            jb = call.jitter_buffer
            rx = call.reception
            jb.adapt(rx.jitter, rx.received, 8000)
            payload = jb.pop()
            parts.append(payload if payload is not None else _SILENT_CODES[call.config.codec])
            statuses.append(jb.status)
            if call.probe is not None and (arrived := call.probe_played(now)) is not None:
                probes[call.config.call_id] = arrived
        codes = np.frombuffer(b"".join(parts), dtype=np.uint8).reshape(n, G711_FRAME)
        pcm8 = np.empty((n, G711_FRAME), dtype=np.int16)
        if nu:
            pcm8[:nu] = ulaw_decode_batch(codes[:nu])
        if nu < n:
            pcm8[nu:] = alaw_decode_batch(codes[nu:])
        rows = self._g711_in_rows
        status = np.array(statuses, dtype=np.int8)
        played = status == jitter.PLAYED
        if not played.all():
            self._plc.conceal(pcm8, rows, status, played)
            # Concealed frames carry the codes of what PLC made, one batch per law. SILENT rows already hold
            # the silence codes (PLC zeroes them), and a paused sender makes many of those every tick.
            concealed = np.flatnonzero(status == jitter.CONCEALED)
            for law_rows, encode in (
                (concealed[concealed < nu], ulaw_encode_batch),
                (concealed[concealed >= nu], alaw_encode_batch),
            ):
                if law_rows.size:
                    made = encode(pcm8[law_rows]).tobytes()
                    for k, i in enumerate(law_rows.tolist()):
                        parts[i] = made[k * G711_FRAME : (k + 1) * G711_FRAME]
        if played.any():
            played_rows = rows[played]
            self._plc.played(played_rows, pcm8[played])
        pcm24 = self._up8.process(rows, pcm8)
        pcm24.flags.writeable = False
        for i, call in enumerate(calls):
            # Rows of one int16[n, 480] batch meet the frame contract by construction: no checks per frame.
            frames[call.config.call_id] = unchecked_frame(
                call.inbound_index, pcm24[i], parts[i], "pcmu" if i < nu else "pcma"
            )
            call.inbound_index += 1

    def _inbound_opus(self, frames: dict[str, Frame], probes: dict[str, float], now: float) -> None:
        calls = self._opus_order
        pcm24 = np.empty((len(calls), FRAME_SAMPLES), dtype=np.int16)
        for i, call in enumerate(calls):
            jb = call.jitter_buffer
            rx = call.reception
            jb.adapt(rx.jitter, rx.received, 48000)
            payload = jb.pop()
            if call.probe is not None and (arrived := call.probe_played(now)) is not None:
                probes[call.config.call_id] = arrived
            decoder = self._opus[call.config.call_id].decoder
            pcm = pcm24[i] = self._opus_decode(call, decoder, payload, jb.status, jb.fec_payload)
            if jb.wants_level:  # a shrink waits for a pause: tell it whether this frame was one (as G.711's test)
                jb.heard(pcm_is_quiet(pcm))
        pcm24.flags.writeable = False
        for i, call in enumerate(calls):
            frames[call.config.call_id] = unchecked_frame(call.inbound_index, pcm24[i])
            call.inbound_index += 1

    def _opus_decode(
        self, call: MediaCall, decoder: OpusDecoder, payload: bytes | None, status: int, fec: bytes | None
    ) -> npt.NDArray[np.int16]:
        try:
            if payload is not None:
                return decoder.decode(payload)
            if status == jitter.CONCEALED:
                return decoder.decode_fec(fec) if fec is not None else decoder.conceal()
        except OpusError:  # libopus rejected the peer's payload: counted, concealed
            self._count(call.drop("malformed_opus"))
            return decoder.conceal()
        return _ZERO_24K

    # ---------------------------------------------------------------------------------- outbound tick

    def skip_ticks(self, ticks: int) -> None:
        """The clock skipped ``ticks`` ticks after a stall: every call's RTP clock moves on by them."""
        for call in self._calls.values():
            call.skip_ticks(ticks)

    def tick_outbound(self, outbound: Mapping[str, OutboundFrame], now: float) -> list[Datagram]:
        """Encode each call's frame (missing/None = silence) into RTP; returns (call_id, address, datagram).

        G.711 calls take a :class:`G711Frame` (codes only) or a ``Frame``. G.722 and Opus calls need PCM: a session
        is told its caller takes codes only for a G.711 call, and a code frame handed to them would be silence."""
        out: list[Datagram] = []
        if self._g711_order:
            self._outbound_g711(outbound, now, out)
        if len(self._g722):
            self._g722.outbound(outbound, now, out)
        if self._opus_order:
            self._outbound_opus(outbound, now, out)
        return out

    def _outbound_g711(self, outbound: Mapping[str, OutboundFrame], now: float, out: list[Datagram]) -> None:
        calls = self._g711_order
        nu = self._g711_ulaw
        rows = self._g711_out_list
        state = self._down8_state
        frames = [outbound.get(call.config.call_id) for call in calls]
        payloads: list[bytes] = []
        resampled: list[int] = []  # positions resampled this tick, ascending
        pcm24: list[Pcm] = []
        for i, frame in enumerate(frames):
            row = rows[i]
            codec = "PCMU" if i < nu else "PCMA"
            if frame is None:
                if state[row] == _LIVE:
                    # The last PCM frame's filter tail plays out, as in a continuous stream; a frame of zeros
                    # also zeroes the history (shorter than a frame), so later silence skips the resampler.
                    resampled.append(i)
                    pcm24.append(_ZERO_24K)
                    state[row] = _CLEAR
                    payloads.append(b"")
                else:  # CLEAR: zeros through a zero history are zeros; STALE: the history is zeroed before use
                    payloads.append(_SILENT_CODES[codec])
            elif (codes := frame.g711) is not None:
                payloads.append(codes if frame.g711_law == _CODEC_LAW[codec] else _FROM_OTHER_LAW[codec](codes))
                if state[row] == _LIVE:
                    state[row] = _STALE
            elif isinstance(frame, Frame):  # always, here: a G711Frame has codes
                if state[row] == _STALE:
                    # PCM after code frames: start the stream afresh. The caller heard the codes, which never
                    # passed through this row, so no history is the true one; zero history is a fresh stream,
                    # as after silence, and the only cost is the old tail not bleeding into this frame's first
                    # 1.25 ms (the filter's delay). Switches happen between items (a profile change, a resume).
                    self._down8.reset(row)
                resampled.append(i)
                pcm24.append(frame.pcm)
                state[row] = _LIVE
                payloads.append(b"")
        if resampled:
            out_rows = self._g711_out_rows if len(resampled) == len(calls) else self._g711_out_rows[resampled]
            pcm8 = self._down8.process(out_rows, np.stack(pcm24))
            k = bisect_left(resampled, nu)  # PCMU positions come first
            blob = ulaw_encode_batch(pcm8[:k]).tobytes() if k else b""
            if k < len(resampled):
                blob += alaw_encode_batch(pcm8[k:]).tobytes()
            for j, i in enumerate(resampled):
                payloads[i] = blob[j * G711_FRAME : (j + 1) * G711_FRAME]
        for i, call in enumerate(calls):
            packet = call.next_packet(payloads[i], frames[i] is not None, now)
            if packet is not None:
                out.append((call.config.call_id, call.send_address, packet))

    def _outbound_opus(self, outbound: Mapping[str, OutboundFrame], now: float, out: list[Datagram]) -> None:
        want_ahead = self.opus_ahead
        if self._later:  # encode_ahead was not called last tick: those frames go out now, late but whole
            self.encode_ahead()
        later = self._later
        for call in self._opus_order:
            leg = self._opus[call.config.call_id]
            frame = outbound.get(call.config.call_id)
            if leg.ahead != want_ahead and (quiet := leg.encoder.settled_silence) is not None:
                # A change of mode costs the caller nothing only inside a pause: going ahead repeats the settled
                # silence packet once (the agent's voice is a tick later from here), coming back leaves the
                # pending one out (a tick sooner) unless it carries a frame the session counted as heard. The
                # RTP stream stays seamless: the packet is built when it is sent.
                if want_ahead:
                    leg.ahead, leg.pending, leg.pending_audio = True, quiet, False
                    self.opus_moves["ahead"] += 1
                elif not leg.pending_audio:
                    leg.ahead = False
                    self.opus_moves["inline"] += 1
            if leg.ahead:
                payload, audio = leg.pending, leg.pending_audio
                later.append((leg, frame))
            else:
                payload, audio = _opus_encode(leg, frame), isinstance(frame, Frame)
            packet = call.next_packet(payload, audio, now)
            if packet is not None:
                out.append((call.config.call_id, call.send_address, packet))

    def encode_ahead(self) -> None:
        """Encode the frames ``tick_outbound`` took from calls encoded a tick ahead; they are sent next tick.

        Call it after the tick's datagrams are sent. While :attr:`opus_ahead` is set, each Opus call moves to
        this mode at its next pause and every packet then leaves at the start of its tick, however many
        encodes the tick does (at the price of one tick of delay on the agent's voice); cleared, each call
        moves back at its next pause."""
        for leg, frame in self._later:
            leg.pending = _opus_encode(leg, frame)
            leg.pending_audio = isinstance(frame, Frame)
        self._later.clear()

    @property
    def has_opus(self) -> bool:
        """Whether any call's codec is Opus (the tick then encodes with libopus, call by call)."""
        return bool(self._opus_order)

    @property
    def opus_calls_ahead(self) -> int:
        """Opus calls whose frames are encoded a tick ahead now."""
        return sum(1 for leg in self._opus.values() if leg.ahead)

    # ------------------------------------------------------------------------------------------- RTCP

    def rtcp_due(self, now: float) -> list[Datagram]:
        """Compound SR/RR for every call whose report interval elapsed (~``rtcp_interval``, randomised)."""
        out: list[Datagram] = []
        ntp = 0
        for call in self._calls.values():
            if call.next_rtcp_at > now:
                continue
            if not ntp:
                ntp = ntp_timestamp(now + self.wall_clock_offset)
            out.append((call.config.call_id, call.rtcp_address, call.rtcp_report(now, ntp)))
            call.schedule_rtcp(now, self.rtcp_interval)
        return out
