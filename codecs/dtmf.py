"""DTMF (ITU-T Q.23) tone generation and in-band detection (after ITU-T Q.24 acceptance rules).

This module owns the 16 DTMF digits as audio: :func:`tone` makes a key press and
:class:`GoertzelDetector` finds key presses in a stream of PCM of any chunk size (frames of 20 ms, one
sample at a time, or a whole file: the result is the same). Out-of-band DTMF (RFC 4733 telephone-events)
is the media layer's; this is for callers whose DTMF arrives as audio.

Detection works on blocks of 25.6 ms (205 samples at 8 kHz, scaled to the rate) taken every 12.8 ms.
Each block is tested at the eight Q.23 frequencies with the Goertzel single-bin DFT (evaluated for all
eight at once as one matrix product, which yields exactly the Goertzel bin values). A block is a hit
for a digit when

* both its row and column tone are above -36 dBFS (energy check),
* each is at least 8 dB above the other tones of its group (no other key, no broadband sound),
* the column tone is between 8 dB weaker and 4 dB stronger than the row tone (twist, Q.24 limits),
* the two tones carry at least 70 % of the block's energy (speech and noise spread theirs).

A key press is reported once, when two consecutive blocks hit the same digit (about 38 ms of tone);
the detector re-arms after two blocks without that digit, so a held key is one event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

__all__ = ["DTMF_DIGITS", "DtmfError", "DtmfToneDetected", "GoertzelDetector", "frequencies", "tone"]

DTMF_DIGITS: Final = "0123456789*#ABCD"
ROW_HZ: Final = (697.0, 770.0, 852.0, 941.0)
COLUMN_HZ: Final = (1209.0, 1336.0, 1477.0, 1633.0)
_KEYPAD: Final = ("123A", "456B", "789C", "*0#D")

_BLOCK_S: Final = 205 / 8000  # the classic 8 kHz Goertzel block, scaled to other rates
_MIN_TONE_DBFS: Final = -36.0
_GROUP_MARGIN_DB: Final = 8.0
_TWIST_MIN_DB: Final = -8.0  # column tone weaker than the row tone (the usual case on lines)
_TWIST_MAX_DB: Final = 4.0
_TONE_SHARE: Final = 0.7
_HITS_TO_REPORT: Final = 2
_MISSES_TO_REARM: Final = 2


class DtmfError(ValueError):
    """Unknown digit or bad tone parameters."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DtmfToneDetected:
    """One key press heard in-band.

    ``sample_index`` counts samples from the start of the stream fed to the detector and marks the start
    of the first block that hit; ``level_dbfs`` is the row tone's RMS level.
    """

    digit: str
    sample_index: int
    level_dbfs: float


def frequencies(digit: str) -> tuple[float, float]:
    """(row Hz, column Hz) of a digit."""
    for row, keys in enumerate(_KEYPAD):
        column = keys.find(digit.upper()) if len(digit) == 1 else -1
        if column >= 0:
            return ROW_HZ[row], COLUMN_HZ[column]
    raise DtmfError(f"not a DTMF digit: {digit!r} (digits are {DTMF_DIGITS})")


def tone(digit: str, *, duration_ms: int, sample_rate: int, level_dbfs: float = -10.0) -> npt.NDArray[np.int16]:
    """A key press: the digit's two sines, each at ``level_dbfs`` RMS (as :func:`telcodecs.frames.dbfs`).

    The edges get a 2 ms raised-cosine ramp so the press does not splatter energy across the band.
    """
    if duration_ms <= 0 or sample_rate <= 0:
        raise DtmfError("duration_ms and sample_rate must be positive")
    if level_dbfs > -6.03:
        raise DtmfError("level_dbfs above -6 dBFS per tone would clip the sum of two tones")
    low, high = frequencies(digit)
    n = sample_rate * duration_ms // 1000
    t = np.arange(n) / sample_rate
    amplitude = 32768.0 * np.sqrt(2.0) * 10.0 ** (level_dbfs / 20.0)
    signal = amplitude * (np.sin(2 * np.pi * low * t) + np.sin(2 * np.pi * high * t))
    ramp = min(n // 2, sample_rate * 2 // 1000)
    if ramp:
        edge = 0.5 - 0.5 * np.cos(np.pi * np.arange(ramp) / ramp)
        signal[:ramp] *= edge
        signal[n - ramp :] *= edge[::-1]
    pcm: npt.NDArray[np.int16] = np.clip(np.rint(signal), -32768, 32767).astype(np.int16)
    return pcm


class GoertzelDetector:
    """Streaming in-band DTMF detector for one call direction at ``sample_rate``."""

    __slots__ = (
        "_basis",
        "_block",
        "_buffer",
        "_candidate",
        "_consumed",
        "_hits",
        "_hop",
        "_min_energy",
        "_misses",
        "_reported",
    )

    def __init__(self, sample_rate: int) -> None:
        if sample_rate < 4000:
            raise DtmfError(f"sample_rate {sample_rate} is too low for DTMF (highest tone 1633 Hz)")
        self._block = round(sample_rate * _BLOCK_S)
        self._hop = self._block // 2
        n = np.arange(self._block)
        freqs = np.array(ROW_HZ + COLUMN_HZ)
        # The Goertzel bin at f is the DFT of the block at f; all eight as one (block, 8) complex basis.
        self._basis = np.exp(-2j * np.pi * np.outer(n, freqs) / sample_rate)
        full_scale_sine_energy = (32768.0**2) / 2 * self._block
        self._min_energy = full_scale_sine_energy * 2 * 10.0 ** (_MIN_TONE_DBFS / 10.0)
        self._buffer = np.zeros(0, dtype=np.float64)
        self._consumed = 0  # stream index of self._buffer[0]
        self._candidate = ""
        self._hits = 0
        self._misses = 0
        self._reported = ""

    def feed(self, pcm: npt.NDArray[np.int16]) -> list[DtmfToneDetected]:
        """Add samples; returns the key presses completed by them (usually none)."""
        if pcm.ndim != 1:
            raise DtmfError("feed() needs 1-D PCM")
        self._buffer = np.concatenate([self._buffer, pcm.astype(np.float64)])
        events: list[DtmfToneDetected] = []
        while self._buffer.shape[0] >= self._block:
            block = self._buffer[: self._block]
            digit, level = self._classify(block)
            event = self._advance(digit, level)
            if event is not None:
                events.append(event)
            self._buffer = self._buffer[self._hop :]
            self._consumed += self._hop
        return events

    def _classify(self, block: npt.NDArray[np.float64]) -> tuple[str, float]:
        total = float(block @ block)
        # Energy of a sine with bin magnitude |X| over the block is 2|X|^2 / N.
        energies = 2.0 * np.abs(block @ self._basis) ** 2 / self._block
        rows, columns = energies[:4], energies[4:]
        r, c = int(np.argmax(rows)), int(np.argmax(columns))
        row_e, col_e = float(rows[r]), float(columns[c])
        if row_e < self._min_energy / 2 or col_e < self._min_energy / 2:
            return "", 0.0
        margin = 10.0 ** (_GROUP_MARGIN_DB / 10.0)
        if np.delete(rows, r).max() * margin > row_e or np.delete(columns, c).max() * margin > col_e:
            return "", 0.0
        twist_db = 10.0 * np.log10(col_e / row_e)
        if not _TWIST_MIN_DB <= twist_db <= _TWIST_MAX_DB:
            return "", 0.0
        if row_e + col_e < _TONE_SHARE * total:
            return "", 0.0
        level = 10.0 * np.log10(row_e / self._block / 32768.0**2)
        return _KEYPAD[r][c], float(level)

    def _advance(self, digit: str, level: float) -> DtmfToneDetected | None:
        if self._reported:
            if digit == self._reported:
                self._misses = 0  # the key is still held
                return None
            self._misses += 1
            if self._misses >= _MISSES_TO_REARM:
                self._reported = ""
        if digit:
            self._hits = self._hits + 1 if digit == self._candidate else 1
            self._candidate = digit
        else:
            self._candidate, self._hits = "", 0
        if digit and self._hits >= _HITS_TO_REPORT and not self._reported:
            self._reported, self._misses = digit, 0
            start = self._consumed - (self._hits - 1) * self._hop
            return DtmfToneDetected(digit=digit, sample_index=start, level_dbfs=level)
        return None
