"""Repeat-and-fade packet-loss concealment for the rows of a batch (the tick's G.711 and G.722 calls).

Owns: :class:`RepeatAndFade`, the concealment history of one batch: per row (a call's stable inbound row), the
last frame that was played and how many frames have been concealed since. A missing frame is the last played
one under a linear fade that is continuous across frame edges and reaches silence after ``fade_frames`` frames;
a frame the jitter buffer reports as silence (not a loss) is silence at once. Pure numpy, no I/O, no clock.
"""

from __future__ import annotations

from typing import final

import numpy as np
import numpy.typing as npt

from gateway.media import jitter


@final
class RepeatAndFade:
    """Concealment history of a batch whose rows are ``samples`` long."""

    __slots__ = ("_gap", "_last", "_ramp", "fade_frames", "samples")

    def __init__(self, *, samples: int, fade_frames: int) -> None:
        self.samples = samples
        self.fade_frames = fade_frames
        self._ramp = (np.arange(1, samples + 1, dtype=np.float32) / samples)[None, :]
        self._last = np.zeros((64, samples), dtype=np.int16)
        self._gap = np.zeros(64, dtype=np.int32)

    def open(self, row: int) -> None:
        """A new call on ``row``: nothing heard yet, so a gap is silence."""
        if row >= self._last.shape[0]:
            grow = max(row + 1, 2 * self._last.shape[0])
            self._last = np.resize(self._last, (grow, self.samples))
            self._gap = np.resize(self._gap, grow)
        self._last[row] = 0
        self._gap[row] = self.fade_frames

    def played(self, rows: npt.NDArray[np.intp], pcm: npt.NDArray[np.int16]) -> None:
        """``pcm[k]`` was played on ``rows[k]``: the history a later loss repeats."""
        self._last[rows] = pcm
        self._gap[rows] = 0

    def conceal(
        self,
        pcm: npt.NDArray[np.int16],
        rows: npt.NDArray[np.intp],
        status: npt.NDArray[np.int8],
        played: npt.NDArray[np.bool_],
    ) -> None:
        """Fill the rows of ``pcm`` that were not ``played``: concealment where the jitter buffer says the frame
        was lost (``jitter.CONCEALED``), silence otherwise."""
        idx = np.flatnonzero(~played)
        missing_rows = rows[idx]
        gap = self._gap[missing_rows]
        concealing = status[idx] == jitter.CONCEALED
        step = 1.0 / self.fade_frames
        g0 = np.clip(1.0 - gap * step, 0.0, 1.0).astype(np.float32)
        g1 = np.clip(g0 - step, 0.0, 1.0).astype(np.float32)
        g0[~concealing] = 0.0
        g1[~concealing] = 0.0
        ramp = g0[:, None] + (g1 - g0)[:, None] * self._ramp
        pcm[idx] = (self._last[missing_rows] * ramp).astype(np.int16)
        self._gap[missing_rows] = np.where(concealing, gap + 1, self.fade_frames)
