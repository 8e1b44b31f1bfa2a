"""Packet-loss concealment by pitch-synchronous waveform substitution (after ITU-T G.711 Appendix I).

This module owns concealment for decoders that cannot conceal by themselves: G.711, and Opus as carried
by PyAV (FFmpeg's libopus wrapper treats an empty packet as end of stream and exposes neither libopus PLC
nor ``decode_fec``; see docs/adr/0004-opus-packet-loss.md). It keeps the last 40 ms of decoded audio:

* :meth:`Concealer.conceal` finds the pitch period of the recent history (normalized autocorrelation over
  2.5..15 ms, the range G.711 Appendix I searches), repeats the last period cyclically, overlap-adds a
  quarter period at the seam, and fades: full level for the first 10 ms of a loss, then 20 % less per
  10 ms, silence after 60 ms, as Appendix I does;
* :meth:`Concealer.observe` is called with every really decoded frame. After a loss it cross-fades the
  first 2.5 ms of the new frame from the concealment continuation, so the loss leaves no click;
* :meth:`Concealer.bridge` fills a lost frame when the *next* frame is already known: a forward
  continuation of the past and a backward periodic extension of the next frame, cross-faded over the gap.

Pure numpy on int16 arrays: 1-D for mono, (samples, channels) otherwise; no state other than the history,
the repeated period and the loss counter. The history is kept as the int16 samples that were played, so a frame
observed outside a loss costs one copy into it; the float work (pitch search, continuation, fades) runs only
when a frame is missing. The pitch search scores every candidate lag in one correlation.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

__all__ = ["Concealer"]

_HISTORY_MS: Final = 40
_PITCH_MIN_MS: Final = 2.5
_PITCH_MAX_MS: Final = 15.0
_FULL_LEVEL_MS: Final = 10.0
_FADE_PER_10MS: Final = 0.2
_SEAM_MS: Final = 2.5


class Concealer:
    """Concealment state for one stream of ``channels`` interleaved channels at ``sample_rate``."""

    __slots__ = ("_channels", "_history", "_lost_samples", "_phase", "_rate", "_source")

    def __init__(self, *, sample_rate: int, channels: int = 1) -> None:
        self._rate = sample_rate
        self._channels = channels
        self._history = np.zeros((sample_rate * _HISTORY_MS // 1000, channels), dtype=np.int16)  # as played
        self._lost_samples = 0  # samples concealed since the last real frame
        self._source: npt.NDArray[np.float64] | None = None  # the repeated period during a loss
        self._phase = 0  # position inside the repeated period, carried across consecutive losses

    @property
    def in_loss(self) -> bool:
        return self._lost_samples > 0

    def observe(self, pcm: npt.NDArray[np.int16]) -> npt.NDArray[np.int16]:
        """Record a decoded frame (samples, channels); returns it, smoothed at the seam after a loss."""
        frame = pcm.reshape(-1, self._channels)
        if self._lost_samples:
            seam = min(frame.shape[0], int(self._rate * _SEAM_MS / 1000))
            tail = self._continue(seam)
            ramp = np.linspace(0.0, 1.0, seam, endpoint=False)[:, None]
            frame = frame.copy()
            frame[:seam] = _to_int16(tail * (1.0 - ramp) + frame[:seam] * ramp)
            self._lost_samples = 0
            self._source = None
        self._push(frame)
        return self._shape(frame)

    def conceal(self, samples: int) -> npt.NDArray[np.int16]:
        """``samples`` of concealment (samples, channels) for a missing frame."""
        out = self._continue(samples)
        out *= self._gains(samples)[:, None]
        self._lost_samples += samples
        played = _to_int16(out)
        self._push(played)
        return self._shape(played)

    def bridge(self, samples: int, following: npt.NDArray[np.int16]) -> npt.NDArray[np.int16]:
        """Fill a missing frame that sits right before ``following`` (samples, channels), already decoded."""
        forward = self._continue(samples) * self._gains(samples)[:, None]
        nxt = following.astype(np.float64).reshape(-1, self._channels)
        period = _pitch_period(nxt[: min(nxt.shape[0], 2 * self._max_lag())], self._rate) or nxt.shape[0]
        # Backward periodic extension: sample t of the gap (t = samples - 1 is just before `following`)
        # repeats following[(t - samples) mod period].
        index = (np.arange(samples) - samples) % period
        backward = nxt[index]
        ramp = np.linspace(0.0, 1.0, samples)[:, None]
        played = _to_int16(forward * (1.0 - ramp) + backward * ramp)
        self._push(played)
        self._lost_samples = 0  # the following frame is continuous with the bridge's end
        self._source = None
        return self._shape(played)

    # --- internals -------------------------------------------------------------------------------------

    def _shape(self, pcm: npt.NDArray[np.int16]) -> npt.NDArray[np.int16]:
        # Mono streams are 1-D in and out; multichannel ones (samples, channels).
        shaped: npt.NDArray[np.int16] = pcm.reshape(-1) if self._channels == 1 else pcm
        return shaped

    def _max_lag(self) -> int:
        return int(self._rate * _PITCH_MAX_MS / 1000)

    def _continue(self, samples: int) -> npt.NDArray[np.float64]:
        """The next ``samples`` of the periodic continuation of the history (no fade)."""
        glide_from: npt.NDArray[np.float64] | None = None  # the last real sample, at the start of a loss
        if self._source is None:
            history = self._history.astype(np.float64)
            period = _pitch_period(history, self._rate) or history.shape[0] // 2
            self._source = history[-period:]  # fixed for the whole loss
            self._phase = 0
            glide_from = history[-1]
        source = self._source
        period = source.shape[0]
        out: npt.NDArray[np.float64] = source[(self._phase + np.arange(samples)) % period]
        self._phase = (self._phase + samples) % period
        if glide_from is not None:
            # The repetition starts at the sample one period back; glide from the last real sample to it
            # over a quarter period so a pitch estimate that is slightly off leaves no step.
            seam = min(samples, max(1, period // 4))
            ramp = np.linspace(0.0, 1.0, seam, endpoint=False)[:, None]
            out[:seam] = glide_from * (1.0 - ramp) + out[:seam] * ramp
        return out

    def _gains(self, samples: int) -> npt.NDArray[np.float64]:
        t_ms = (self._lost_samples + np.arange(samples)) * 1000.0 / self._rate
        gains: npt.NDArray[np.float64] = np.clip(
            1.0 - _FADE_PER_10MS * np.maximum(0.0, t_ms - _FULL_LEVEL_MS) / 10.0, 0.0, 1.0
        )
        return gains

    def _push(self, frame: npt.NDArray[np.int16]) -> None:
        keep = self._history.shape[0]
        if frame.shape[0] >= keep:
            self._history = frame[-keep:].copy()
        else:
            self._history = np.concatenate([self._history[frame.shape[0] :], frame])


def _pitch_period(signal: npt.NDArray[np.float64], rate: int) -> int:
    """Pitch period in samples by normalized autocorrelation of the channel mean; 0 if no signal.

    The last ``hi`` samples are correlated with the ``hi`` samples ``lag`` earlier, for every lag in
    ``lo..hi``; the first lag with the highest score wins.
    """
    x = signal.mean(axis=1) if signal.ndim == 2 else signal
    lo = int(rate * _PITCH_MIN_MS / 1000)
    hi = min(int(rate * _PITCH_MAX_MS / 1000), x.shape[0] // 2)
    if hi <= lo or not np.any(x):
        return 0
    n, window = x.shape[0], hi
    tail = x[-window:]
    # The window `lag` samples back starts at n - window - lag: entry k of the correlation is lag hi - k.
    searched = x[n - window - hi : n - lo]
    dots = np.correlate(searched, tail, "valid")
    squares = np.concatenate(([0.0], np.cumsum(searched**2)))
    energies = squares[window:] - squares[:-window]  # past @ past for every row, from running sums
    denom = np.sqrt(np.maximum(float(tail @ tail) * energies, 0.0))
    scores = np.divide(dots, denom, out=np.zeros_like(dots), where=denom > 0)[::-1]  # lag lo first
    return lo + int(np.argmax(scores))


def _to_int16(x: npt.NDArray[np.float64]) -> npt.NDArray[np.int16]:
    return np.clip(np.rint(x), -32768, 32767).astype(np.int16)
