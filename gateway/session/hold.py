"""Hold: what the session does while the caller is on hold, by their phone or by the gateway.

A call is held by the caller (their phone re-INVITEs with a=sendonly or a=inactive: RFC 3264 §8.4) or by the
gateway (the ops API or the agent's ``hold_caller`` tool: our re-INVITE with a=sendonly). Either way, while held:

- the agent's playout is paused, not drained: the tick takes no frame from it, so nothing is counted as sent
  that the caller was not sent, and the frames stay queued; on unhold playout continues with the next frame,
  where the caller left off. A barge-in after the unhold therefore truncates at exactly what the caller heard.
- the provider is told, so that it does not talk into the hold: the response it is generating (if any) is
  cancelled, keeping the audio it already delivered (it plays after the unhold; a truncate follows only if the
  caller cuts in), and a system note says the caller is on hold; another says when they are back. A reply the
  provider starts during the hold anyway (a tool result) is queued like any other and plays after the unhold.
- caller audio is not sent to the provider (what a held phone sends, if anything, is its hold music), and the
  no-input timer does not run.
- on a gateway hold the caller hears the hold audio (``SessionConfig.hold_audio``, looped; a soft tone when it
  is empty), which is not agent audio and is never counted as sent.

A hold by one side and a hold by the other are one hold: the first starts it and the matching resume ends it
(a caller's phone cannot take off a hold the gateway placed, and the other way round).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from gateway.session.playout import comfort_tone_frame
from telcodecs.frames import FRAME_BYTES, FRAME_SAMPLES, Pcm

HoldBy = Literal["caller", "gateway"]

HOLD_NOTE = "The caller is now on hold and cannot hear you. Say nothing until they are back."
RESUME_NOTE = "The caller is back from hold and can hear you again."

_TONE_PERIOD = 100  # frames: the built-in hold tone plays 400 ms every 2 s
_TONE_ON = 20


@dataclass(frozen=True, slots=True, kw_only=True)
class HoldStarted:
    """What :meth:`HoldState.hold` decided: who holds, and the response to cancel (None: none was running)."""

    by: HoldBy
    cancel_response: str | None


class HoldState:
    """Whether the call is held and by whom, and the hold audio of a gateway hold. Synchronous, O(1) a tick."""

    def __init__(self, hold_audio: bytes = b"") -> None:
        whole = len(hold_audio) // FRAME_BYTES * FRAME_BYTES
        self._audio = hold_audio[:whole]
        self._frames = whole // FRAME_BYTES
        self._tone = comfort_tone_frame()
        self._silence: Pcm = np.zeros(FRAME_SAMPLES, dtype=np.int16)
        self.by: HoldBy | None = None
        self.since: float | None = None
        self._position = 0
        self.holds = 0

    @property
    def held(self) -> bool:
        return self.by is not None

    def hold(self, by: HoldBy, *, now: float, active_response: str | None) -> HoldStarted | None:
        """Start a hold; None when the call is held already (by either side)."""
        if self.by is not None:
            return None
        self.by, self.since, self._position = by, now, 0
        self.holds += 1
        return HoldStarted(by=by, cancel_response=active_response)

    def resume(self, by: HoldBy, *, now: float) -> float | None:
        """End a hold placed by ``by``; the seconds it lasted, or None when ``by`` holds nothing."""
        if self.by != by or self.since is None:
            return None
        held_s = now - self.since
        self.by = self.since = None
        return held_s

    def frame(self) -> Pcm | None:
        """This tick's hold audio (gateway holds only; None for a caller's hold, whose phone sends us nothing)."""
        if self.by != "gateway":
            return None
        position = self._position
        self._position += 1
        if self._frames:
            start = (position % self._frames) * FRAME_BYTES
            return np.frombuffer(self._audio, dtype="<i2", count=FRAME_SAMPLES, offset=start)
        return self._tone if position % _TONE_PERIOD < _TONE_ON else self._silence
