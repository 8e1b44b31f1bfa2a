"""Early media's frames on the media tick (sans-I/O): the ringback tone, and one call's early media as the tick
sees it. The worker's glue (gateway/worker/early_media.py, which documents the behaviour) makes and removes it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from telcodecs.frames import FRAME_SAMPLES, SAMPLE_RATE, Frame, unchecked_frame

RINGBACK_HZ = 425.0
RINGBACK_ON_S, RINGBACK_OFF_S = 1.0, 4.0
RINGBACK_DBFS = -14.0
GREETING_DONE_S = 0.4  # silence after the greeting's audio that ends the greeting's early media
_FRAME_S = FRAME_SAMPLES / SAMPLE_RATE


def ringback_frames() -> tuple[Frame, ...]:
    """One cadence of the ringback tone (1 s of 425 Hz, 4 s of silence) as 20 ms frames at 24 kHz."""
    on = int(RINGBACK_ON_S * SAMPLE_RATE)
    total = int((RINGBACK_ON_S + RINGBACK_OFF_S) * SAMPLE_RATE)
    t = np.arange(on) / SAMPLE_RATE
    amplitude = 32767 * 10 ** (RINGBACK_DBFS / 20)
    pcm = np.zeros(total, dtype=np.int16)
    pcm[:on] = (amplitude * np.sin(2 * np.pi * RINGBACK_HZ * t)).astype(np.int16)
    pcm.flags.writeable = False
    return tuple(
        unchecked_frame(i, pcm[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES]) for i in range(total // FRAME_SAMPLES)
    )


class EarlyMedia:
    """One call's early media as the tick sees it: the frames to send (``plays``: ours, else the session's), the
    caller's frames received (counted, never passed on) and, for a greeting, when its audio has played out."""

    __slots__ = ("_at", "_frames", "_on_done", "_silent", "heard", "sent")

    def __init__(self, frames: tuple[Frame, ...] = (), *, on_done: Callable[[], None] | None = None) -> None:
        self._frames = frames
        self._at = 0
        self._on_done = on_done
        self._silent = 0
        self.heard = 0  # frames received from the far end before the 200 OK
        self.sent = 0  # frames with audio sent to it

    @property
    def plays(self) -> bool:
        """True: the tick sends :meth:`next_frame`; False: the session's (a greeting), through :meth:`sending`."""
        return bool(self._frames)

    def next_frame(self, index: int) -> Frame:
        frames = self._frames
        frame = frames[self._at % len(frames)]
        self._at += 1
        self.sent += 1
        return unchecked_frame(index, frame.pcm)

    def sending(self, frame: object) -> None:
        """The session's frame of this tick (None: silence); a greeting ends after GREETING_DONE_S of silence."""
        if frame is not None:
            self.sent += 1
            self._silent = 0
            return
        if self.sent:
            self._silent += 1
            if self._on_done is not None and self._silent * _FRAME_S >= GREETING_DONE_S:
                done, self._on_done = self._on_done, None
                done()

    def received(self, frame: Frame) -> None:
        self.heard += 1
