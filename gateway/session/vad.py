"""A small energy VAD on caller frames, for providers without server-side VAD (capabilities.server_vad False).

Speech starts after ``start_ms`` of consecutive frames at or above the threshold and stops after ``hangover_ms``
of frames below it. One RMS per 20 ms frame: a few microseconds inside the media tick.
"""

from __future__ import annotations

from typing import Literal

from gateway.session.config import LocalVadConfig
from telcodecs.frames import FRAME_MS, Pcm, dbfs


class EnergyVad:
    def __init__(self, config: LocalVadConfig) -> None:
        self._threshold = config.threshold_dbfs
        self._start_frames = config.start_ms // FRAME_MS
        self._hangover_frames = config.hangover_ms // FRAME_MS
        self._loud = 0
        self._quiet = 0
        self.speaking = False

    def feed(self, pcm: Pcm) -> Literal["started", "stopped"] | None:
        """Feed one frame; returns the transition it caused, if any."""
        if dbfs(pcm) >= self._threshold:
            self._loud += 1
            self._quiet = 0
            if not self.speaking and self._loud >= self._start_frames:
                self.speaking = True
                return "started"
            return None
        self._loud = 0
        if self.speaking:
            self._quiet += 1
            if self._quiet >= self._hangover_frames:
                self.speaking = False
                self._quiet = 0
                return "stopped"
        return None
