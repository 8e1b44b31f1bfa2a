"""Adaptive playout (jitter) buffer for one call, in payload units: one 20 ms frame out per :meth:`pop`.

The buffer keys payload *units* by extended RTP timestamp relative to an anchor (the first packet after a
(re)synchronisation). A frame is ``units_per_frame`` consecutive units:

- G.711 uses 10 ms units (80 samples = 80 bytes), two per frame, so packets of 10, 20, 30, 40, 60 ms are all
  re-framed: a packet is cut into 10 ms units. A 20 ms packet that starts on a frame boundary is stored whole
  (no copy); the rare frame with only one of its halves present plays that half twice.
- Opus uses one 20 ms unit per frame; the caller must hand in 20 ms packets only (RFC 7587 packets of other
  durations are counted as unsupported by the caller and concealed). Phones and browsers send 20 ms.

Playout states (``pop`` is called once per 20 ms tick)::

    IDLE ──push──> PREFILL ──buffered >= target──> PLAYING ──frame missing, nothing newer──> REBUFFER
      ^                ^  ^                           │  ^                                      │  │
      │                │  │                           │  └───── push on time (it was a loss) ───┘  │
      │                │  └──────────────────────── push late (an underrun: re-anchor) ────────────┘
      └── reset() ─────┴──── discontinuity (push) ────┘

- In PLAYING a missing frame with newer data buffered is a loss: conceal it and move on. A missing frame with
  nothing newer is concealed too, and what it was is decided by the next packet. If that packet is for a
  frame not yet due (the missing one was lost, and the next had not arrived yet when its turn came: a loss
  while the buffer is at its shallowest, which a buffer a frame deep meets every time the next packet is a
  little late), playout goes on in the same place: the gap was concealed where the lost frames were, and
  nothing after it moves. If the packet is for a frame whose turn has passed, or nothing came while the gap
  could be concealed (``max_conceal_frames``: the sender paused), it is an *underrun*: the delay was too
  small, so playout re-anchors on the next packet and prefills to the target again - this is how the delay
  grows. Re-anchoring on every such gap would insert a frame of silence inside the caller's speech at each
  loss that met a shallow buffer, and keep the delay a frame longer.
- With ``fec`` (Opus: the packet after a lost frame carries it again, in-band FEC, handed out as
  ``fec_payload``) a loss of one frame met at the shallowest point, whose next packet came just after the lost
  frame's turn, is one FEC would have mended with a frame more of delay. That frame is *inserted* in the
  caller's next pause (a concealed frame played in place of the next quiet one, which then plays a tick
  later), and the shrink is held off as after an underrun, so the next such loss finds its FEC buffered.
- A packet whose frame was already played or concealed is *late* and dropped. A packet more than
  ``horizon_ms`` ahead (or, in sequence order, that far behind) is a timestamp discontinuity: re-anchor.
- The target delay follows the RFC 3550 A.8 jitter: ``frame + jitter_factor * J`` rounded up to a unit,
  clamped to [min_delay_ms, max_delay_ms]; ``start_delay_ms`` holds until ``warmup_packets`` have arrived.
  The delay shrinks by dropping one frame when, over a window of ``shrink_window_frames`` pops, the buffer
  never fell below the target - but not within ``shrink_hold_frames`` of an underrun: the delay an underrun
  grew to is what the last late burst needed, and giving it back at once would make the next such burst
  another underrun (a gap inserted inside the caller's talk spurt) followed by another dropped frame.
  A due shrink waits, up to ``shrink_wait_frames``, for a pause - ``shrink_pause_frames`` quiet frames
  played and a quiet one next - and drops that frame: a pause 20 ms shorter is not heard, a syllable 20 ms
  shorter is. G.711 payloads are judged by a ``quiet`` test (no sample above -36 dBFS); an Opus payload can
  only be judged decoded, so while ``wants_level`` the caller reports each played frame with :meth:`heard`
  and the frame after five quiet ones is taken to be quiet too.

A stall of the worker that its media clock could not catch up (ticks skipped, :meth:`JitterBuffer.skip`)
leaves the buffer that many frames deeper than the network needs: the caller went on sending while nothing
was played. That excess is a *debt*, paid in the caller's next pause: quiet whole frames are dropped there,
as many as are owed, as long as the target delay stays buffered. No word is cut and the delay is back by the
end of the pause, instead of one frame a second through the shrink above.

``status`` after ``pop`` is PLAYED, CONCEALED (a gap inside a talkspurt, or a frame inserted in a pause: the
caller runs PLC; ``fec_payload`` holds the next frame's payload if buffered, for Opus in-band FEC) or SILENT
(nothing to play: before the first packet, or after ``max_conceal_frames`` of a gap, where the sender has
evidently paused).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gateway.media.errors import LocalMediaError

PLAYED = 0
CONCEALED = 1
SILENT = 2

STORED = 0
LATE = 1
DUPLICATE = 2
RESYNCED = 3

_IDLE = 0
_PREFILL = 1
_PLAYING = 2
_REBUFFER = 3

#: Marks the second unit of a whole frame stored in its first unit's slot.
_COVERED = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class JitterConfig:
    """Playout delay policy (milliseconds)."""

    start_delay_ms: int = 40
    min_delay_ms: int = 20
    max_delay_ms: int = 200
    jitter_factor: float = 3.0
    warmup_packets: int = 50
    shrink_window_frames: int = 50
    shrink_hold_frames: int = 500
    shrink_wait_frames: int = 250
    shrink_pause_frames: int = 5
    max_conceal_frames: int = 10
    horizon_ms: int = 1000

    def __post_init__(self) -> None:
        if not 20 <= self.min_delay_ms <= self.start_delay_ms <= self.max_delay_ms:
            raise LocalMediaError("need 20 <= min_delay_ms <= start_delay_ms <= max_delay_ms")
        if self.horizon_ms < 2 * self.max_delay_ms:
            raise LocalMediaError("horizon_ms must be at least twice max_delay_ms")
        if self.jitter_factor < 0 or self.warmup_packets < 0 or self.shrink_hold_frames < 0:
            raise LocalMediaError("jitter_factor, warmup_packets and shrink_hold_frames must be >= 0")
        if self.shrink_window_frames < 1 or self.shrink_wait_frames < 1 or self.shrink_pause_frames < 0:
            raise LocalMediaError("shrink_window_frames and shrink_wait_frames must be >= 1, shrink_pause_frames >= 0")


class JitterBuffer:
    """Reorders, de-duplicates and paces one source's payloads; see the module docstring for the rules."""

    __slots__ = (
        "_anchor",
        "_debt",
        "_due",
        "_fec",
        "_frame_bytes",
        "_gap",
        "_grow",
        "_heard_quiet",
        "_high",
        "_hold",
        "_min_span",
        "_next",
        "_played_end",
        "_quiet",
        "_quiet_run",
        "_rebuffering",
        "_slots",
        "_state",
        "_unit_bytes",
        "_unit_ms",
        "_unit_samples",
        "_upf",
        "_window",
        "concealed",
        "config",
        "discarded",
        "duplicates",
        "fec_payload",
        "inserted",
        "late",
        "played",
        "resyncs",
        "status",
        "target_ms",
        "underruns",
    )

    def __init__(
        self,
        *,
        clock_rate: int,
        unit_samples: int,
        units_per_frame: int,
        unit_bytes: int,
        config: JitterConfig,
        quiet: Callable[[bytes], bool] | None = None,
        fec: bool = False,
    ) -> None:
        """``unit_bytes`` > 0 re-frames payloads into units of that size; 0 takes each payload as one unit.

        ``quiet(payload)`` tells a frame the caller would not miss (a pause); without it a shrink drops the next
        frame whatever it holds. ``fec``: the caller recovers a lost frame from the next packet (Opus in-band
        FEC, through ``fec_payload``), so a loss met with nothing newer buffered grows the delay by a frame in the
        caller's next pause."""
        if unit_samples * units_per_frame * 50 != clock_rate:
            raise LocalMediaError("unit_samples * units_per_frame must be 20 ms of the clock rate")
        self.config = config
        self._unit_samples = unit_samples
        self._unit_ms = 20 // units_per_frame
        self._upf = units_per_frame
        self._unit_bytes = unit_bytes
        self._frame_bytes = unit_bytes * units_per_frame
        self._slots: dict[int, bytes] = {}
        self.target_ms = config.start_delay_ms
        self.status = SILENT
        self.fec_payload: bytes | None = None
        self.late = self.duplicates = self.concealed = self.played = 0
        self.discarded = self.resyncs = self.underruns = self.inserted = 0
        self._fec = fec
        self._gap = config.max_conceal_frames  # not playing yet: gaps are silence, not concealment
        self._hold = 0
        self._quiet = quiet
        self._heard_quiet = False
        self._reset()

    def _reset(self) -> None:
        self._state = _IDLE
        self._slots.clear()
        self._anchor = 0
        self._next = 0
        self._high = -1
        self._played_end: int | None = None
        self._min_span = 1 << 30
        self._window = 0
        self._due = 0
        self._debt = 0
        self._quiet_run = 0
        self._rebuffering = 0
        self._grow = False

    def reset(self) -> None:
        """Forget the stream (SSRC change or sequence restart); the next push re-anchors playout."""
        if self._rebuffering:
            self._underrun()  # the old stream ran dry before the new one came: playout re-buffers
        self._reset()

    # --------------------------------------------------------------------------------------------- push

    def push(self, ext_ts: int, payload: bytes, *, in_order: bool = True) -> int:
        """Store one packet's payload (extended timestamp); returns STORED, LATE, DUPLICATE or RESYNCED."""
        state = self._state
        status = STORED
        if state != _PLAYING:
            if self._played_end is not None and ext_ts < self._played_end:
                self.late += 1
                return LATE
            if state == _REBUFFER and self._rebuffering and self._resumes(ext_ts):
                pass  # on the timeline it had: stored below, in PLAYING
            elif state != _PREFILL:
                if self._rebuffering:
                    self._underrun()
                self._anchor_at(ext_ts)
        rel = ext_ts - self._anchor
        unit = rel // self._unit_samples
        unit_bytes = self._unit_bytes
        count = len(payload) // unit_bytes if unit_bytes else 1
        nxt = self._next
        if unit < nxt and self._state == _PREFILL:
            # Nothing played yet: an earlier packet arriving second extends the buffer backwards.
            nxt = self._next = unit - unit % self._upf
        horizon = self.config.horizon_ms // self._unit_ms
        if unit - nxt > horizon or (in_order and nxt - unit > horizon):
            self.resyncs += 1
            self._anchor_at(ext_ts)
            unit = nxt = 0
            status = RESYNCED
        if unit + count <= nxt:
            self.late += 1
            return LATE
        slots = self._slots
        upf = self._upf
        if (
            count == upf
            and unit % upf == 0
            and unit not in slots
            and (not unit_bytes or len(payload) == self._frame_bytes)
        ):
            # The common case: one whole, frame-aligned packet, stored without slicing.
            slots[unit] = payload
            for k in range(1, upf):
                slots.setdefault(unit + k, _COVERED)
            last = unit + upf - 1
        else:
            stored = False
            for k in range(count):
                idx = unit + k
                if idx < nxt or idx in slots:
                    continue
                slots[idx] = payload if not unit_bytes else payload[k * unit_bytes : (k + 1) * unit_bytes]
                stored = True
            if not stored:
                self.duplicates += 1
                return DUPLICATE
            last = unit + count - 1
        if last > self._high:
            self._high = last
        return status

    def _resumes(self, ext_ts: int) -> bool:
        """After a frame found missing with nothing newer: if this packet is for a frame not yet due, the gap
        was a loss and playout resumes where it was (the frames popped since were concealed in place)."""
        due = self._next + self._rebuffering * self._upf
        unit = (ext_ts - self._anchor) // self._unit_samples
        if not due <= unit <= due + self.config.horizon_ms // self._unit_ms:
            return False
        if self._fec and self._rebuffering == 1 and unit == due and not self._debt:
            # One frame lost, and the next packet (its FEC) came just after that frame's turn: a frame more of
            # delay, inserted in the next pause, lets the next packet serve the next such loss. A longer gap (a
            # burst lost, or telephone events in place of audio) is not one FEC would have mended.
            self._grow = True
            self._due = 0
            self._quiet_run = 0
            self._heard_quiet = False
        self._next = due
        self._state = _PLAYING
        self._rebuffering = 0
        return True

    def _underrun(self) -> None:
        self.underruns += 1
        self._hold = self.config.shrink_hold_frames
        self._due = 0
        self._rebuffering = 0

    def _anchor_at(self, ext_ts: int) -> None:
        self._slots.clear()
        self._anchor = ext_ts
        self._next = 0
        self._high = -1
        self._state = _PREFILL
        self._min_span = 1 << 30
        self._window = 0
        self._due = 0
        self._debt = 0
        self._rebuffering = 0
        self._grow = False

    def skip(self, frames: int) -> None:
        """The tick skipped ``frames`` pops (a stall): owe that many frames, dropped in the caller's next pause."""
        if frames > 0 and self._state == _PLAYING:
            self._debt = min(self._debt + frames, self.config.horizon_ms // 20)
        elif frames > 0 and self._rebuffering:
            self._rebuffered(frames)

    def _rebuffered(self, frames: int) -> None:
        """``frames`` more of a gap's frames went by; once it outlasts concealment, it is an underrun."""
        self._rebuffering += frames
        if self._rebuffering > self.config.max_conceal_frames:
            self._underrun()

    # ---------------------------------------------------------------------------------------------- pop

    def adapt(self, jitter_ts: float, received: int, clock_rate: int) -> None:
        """Recompute the target delay from the A.8 jitter estimate (timestamp units)."""
        cfg = self.config
        if received < cfg.warmup_packets:
            target = cfg.start_delay_ms
        else:
            wanted = 20.0 + cfg.jitter_factor * jitter_ts * 1000.0 / clock_rate
            unit_ms = self._unit_ms
            target = int(-(-wanted // unit_ms)) * unit_ms
        self.target_ms = min(cfg.max_delay_ms, max(cfg.min_delay_ms, target))

    def pop(self) -> bytes | None:
        """The next 20 ms frame's payload, or None (see ``status``: CONCEALED or SILENT)."""
        self.fec_payload = None
        state = self._state
        if state == _PREFILL and (self._high + 1 - self._next) * self._unit_ms >= self.target_ms:
            self._state = state = _PLAYING
        if state != _PLAYING:
            if self._rebuffering:
                self._rebuffered(1)
            self._gap_frame()
            return None
        slots = self._slots
        nxt = self._next
        upf = self._upf
        if self._grow and self._grown_in_pause(nxt):
            return None
        first = slots.pop(nxt, None)
        if upf == 1 or (first is not None and len(first) == self._frame_bytes):
            payload = first
            for k in range(1, upf):
                slots.pop(nxt + k, None)
        else:
            parts = [first]
            parts.extend(slots.pop(nxt + k, None) for k in range(1, upf))
            payload = _assemble(parts)
        if payload is None:
            if self._high >= nxt + upf:
                self._next = nxt + upf
                fec = slots.get(nxt + upf)
                self.fec_payload = fec if fec else None
            else:
                self._state = _REBUFFER
                self._rebuffering = 0
                self._rebuffered(1)
            self._gap_frame()
            return None
        nxt += upf
        self._next = nxt
        self._played_end = self._anchor + nxt * self._unit_samples
        self._gap = 0
        self.played += 1
        self.status = PLAYED
        self._shrink(nxt, payload)
        return payload

    def _gap_frame(self) -> None:
        # A gap right after audio is concealed (PLC fades it out); a long one is the sender pausing: silence.
        if self._gap < self.config.max_conceal_frames:
            self._gap += 1
            self.concealed += 1
            self.status = CONCEALED
        else:
            self.status = SILENT

    def _shrink(self, nxt: int, played: bytes) -> None:
        if self._due or self._debt or self._grow:
            quiet = self._quiet
            # Without a payload test the level comes from heard(), one frame behind: the run is just as long.
            played_quiet = quiet(played) if quiet is not None else self._heard_quiet
            self._quiet_run = self._quiet_run + 1 if played_quiet else 0
        if self._debt:
            nxt = self._pay_debt(nxt)
        if self._hold:  # the window starts afresh after it: the underrun's re-anchor reset it, and nothing since
            self._hold -= 1
            return
        span_ms = (self._high + 1 - nxt) * self._unit_ms
        if self._due:
            self._drop_in_pause(nxt, span_ms)
            return
        if span_ms < self._min_span:
            self._min_span = span_ms
        self._window += 1
        if self._window < self.config.shrink_window_frames:
            return
        if self._min_span >= self.target_ms:
            self._due = self.config.shrink_wait_frames
            self._quiet_run = 0
            self._heard_quiet = False
        self._min_span = 1 << 30
        self._window = 0

    def _pay_debt(self, nxt: int) -> int:
        """In a pause, drop the quiet whole frames that follow, up to the debt, keeping the target buffered."""
        if self._quiet_run < self.config.shrink_pause_frames:
            return nxt
        quiet = self._quiet
        slots = self._slots
        upf = self._upf
        target_units = self.target_ms // self._unit_ms
        while self._debt:
            if self._high + 1 - nxt - upf < target_units:
                self._debt = 0  # the excess is gone (the sender slowed down, or the rest was paid)
                break
            if not self._quiet_frame(slots.get(nxt)):
                break  # a gap, half a frame or speech: not here
            self._drop(nxt)
            self._debt -= 1
            nxt += upf
            if quiet is None:
                break  # judged by the level of the frame heard: one frame per tick
        return nxt

    def _grown_in_pause(self, nxt: int) -> bool:
        """A frame of delay is owed: once the caller is in a pause, play a concealed frame in place of the next."""
        cfg = self.config
        if not self._in_pause(self._slots.get(nxt)):
            return False
        self._grow = False
        if (self._high + 1 - nxt) * self._unit_ms + 20 > cfg.max_delay_ms:
            return False
        self._hold = cfg.shrink_hold_frames  # as after an underrun: the shrink would give the frame back at once
        self.inserted += 1
        self.status = CONCEALED
        return True

    def _in_pause(self, following: bytes | None) -> bool:
        """The caller is in a pause (``shrink_pause_frames`` quiet frames played) and ``following`` is quiet too."""
        return self._quiet_run >= self.config.shrink_pause_frames and self._quiet_frame(following)

    def _quiet_frame(self, following: bytes | None) -> bool:
        """``following`` is a whole frame the caller would not miss; without a payload test (Opus) the run of
        quiet frames heard before it has to say so."""
        if not following:  # a gap, or half a frame
            return False
        return self._quiet is None or self._quiet(following)

    @property
    def wants_level(self) -> bool:
        """Waiting for a pause (a due shrink, a debt, a frame to insert) and only the decoded audio can tell one:
        report heard()."""
        return (self._due > 0 or self._debt > 0 or self._grow) and self._quiet is None

    def heard(self, quiet: bool) -> None:
        """Whether the frame just played was quiet, judged from its decoded audio (codecs without a quiet test)."""
        self._heard_quiet = quiet

    def _drop_in_pause(self, nxt: int, span_ms: int) -> None:
        """A shrink is due: drop the next frame once a pause is reached (or the wait is over)."""
        if span_ms < self.target_ms:  # the excess drained by itself (the sender slowed down): keep every frame
            self._due = 0
            return
        self._due -= 1
        following = self._slots.get(nxt)
        if not following:  # a gap or half a frame: nothing whole to drop here
            return
        if not self._due or self._in_pause(following):
            self._due = 0
            self._drop(nxt)

    def _drop(self, nxt: int) -> None:
        slots = self._slots
        for k in range(self._upf):
            slots.pop(nxt + k, None)
        self._next = nxt + self._upf
        self.discarded += 1

    # ---------------------------------------------------------------------------------------- reading

    @property
    def buffered_ms(self) -> int:
        """Audio buffered ahead of the playout point (including gaps not yet played)."""
        return max(0, self._high + 1 - self._next) * self._unit_ms

    @property
    def playing(self) -> bool:
        return self._state == _PLAYING

    def last_played(self) -> tuple[int, int] | None:
        """The extended RTP timestamps [start, end) of the last frame played from received audio, if any."""
        end = self._played_end
        return None if end is None else (end - self._unit_samples * self._upf, end)


def _assemble(parts: list[bytes | None]) -> bytes | None:
    """Join a frame's units; a missing unit repeats a present neighbour. None if every unit is missing."""
    present = [p for p in parts if p]
    if not present:
        return None
    filler = present[0]
    return b"".join(p if p else filler for p in parts)
