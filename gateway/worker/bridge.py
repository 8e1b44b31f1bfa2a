"""Two SIP legs' audio joined through the media tick, the agent out of the path (warm transfer, ADR 0041).

Each leg's decoded 24 kHz inbound frame is handed, one tick later, to the other leg's encoder: the tick's inbound
half stores it (:meth:`Bridge.heard`), the next tick's outbound half takes it (:meth:`Bridge.frame_for`). A frame
carries the leg's G.711 codes too when its codec is G.711, so two G.711 legs pass codes (through the 256-entry
law table when the laws differ) and only other codecs are resampled and encoded: that is the transcoding.

Each frame is handed on once: a leg that stops sending gives the other silence, not its last frame again (the
sending leg's jitter buffer conceals its own short losses before the frame gets here).

Digits cross too: an out-of-band digit (RFC 4733 or SIP INFO) from one leg is sent to the other the way that leg
takes digits (the worker counts them in ``digits``); an in-band tone is audio and crosses as audio.

Compiled with the tick (gateway/compiled): plain slots, no I/O, no clock.
"""

from __future__ import annotations

from typing import final

from telcodecs.frames import Frame


@final
class Bridge:
    """Caller leg ``a`` and human leg ``b``. ``joined`` is False while the human is briefed: their audio is
    taken (and dropped) but neither leg is sent the other's yet; the caller hears the hold audio, the human the
    briefing."""

    __slots__ = ("_from_a", "_from_b", "a", "b", "digits", "frames", "joined")

    def __init__(self, a: str, b: str) -> None:
        if a == b:
            raise ValueError("a bridge joins two different legs")
        self.a = a
        self.b = b
        self.joined = False
        self.frames = 0  # frames handed from one leg to the other
        self.digits = 0  # out-of-band digits sent on from one leg to the other
        self._from_a: Frame | None = None
        self._from_b: Frame | None = None

    def heard(self, call_id: str, frame: Frame) -> None:
        """``call_id``'s inbound frame of this tick, for the other leg's next outbound frame."""
        if not self.joined:
            return
        if call_id == self.a:
            self._from_a = frame
        elif call_id == self.b:
            self._from_b = frame

    def frame_for(self, call_id: str) -> Frame | None:
        """What ``call_id`` is sent this tick: the other leg's last frame, once; None (silence) otherwise."""
        if call_id == self.a:
            frame, self._from_b = self._from_b, None
        elif call_id == self.b:
            frame, self._from_a = self._from_a, None
        else:
            return None
        if frame is not None:
            self.frames += 1
        return frame

    def other(self, call_id: str) -> str:
        return self.b if call_id == self.a else self.a
