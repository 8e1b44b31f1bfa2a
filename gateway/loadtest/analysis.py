"""Audio analysis for the load tester: round-trip markers, echo correlation, summaries.

RTP receive statistics (loss, duplicates, RFC 3550 A.8 jitter) come from :mod:`gateway.media.reception`,
the same code the gateway uses for its own callers.

The marker is a short linear chirp mixed into the sent audio at a known media time. A matched filter
finds it in the returned audio; the distance between where it was sent and where it came back is the
audio round-trip latency (caller -> gateway -> agent -> gateway -> caller), measured in media samples so
that neither clock skew nor scheduling noise of the load generator enters the figure.

An adaptive jitter buffer on the way (the target's, for the caller's audio or for the agent's) drops or inserts
whole frames: when that lands inside the 60 ms marker, the chirp comes back in two pieces, and a frame dropped
from its middle leaves a matched-filter score of only 0.37-0.49, below the threshold, although the marker came
back. :func:`find_marker` with ``slips`` therefore also tries the marker as a head and a tail shifted against
each other by one slip; the match then reports that shift, and the caller counts it as a slip, not as a lost
marker.

A codec that keeps the sound but not the waveform bends the chirp: after two Opus passes (the caller's encoder,
then the target's) some markers score only 0.3-0.5 on the waveform, while the speech around them scores up to
0.3. :func:`find_marker` then looks for the marker's shape in time and frequency instead: the magnitude
spectrogram of the chirp (a rising line) against the received one's, which ignores phase. Over 360 markers
returned through two Opus passes that score was 0.83-0.99 (median 0.95), and nowhere in the speech around them
over 0.31.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import signal

Pcm = npt.NDArray[np.int16]

#: A marker found only in two pieces must score this much: the extra freedom of the split and the shift lets
#: speech alone reach about 0.43 (against 0.23 for the whole marker); a marker with one slip scores 0.93-1.0.
SLIPPED_MIN_SCORE = 0.7
#: A marker found only by its spectrogram (its waveform bent by a codec) must score this much; see above.
SPECTRAL_MIN_SCORE = 0.6
_BAND_FRACTION = 0.1  # spectrogram bins kept: those holding at least this share of the marker's busiest bin


def chirp(rate: int, *, ms: int = 60, f0: float = 600.0, f1: float = 3000.0, level_dbfs: float = -6.0) -> Pcm:
    """A linear chirp with raised-cosine edges; survives G.711 and resampling to 8 kHz."""
    n = rate * ms // 1000
    t = np.arange(n) / rate
    x = signal.chirp(t, f0=f0, t1=t[-1], f1=f1, method="linear")
    edge = max(1, n // 10)
    window = np.ones(n)
    ramp = 0.5 - 0.5 * np.cos(np.linspace(0, math.pi, edge))
    window[:edge] = ramp
    window[-edge:] = ramp[::-1]
    amp = 32767 * 10 ** (level_dbfs / 20)
    return np.round(x * window * amp).astype(np.int16)


@dataclass(frozen=True, slots=True, kw_only=True)
class MarkerMatch:
    offset: int  # sample index in the searched signal where the marker starts
    score: float  # normalized peak of the matched filter, 0..1
    slip: int = 0  # samples the marker's tail moved against its head (< 0: audio dropped inside it, > 0: inserted)
    by_spectrogram: bool = False  # found by its shape in time and frequency (score is that match's), not its waveform


def _normalized_scores(x: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Normalized matched filter of template ``m`` at every offset of ``x`` (both float64)."""
    corr = signal.correlate(x, m, mode="valid", method="fft")
    # local energy of the received signal under the template, for a normalized score
    energy = np.convolve(x * x, np.ones(m.size), mode="valid")
    norm = np.sqrt(np.maximum(energy, 1e-9) * float(np.dot(m, m)))
    return np.asarray(corr / norm)


def find_marker(received: Pcm, marker: Pcm, *, min_score: float = 0.5, slips: Sequence[int] = ()) -> MarkerMatch | None:
    """Where ``marker`` starts in ``received`` (normalized matched filter), or None when not clearly there.

    When the whole marker's waveform does not reach ``min_score``, the marker is looked for by its spectrogram
    (a codec bent the waveform; see the module docstring), which must reach :data:`SPECTRAL_MIN_SCORE`. A frame
    dropped inside the marker leaves that under 0.45, so then ``slips`` is tried: shifts in samples (negative:
    dropped, positive: inserted) a jitter buffer may have put inside the marker. The marker is tried as a head
    and a tail that many samples apart, near the best whole-marker peak; such a match must reach
    :data:`SLIPPED_MIN_SCORE` as well.
    """
    if received.size < marker.size or marker.size == 0:
        return None
    x = received.astype(np.float64)
    m = marker.astype(np.float64)
    score = _normalized_scores(x, m)
    best = int(np.argmax(score))
    if score[best] >= min_score:
        return MarkerMatch(offset=best, score=float(score[best]))
    found = _find_by_spectrogram(x, m, waveform=score, min_score=max(min_score, SPECTRAL_MIN_SCORE))
    if found is not None or not slips:
        return found
    return _find_slipped(x, m, near=best, min_score=max(min_score, SLIPPED_MIN_SCORE), slips=slips)


def _find_slipped(
    x: np.ndarray, m: np.ndarray, *, near: int, min_score: float, slips: Sequence[int]
) -> MarkerMatch | None:
    """The marker as head ``m[:q]`` at ``o`` and tail at ``o + q + d``, one slip ``d`` apart; the best such match.

    A drop of ``-d`` samples at ``q`` removes ``m[q:q-d]``: the tail is ``m[q-d:]`` right after the head. An
    insertion of ``d`` samples leaves all of ``m`` with a gap: the tail ``m[q:]`` starts ``d`` after the head's
    end. The score is the normalized correlation of head and tail together with what lies under them (the
    slipped samples take no part). The whole-marker peak lies within the largest slip of the head's start, so
    only that neighbourhood is searched. Both pieces keep at least a sixth of the marker, so that a fragment too
    short to be told from speech never counts as the marker.
    """
    size = m.size
    piece = max(1, size // 6)
    step = max(1, size // 12)
    drop, insert = max(0, -min(slips)), max(0, max(slips))
    lo = max(0, near - insert - step)
    hi = min(x.size, near + drop + step + size + insert)
    region = x[lo:hi]
    squares = np.concatenate([[0.0], np.cumsum(region * region)])
    found: MarkerMatch | None = None
    for q in range(piece, size - piece + 1, step):
        head = m[:q]
        if region.size < q:
            break
        head_corr = signal.correlate(region, head, mode="valid", method="fft")
        head_energy = squares[q:] - squares[:-q]
        head_template = float(np.dot(head, head))
        for d in slips:
            tail = m[q + max(0, -d) :]
            gap = q + max(0, d)  # the tail's start, from the head's
            if d == 0 or tail.size < piece or region.size < gap + tail.size:
                continue
            tail_corr = signal.correlate(region, tail, mode="valid", method="fft")
            tail_energy = squares[tail.size :] - squares[: -tail.size]
            count = region.size - gap - tail.size + 1  # head offsets with the whole tail inside the region
            corr = head_corr[:count] + tail_corr[gap : gap + count]
            energy = head_energy[:count] + tail_energy[gap : gap + count]
            score = corr / np.sqrt(np.maximum(energy, 1e-9) * (head_template + float(np.dot(tail, tail))))
            o = int(np.argmax(score))
            if score[o] >= min_score and (found is None or score[o] > found.score):
                found = MarkerMatch(offset=lo + o, score=float(score[o]), slip=d)
    return found


def _find_by_spectrogram(x: np.ndarray, m: np.ndarray, *, waveform: np.ndarray, min_score: float) -> MarkerMatch | None:
    """The marker by its magnitude spectrogram, placed to the waveform's best score within one hop of there.

    Frames of a fifteenth of the marker (4 ms of the 60 ms chirp), one every sixtieth (1 ms), Hann-windowed;
    magnitudes square-rooted so that the loud low partials of speech do not outweigh the chirp's line. The score
    at each hop is the normalized correlation of the received frames under the marker with the marker's own
    (template less its mean), so a signal with the chirp's spectral shape scores near 1 whatever its phase.
    """
    size = m.size
    win, hop = max(8, size // 15), max(1, size // 60)
    if size < win:
        return None
    template = _spectrogram(m, win, hop)
    band = template.sum(axis=0)
    band = band >= _BAND_FRACTION * band.max()  # the bins the chirp sweeps through
    template = template[:, band]
    frames = _spectrogram(x, win, hop)[:, band]
    length = template.shape[0]
    count = frames.shape[0] - length + 1  # >= 1: find_marker hands over only x at least as long as m
    template = template - template.mean()
    products = frames @ template.T  # [frame, template frame]
    corr = np.zeros(count)
    for j in range(length):
        corr += products[j : j + count, j]
    per_frame, per_frame_sq = frames.sum(axis=1), (frames * frames).sum(axis=1)
    window = np.ones(length)
    total = np.convolve(per_frame, window, mode="valid")
    total_sq = np.convolve(per_frame_sq, window, mode="valid")
    spread = np.maximum(total_sq - total * total / template.size, 1e-9)
    score = corr / np.sqrt(spread * float(np.sum(template * template)))
    k = int(np.argmax(score))
    if score[k] < min_score:
        return None
    lo, hi = max(0, k * hop - hop), min(waveform.size, k * hop + hop + 1)
    return MarkerMatch(offset=lo + int(np.argmax(waveform[lo:hi])), score=float(score[k]), by_spectrogram=True)


def _spectrogram(x: np.ndarray, win: int, hop: int) -> np.ndarray:
    """Square-rooted magnitude spectra of Hann-windowed frames of ``win`` samples every ``hop``: [frame, bin]."""
    frames = np.lib.stride_tricks.sliding_window_view(x, win)[::hop]
    return np.sqrt(np.abs(np.fft.rfft(frames * np.hanning(win), axis=1)))


@dataclass(frozen=True, slots=True, kw_only=True)
class EchoMatch:
    correlation: float  # Pearson correlation of the aligned overlap
    lag: int  # received[lag + i] ~ sent[i]


def echo_correlation(sent: Pcm, received: Pcm, *, max_lag: int | None = None) -> EchoMatch:
    """Align ``received`` to ``sent`` by cross-correlation and return the correlation of the overlap."""
    a = sent.astype(np.float64)
    b = received.astype(np.float64)
    if a.size == 0 or b.size == 0 or not a.any() or not b.any():
        return EchoMatch(correlation=0.0, lag=0)
    full = signal.correlate(b, a, mode="full", method="fft")
    lags = signal.correlation_lags(b.size, a.size, mode="full")
    if max_lag is not None:
        keep = (lags >= 0) & (lags <= max_lag)
        full, lags = full[keep], lags[keep]
    lag = int(lags[int(np.argmax(full))])
    if lag >= 0:
        n = min(a.size, b.size - lag)
        x, y = a[:n], b[lag : lag + n]
    else:
        n = min(a.size + lag, b.size)
        x, y = a[-lag : -lag + n], b[:n]
    if n < 2 or not x.std() or not y.std():
        return EchoMatch(correlation=0.0, lag=lag)
    return EchoMatch(correlation=float(np.corrcoef(x, y)[0, 1]), lag=lag)


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockMatch:
    score: float  # median over blocks of each block's best normalized correlation
    slips: int  # blocks whose best lag moved from the previous block's (jitter-buffer slips, in samples)


def blockwise_match(
    sent: Pcm, received: Pcm, *, start: int, end: int, lag: int, block: int, search: int, min_slip: int = 1
) -> BlockMatch:
    """How well ``sent[start:end]`` came back in ``received`` near ``lag``, tolerating slips.

    An adaptive jitter buffer may insert or drop a frame in the middle of a talk spurt; one global alignment
    would then call the rest of the spurt wrong. Instead each ``block`` of the sent segment is matched (the
    normalized matched filter of :func:`find_marker`) within ``search`` samples of where the previous block
    was found, and the score is the median of the blocks' best correlations.

    A move of the best lag by at least ``min_slip`` samples that the next block confirms (it is found within
    ``min_slip`` of the new lag) counts as a slip. A lossy codec (Opus) keeps the sound but not the waveform:
    its blocks' best lags wobble by a sample or fifty with no audio lost or added, and now and then a bent
    block (concealment of a lost packet, a vowel) matches best somewhere else, near a pitch period away, for a
    block or two that do not agree with each other before the blocks are back in line. A jitter buffer slips
    by whole packets (10-20 ms), and its slip stays until the next one: the block after it is found at the
    same new lag. A slip in a spurt's last block has no block to confirm it and is not counted.
    """
    scores: list[float] = []
    lags: list[int] = []
    current = lag
    for b0 in range(start, end - block + 1, block):
        piece = sent[b0 : b0 + block]
        if not piece.any():
            continue
        lo = b0 + current - search
        if lo < 0 or b0 + current + block + search > received.size:
            scores.append(0.0)
            continue
        found = find_marker(received[lo : b0 + current + block + search], piece, min_score=-1.0)
        if found is None:
            scores.append(0.0)
            continue
        current = lo + found.offset - b0
        lags.append(current)
        scores.append(found.score)
    if not scores:
        return BlockMatch(score=0.0, slips=0)
    return BlockMatch(score=float(np.median(scores)), slips=_count_slips([lag, *lags], min_slip))


def _count_slips(lags: Sequence[int], min_slip: int) -> int:
    """Moves of at least ``min_slip`` along ``lags`` to a lag the next element confirms; excursions not counted."""
    slips = 0
    level = lags[0]
    for i in range(1, len(lags)):
        here = lags[i]
        if abs(here - level) < min_slip:
            level = here  # the codec's wobble
        elif i + 1 < len(lags) and abs(lags[i + 1] - here) < min_slip:
            slips += 1  # a new lag, and the next block is found there too
            level = here
        # else an excursion: the next block is not where this one is (or there is none); the level holds
    return slips


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    count: int
    p50: float
    p90: float
    p99: float
    max: float
    mean: float

    def as_dict(self) -> dict[str, float]:
        return {
            "count": self.count,
            "p50": self.p50,
            "p90": self.p90,
            "p99": self.p99,
            "max": self.max,
            "mean": self.mean,
        }


def summarize(values: Sequence[float]) -> Summary:
    if not values:
        nan = float("nan")
        return Summary(count=0, p50=nan, p90=nan, p99=nan, max=nan, mean=nan)
    arr = np.asarray(values, dtype=np.float64)
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return Summary(
        count=int(arr.size),
        p50=float(p50),
        p90=float(p90),
        p99=float(p99),
        max=float(arr.max()),
        mean=float(arr.mean()),
    )
