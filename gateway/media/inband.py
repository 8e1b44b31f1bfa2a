"""In-band DTMF for calls that negotiated no telephone-event: key presses heard in, and played into, the audio.

A call whose peer takes neither RFC 4733 nor SIP INFO gets its outbound digits as tones: :meth:`InbandDtmf.queue`
renders them (:func:`telcodecs.dtmf.tone`, each press followed by a pause), and the tick sends
:meth:`InbandDtmf.next_frame` in place of the agent's frame while tones are pending, as an RFC 4733 packet
replaces the audio packet. Inbound, :meth:`InbandDtmf.heard` runs the caller's 24 kHz frames through the
Goertzel detector (:class:`telcodecs.dtmf.GoertzelDetector`, whose acceptance rules keep speech from reading as
digits); it is made only for calls without telephone-event, the others' digits arrive as events.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

from telcodecs.dtmf import GoertzelDetector, tone
from telcodecs.frames import FRAME_SAMPLES, SAMPLE_RATE, Frame, unchecked_frame

__all__ = ["InbandDtmf"]

TONE_MS: Final = 100  # one press, as the RFC 4733 sender's default
PAUSE_MS: Final = 60  # between presses: Q.24 asks for at least 40 ms
_PAUSE: Final = np.zeros(SAMPLE_RATE * PAUSE_MS // 1000, dtype=np.int16)


class InbandDtmf:
    """One call's in-band DTMF state: a detector for the caller's audio (or None) and the tones still to play."""

    __slots__ = ("_detector", "_pending", "_played")

    def __init__(self, *, detect: bool) -> None:
        self._detector = GoertzelDetector(SAMPLE_RATE) if detect else None
        self._pending = np.zeros(0, dtype=np.int16)
        self._played = 0

    @property
    def detecting(self) -> bool:
        return self._detector is not None

    @property
    def sending(self) -> bool:
        """Tones are queued: the tick sends :meth:`next_frame` instead of the agent's frame."""
        return self._pending.size > 0

    def queue(self, digits: str, *, duration_ms: int = TONE_MS) -> None:
        """Render digits as tones after those already queued (DtmfError for a digit that is not one)."""
        parts = [self._pending]
        for digit in digits:
            parts.append(tone(digit, duration_ms=duration_ms, sample_rate=SAMPLE_RATE))
            parts.append(_PAUSE)
        self._pending = np.concatenate(parts)

    def next_frame(self) -> Frame:
        """The next 20 ms of tones (the last one padded with silence)."""
        chunk = self._pending[:FRAME_SAMPLES]
        self._pending = self._pending[FRAME_SAMPLES:]
        if chunk.size < FRAME_SAMPLES:
            chunk = np.concatenate([chunk, np.zeros(FRAME_SAMPLES - chunk.size, dtype=np.int16)])
        chunk.flags.writeable = False
        self._played += 1
        return unchecked_frame(self._played - 1, chunk)

    def heard(self, pcm: npt.NDArray[np.int16]) -> list[str]:
        """Digits completed by this frame of the caller's audio (none on a call that does not detect)."""
        if self._detector is None:
            return []
        return [press.digit for press in self._detector.feed(pcm)]
