"""The G.722 calls of one media tick: per-call codec state, 16 kHz <-> 24 kHz resampled as one batch.

:class:`~gateway.media.tick.TickEngine` keeps its G.722 calls here and calls :meth:`G722Calls.inbound` and
:meth:`G722Calls.outbound` once per tick, as it runs its G.711 rows and its Opus calls.

- **Inbound.** Each call's jitter buffer gives one 20 ms payload (160 octets; 10 ms packets are re-framed by the
  buffer as for G.711, since G.722 at 64 kbit/s is one octet per tick of its 8 kHz RTP clock). Each payload is
  decoded by the call's own :class:`~telcodecs.g722.G722Decoder` (ADPCM state is per call) into a row of one
  (N, 320) batch, and the batch goes 16k -> 24k in one :class:`~telcodecs.resample.BatchResampler` call.
- **Outbound.** Every call's 24 kHz frame that holds audio goes 24k -> 16k in one batch; each call's encoder then
  codes its row (or zeros for silence) into 160 octets. The encoder runs every tick, silent or not: its state
  must follow the stream it sends (G.722's idle state never settles into a repeating packet, so there is no
  packet to reuse as Opus does).
- **Concealment.** A missing frame inside a talkspurt is the last decoded 20 ms repeated under a linear fade to
  silence over ``fade_frames`` frames, continuous across frame edges: the G.711 rule, at 16 kHz. The decoder's
  state is kept through the gap and the next packet decoded from it: the peer's encoder ran on meanwhile, but
  the ADPCM adapts back within a few milliseconds, where a reset decoder restarts its step sizes from the
  minimum and plays the first syllable after a loss too quietly (on espeak-ng speech, over the 100 ms after a
  lost frame: 10.4 dB SNR against the unbroken decode with the state kept, 3.8 dB with a reset; tests/telcodecs,
  docs/adr/0021). Nor is the decoder fed anything in the gap: decoding the last packet's codes again in its
  place, tried, recovered no better afterwards (ADR 0021). When the peer's stream restarts (a new SSRC or
  a sequence restart: :attr:`MediaCall.stream_restarted`), its encoder restarted too, so the decoder is reset
  before the new stream's first frame and tracks it exactly.
- **Pauses.** A G.722 payload cannot be judged quiet without decoding it, so the jitter buffer is told the
  decoded level of each frame played (``heard``) when it waits for a pause to shrink or grow its delay.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from gateway.media import jitter
from gateway.media.call import MediaCall
from gateway.media.plc import RepeatAndFade
from telcodecs.frames import FRAME_SAMPLES, Frame, unchecked_frame
from telcodecs.g711 import pcm_is_quiet
from telcodecs.g722 import FRAME_SAMPLES as G722_SAMPLES
from telcodecs.g722 import G722Decoder, G722Encoder
from telcodecs.resample import BatchResampler

#: (call_id, destination address, datagram), as TickEngine returns them.
Datagram = tuple[str, tuple[str, int], bytes]

_ZERO_16K = np.zeros(G722_SAMPLES, dtype=np.int16)
_ZERO_24K = np.zeros(FRAME_SAMPLES, dtype=np.int16)
# The outbound 24k->16k row's history: CLEAR (zero, a fresh stream) or LIVE (the last PCM frame sent).
_CLEAR, _LIVE = 0, 1


class _G722Leg:
    __slots__ = ("decoder", "down_state", "encoder", "row_in", "row_out")

    def __init__(self, row_in: int, row_out: int) -> None:
        self.decoder = G722Decoder()
        self.encoder = G722Encoder()
        self.row_in = row_in
        self.row_out = row_out
        self.down_state = _CLEAR


class G722Calls:
    """Every G.722 call of one tick engine; pure (no I/O, no clock). See the module docstring."""

    def __init__(self, *, fade_frames: int) -> None:
        self.fade_frames = fade_frames
        self._up = BatchResampler(16000, 24000)
        self._down = BatchResampler(24000, 16000)
        self._legs: dict[str, _G722Leg] = {}
        self._order: list[MediaCall] = []
        self._order_legs: list[_G722Leg] = []
        self._in_rows = np.zeros(0, dtype=np.intp)
        # Concealment history, indexed by the inbound row (stable for the call's life).
        self._plc = RepeatAndFade(samples=G722_SAMPLES, fade_frames=fade_frames)

    def __len__(self) -> int:
        return len(self._order)

    def add(self, call_id: str) -> None:
        row_in = self._up.open()
        leg = _G722Leg(row_in, self._down.open())
        self._plc.open(row_in)
        self._legs[call_id] = leg

    def remove(self, call_id: str) -> None:
        leg = self._legs.pop(call_id, None)
        if leg is not None:
            self._up.close(leg.row_in)
            self._down.close(leg.row_out)

    def rebuild(self, calls: list[MediaCall]) -> None:
        """The G.722 calls, in the engine's order (after a call was added or removed)."""
        self._order = calls
        self._order_legs = [self._legs[c.config.call_id] for c in calls]
        self._in_rows = np.array([leg.row_in for leg in self._order_legs], dtype=np.intp)

    # ------------------------------------------------------------------------------------------- inbound

    def inbound(self, frames: dict[str, Frame], probes: dict[str, float], now: float) -> None:
        calls = self._order
        legs = self._order_legs
        n = len(calls)
        pcm16 = np.empty((n, G722_SAMPLES), dtype=np.int16)
        status = np.empty(n, dtype=np.int8)
        for i, call in enumerate(calls):
            jb = call.jitter_buffer
            rx = call.reception
            jb.adapt(rx.jitter, rx.received, 8000)
            payload = jb.pop()
            status[i] = jb.status
            if call.probe is not None and (arrived := call.probe_played(now)) is not None:
                probes[call.config.call_id] = arrived
            if payload is not None:
                leg = legs[i]
                if call.stream_restarted:
                    call.stream_restarted = False
                    leg.decoder.reset()
                pcm16[i] = leg.decoder.decode(payload)
        played = status == jitter.PLAYED
        rows = self._in_rows
        if not played.all():
            self._plc.conceal(pcm16, rows, status, played)
        if played.any():
            played_rows = rows[played]
            self._plc.played(played_rows, pcm16[played])
        for i, call in enumerate(calls):
            jb = call.jitter_buffer
            if jb.wants_level:  # a shrink or a grow waits for a pause: say whether this frame was one
                jb.heard(pcm_is_quiet(pcm16[i]))
        pcm24 = self._up.process(rows, pcm16)
        pcm24.flags.writeable = False
        for i, call in enumerate(calls):
            frames[call.config.call_id] = unchecked_frame(call.inbound_index, pcm24[i])
            call.inbound_index += 1

    # ------------------------------------------------------------------------------------------ outbound

    def outbound(self, outbound: Mapping[str, object], now: float, out: list[Datagram]) -> None:
        """Encode each call's frame (a ``Frame``; anything else, or nothing, is silence) and append its RTP."""
        calls = self._order
        legs = self._order_legs
        frames = [outbound.get(call.config.call_id) for call in calls]
        resampled: list[int] = []
        pcm24: list[npt.NDArray[np.int16]] = []
        for i, frame in enumerate(frames):
            leg = legs[i]
            if isinstance(frame, Frame):
                resampled.append(i)
                pcm24.append(frame.pcm)
                leg.down_state = _LIVE
            elif leg.down_state == _LIVE:
                # The last frame's filter tail plays out, as in a continuous stream; zeros through the filter
                # also clear its history (shorter than a frame), so the silence after skips the resampler.
                resampled.append(i)
                pcm24.append(_ZERO_24K)
                leg.down_state = _CLEAR
        pcm16: list[npt.NDArray[np.int16]] = [_ZERO_16K] * len(calls)
        if resampled:
            rows = np.array([legs[i].row_out for i in resampled], dtype=np.intp)
            batch = self._down.process(rows, np.stack(pcm24))
            for j, i in enumerate(resampled):
                pcm16[i] = batch[j]
        for i, call in enumerate(calls):
            payload = legs[i].encoder.encode(pcm16[i])
            packet = call.next_packet(payload, isinstance(frames[i], Frame), now)
            if packet is not None:
                out.append((call.config.call_id, call.send_address, packet))
