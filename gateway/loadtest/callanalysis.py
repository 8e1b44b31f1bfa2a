"""After the load: what came back on one call, measured against what it sent.

The received stream is laid out by RTP sequence number (a lost packet is 20 ms of zeros, not concealed),
decoded, and searched for each sent marker inside the window that belongs to it (from the marker's send time
until the next marker's). Round-trip latency = arrival time of the packet carrying the returned marker start,
plus the marker's position inside that packet, minus the send deadline of the frame that carried it: both
ends read the same process clock, so no clock offset enters. A marker that came back with one jitter-buffer
slip inside it (a frame dropped or inserted in the middle of the chirp) is found as two pieces and counts as a
slip, not as a lost marker. With the marker's sample lag, each talk spurt is compared with what came back from
that lag on, in 100 ms blocks each matched within two frames of the previous block
(:func:`~gateway.loadtest.analysis.blockwise_match`: an adaptive jitter buffer may slip a frame mid-spurt). The
audio "came back right" when, for every spurt whose reply was not cut off by a planned barge-in, the median
block correlation is above the codec's threshold.

Outbound pacing error of the target: packet *i* of the returned stream *should* arrive at
``a + (ts_i - ts_0) / clock_rate`` for some constant ``a`` (transit); taking ``a`` from the earliest packet,
every other packet's error is how much later than that it arrived. The arrival is the kernel's receive stamp
where the socket gave one: on loopback that is when the target sent the packet, so the error is the target's
send pacing, and the time this process took to read the packet (its own scheduling) is reported apart, as
the generator's read delay. Without kernel stamps the arrival is the read time, and the error an upper bound.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gateway.loadtest import _codec
from gateway.loadtest.analysis import Pcm, blockwise_match, chirp, find_marker
from gateway.loadtest.audio import MARKER_MS, CallAudio
from gateway.loadtest.config import Codec
from gateway.loadtest.media import CallReceiver

#: Correlation above which a returned spurt counts as the audio that was sent (two codec passes + resampling).
CORRELATION_OK = {"PCMU": 0.85, "PCMA": 0.85, "G722": 0.85, "opus": 0.6}
#: Pacing-error histogram: bins of 0.25 ms up to 250 ms (the last bin collects everything later).
PACING_BIN_MS = 0.25
PACING_BINS = 1000
_SILENT_DBFS = -45.0
_SEARCH_SLACK = 4  # samples either side when aligning a spurt
# A marker with one jitter-buffer slip inside still counts as come back (analysis.find_marker ``slips``):
_MAX_DROP_UNITS = 4  # 10 ms units dropped (a frame shed to shrink the delay: 2 units)
_MAX_INSERT_UNITS = 8  # 10 ms units inserted (concealment while the buffer refills)


@dataclass(frozen=True, slots=True, kw_only=True)
class CallAnalysis:
    rtt_ms: tuple[float, ...]  # one per marker found
    rtt_at: tuple[float, ...]  # send time of each found marker, seconds since the call's first frame
    markers_expected: int
    markers_found: int
    correlations: tuple[float, ...]  # one per spurt checked
    audio_ok: bool | None  # None: nothing to check (silence was sent)
    pacing_hist: np.ndarray  # int64[PACING_BINS]
    pacing_p99_ms: float
    barge_in_stop_ms: tuple[float, ...]
    slips: int = 0  # blocks of returned speech that moved against the previous block (jitter-buffer slips)
    missing: tuple[int, ...] = ()  # spurts (0-based) whose marker did not come back
    read_delay_hist: np.ndarray | None = None  # int64[PACING_BINS]: read time - kernel arrival, per packet


def _frame_arrivals(receiver: CallReceiver) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(slot index per packet, arrival per packet, extended timestamps) in sequence order, duplicates dropped."""
    seqs = np.asarray(receiver.seqs, dtype=np.int64)
    diffs = ((np.diff(seqs) + 0x8000) & 0xFFFF) - 0x8000
    ext = np.concatenate([[0], np.cumsum(diffs)])
    ts = np.asarray(receiver.timestamps, dtype=np.int64)
    tdiff = ((np.diff(ts) + 0x80000000) & 0xFFFFFFFF) - 0x80000000
    ext_ts = np.concatenate([[0], np.cumsum(tdiff)])
    slots = ext - ext.min()
    return slots, np.asarray(receiver.arrivals, dtype=np.float64), ext_ts


def pacing_errors(arrivals: np.ndarray, ext_ts: np.ndarray, clock_rate: int) -> np.ndarray:
    """Seconds each packet arrived after the grid set by the least-delayed packet (see the module docstring)."""
    if arrivals.size == 0:
        return np.zeros(0)
    offset = arrivals - ext_ts / clock_rate
    return offset - offset.min()


def read_delays(receiver: CallReceiver) -> np.ndarray:
    """Seconds from each packet's kernel arrival until this process read it (empty without kernel stamps)."""
    if not receiver.reads or len(receiver.reads) != len(receiver.arrivals):
        return np.zeros(0)
    delays = np.asarray(receiver.reads, dtype=np.float64) - np.asarray(receiver.arrivals, dtype=np.float64)
    return np.maximum(delays, 0.0)


def pacing_histogram(errors_s: np.ndarray) -> np.ndarray:
    bins = np.minimum((errors_s * 1000 / PACING_BIN_MS).astype(np.int64), PACING_BINS - 1)
    return np.bincount(bins, minlength=PACING_BINS).astype(np.int64)


def histogram_percentile(hist: np.ndarray, q: float) -> float:
    """The ``q``-th percentile (0..100) in ms of a pacing histogram (upper edge of the bin)."""
    total = int(hist.sum())
    if total == 0:
        return float("nan")
    rank = int(np.ceil(q / 100 * total))
    index = int(np.searchsorted(np.cumsum(hist), max(rank, 1)))
    return (index + 1) * PACING_BIN_MS


def _spurts_lived(plan: CallAudio, samples_sent: int | None) -> int:
    """How many of the plan's spurts the call lived through with their reply time (up to the next spurt)."""
    if samples_sent is None:
        return len(plan.spurts)
    ends = [start for start, _ in plan.spurts[1:]] + [plan.pcm.size]
    return sum(1 for end in ends if end <= samples_sent)


def analyze_call(
    plan: CallAudio,
    receiver: CallReceiver,
    *,
    codec: Codec,
    frame_sent: Callable[[int], float],
    codec_delay: int = 0,
    check_audio: bool = True,
    frames_sent: int | None = None,
) -> CallAnalysis:
    """Measure one finished call.

    ``frame_sent(k)``: when the call's frame *k* left (the clock its arrivals were stamped with).
    ``codec_delay``: samples our own encoder delays the marker by (Opus look-ahead); not the target's doing.
    ``frames_sent``: a call stopped before its plan ended (the run was interrupted) is judged on the spurts
    whose reply time (up to the next spurt) it lived through; None: the whole plan.
    """
    rate = plan.rate
    n = _codec.samples_per_frame(codec)
    judged = _spurts_lived(plan, None if frames_sent is None else frames_sent * n)
    empty = np.zeros(PACING_BINS, dtype=np.int64)
    if not receiver.seqs:
        expected = sum(1 for barged in plan.barged[:judged] if not barged)  # the replies the main path expects
        return CallAnalysis(
            rtt_ms=(),
            rtt_at=(),
            markers_expected=expected,
            markers_found=0,
            correlations=(),
            audio_ok=False if expected or plan.pcm.any() else None,
            pacing_hist=empty,
            pacing_p99_ms=float("nan"),
            barge_in_stop_ms=(),
        )
    slots, arrivals, ext_ts = _frame_arrivals(receiver)
    errors = pacing_errors(arrivals, ext_ts, _codec.clock_rate(codec))
    hist = pacing_histogram(errors)
    reads = read_delays(receiver)
    read_hist = pacing_histogram(reads) if reads.size else None
    p99 = float(np.percentile(errors, 99) * 1000) if errors.size else float("nan")
    if not check_audio:
        return CallAnalysis(
            rtt_ms=(),
            rtt_at=(),
            markers_expected=0,
            markers_found=0,
            correlations=(),
            audio_ok=None,
            pacing_hist=hist,
            read_delay_hist=read_hist,
            pacing_p99_ms=p99,
            barge_in_stop_ms=(),
        )
    count = int(slots.max()) + 1
    ordered: list[bytes | None] = [None] * count
    slot_arrival = np.full(count, np.nan)
    for slot, arrival, payload in zip(slots.tolist(), arrivals.tolist(), receiver.payloads, strict=True):
        if ordered[slot] is None:
            ordered[slot] = payload
            slot_arrival[slot] = arrival
    received = _codec.decode(ordered, codec)
    slot_arrival = _fill_arrivals(slot_arrival)
    sample_arrival = np.repeat(slot_arrival, n)  # when each received sample's packet arrived

    if not plan.markers:
        level = _dbfs(received)
        return CallAnalysis(
            rtt_ms=(),
            rtt_at=(),
            markers_expected=0,
            markers_found=0,
            correlations=(),
            audio_ok=(level < _SILENT_DBFS) if not plan.pcm.any() else None,
            pacing_hist=hist,
            read_delay_hist=read_hist,
            pacing_p99_ms=p99,
            barge_in_stop_ms=(),
        )

    marker = chirp(rate, ms=MARKER_MS)
    # Slips a jitter buffer makes: whole 10 ms units, up to two frames dropped or four inserted.
    unit = rate // 100
    slip_shifts = tuple(k * unit for k in range(-_MAX_DROP_UNITS, _MAX_INSERT_UNITS + 1) if k)
    slips = 0
    rtts: list[float] = []
    rtt_at: list[float] = []
    correlations: list[float] = []
    expected = 0
    ok = True
    missing: list[int] = []
    send_t0 = frame_sent(0)
    sent_times = [frame_sent(m // n) + (m % n) / rate for m in plan.markers]
    for j, (_, end) in enumerate(plan.spurts[:judged]):
        if plan.barged[j]:
            continue  # its reply is planned to be cut off by the caller talking over it
        expected += 1
        t_sent = sent_times[j]
        t_limit = sent_times[j + 1] if j + 1 < len(sent_times) else np.inf
        window = np.flatnonzero((sample_arrival >= t_sent) & (sample_arrival < t_limit))
        match, slip = None, 0
        if window.size:
            a, b = int(window[0]), int(window[-1]) + 1
            found = find_marker(received[a:b], marker, slips=slip_shifts)
            if found is not None:
                match, slip = a + found.offset, found.slip
        if match is None:
            ok = False
            missing.append(j)
            continue
        within = (match % n) / rate
        rtts.append(float((slot_arrival[match // n] + within - t_sent - codec_delay / rate) * 1000))
        rtt_at.append(t_sent - send_t0)
        slips += int(slip != 0)  # a jitter-buffer slip inside the marker itself
        lag = match + slip - plan.markers[j]  # where the speech after the marker is: behind the marker's tail
        # The speech after the marker is compared (the marker itself is the same in every spurt and call),
        # block by block so that a jitter-buffer slip inside the spurt is not mistaken for wrong audio.
        blocks = blockwise_match(
            plan.pcm,
            received,
            start=plan.markers[j] + marker.size,
            end=end,
            lag=lag,
            block=rate // 10,
            search=2 * n + _SEARCH_SLACK,
            min_slip=rate // 200,  # 5 ms: half the least a jitter buffer slips by (10 ms); Opus wobbles ~1 ms
        )
        corr = blocks.score
        slips += blocks.slips
        correlations.append(float(corr))
        if corr < CORRELATION_OK[codec]:
            ok = False
    return CallAnalysis(
        rtt_ms=tuple(rtts),
        rtt_at=tuple(rtt_at),
        markers_expected=expected,
        markers_found=len(rtts),
        missing=tuple(missing),
        correlations=tuple(correlations),
        audio_ok=ok if expected or frames_sent is None else None,  # a call cut before any reply: unchecked
        pacing_hist=hist,
        read_delay_hist=read_hist,
        pacing_p99_ms=p99,
        barge_in_stop_ms=_barge_in_stops(plan, received, sample_arrival, frame_sent, n),
        slips=slips,
    )


def _barge_in_stops(
    plan: CallAudio, received: Pcm, sample_arrival: np.ndarray, frame_sent: Callable[[int], float], n: int
) -> tuple[float, ...]:
    """For each spurt that talks over a reply: ms from its start until the returned audio falls silent.

    Only spurts during which the agent was audibly talking count. With an agent that echoes continuously
    (the built-in echo agent) there is no reply to cut, and the figure is the spurt's own echo length.
    """
    stops: list[float] = []
    frames = received.size // n
    if frames == 0:
        return ()
    levels = np.array([_dbfs(received[i * n : (i + 1) * n]) for i in range(frames)])
    frame_arrival = sample_arrival[::n][:frames]
    for j, barged in enumerate(plan.barged):
        if not barged or j + 1 >= len(plan.spurts):
            continue
        t_start = frame_sent(plan.spurts[j + 1][0] // n)
        after = np.flatnonzero(frame_arrival >= t_start)
        if after.size < 3 or after[0] == 0 or levels[after[0] - 1] < _SILENT_DBFS:
            continue  # the agent was quiet when the caller started talking: nothing to interrupt
        silent = levels[after] < _SILENT_DBFS
        run = np.flatnonzero(silent[:-2] & silent[1:-1] & silent[2:])
        if run.size:
            stops.append((frame_arrival[after[run[0]]] - t_start) * 1000)
    return tuple(stops)


def _fill_arrivals(arrival: np.ndarray) -> np.ndarray:
    """Arrival times for lost slots, from the nearest received slot shifted by 20 ms per slot."""
    missing = np.isnan(arrival)
    if not missing.any():
        return arrival
    index = np.arange(arrival.size)
    known = np.flatnonzero(~missing)
    nearest = known[np.clip(np.searchsorted(known, index), 0, known.size - 1)]
    out = arrival.copy()
    out[missing] = arrival[nearest[missing]] + (index[missing] - nearest[missing]) * 0.02
    return out


def _dbfs(pcm: Pcm) -> float:
    if pcm.size == 0:
        return -120.0
    rms = float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2)))
    return 20 * np.log10(max(rms, 1e-3) / 32768)
