"""Per-source reception statistics: sequence tracking (RFC 3550 A.1), loss (A.3) and interarrival jitter (A.8).

:class:`ReceptionStats` sees every valid RTP packet of a call (audio and telephone-event alike: they share
one sequence space) and tells the caller what the packet is:

- ``ACCEPTED``: the newest packet so far (``ext_seq`` is the new highest extended sequence number);
- ``REORDERED``: older than the newest but not seen before (it may still be in time for playout);
- ``DUPLICATE``: already seen (a 1024-entry ring of extended sequence numbers remembers);
- ``SOURCE_CHANGED``: a new SSRC (or the very first packet): sequence state restarts, playout must resync;
- ``RESTARTED``: A.1's "two sequential packets after a big jump": the sender restarted its sequence;
- ``OUT_OF_RANGE``: a jump of more than ``MAX_DROPOUT`` ahead or ``MAX_MISORDER`` behind, held on probation
  (dropped) until the next packet confirms it.

Extended numbers are unwrapped against the newest packet, so 16-bit sequence and 32-bit timestamp wraparound
are invisible to the caller. Loss follows A.3: expected = highest - base + 1, lost = expected - received,
where ``received`` counts unique packets (duplicates are counted apart), so the cumulative loss does not go
negative because of duplicates. Jitter follows A.8 / §6.4.1, ``J += (|D| - J) / 16`` in timestamp units,
over audio packets only (telephone-event packets keep the event's start timestamp while time moves on, which
would read as jitter).
"""

from __future__ import annotations

from gateway.media.rtp import ts_delta

MAX_DROPOUT = 3000
MAX_MISORDER = 100
_RING = 1024
_UNSEEN = -(1 << 62)  # never an extended sequence number (those may be slightly negative)
_FRESH_RING = (_UNSEEN,) * _RING

ACCEPTED = 0
REORDERED = 1
DUPLICATE = 2
SOURCE_CHANGED = 3
RESTARTED = 4
OUT_OF_RANGE = 5


class ReceptionStats:
    """Sequence, loss and jitter state of the current remote source, plus call-lifetime totals."""

    __slots__ = (
        "_bad_seq",
        "_expected_prior",
        "_last_ext_ts",
        "_last_transit",
        "_lost_retired",
        "_received_prior",
        "_seen",
        "base_ext_seq",
        "clock_rate",
        "duplicates",
        "ext_seq",
        "ext_ts",
        "jitter",
        "max_ext_seq",
        "out_of_range",
        "received",
        "received_total",
        "reordered",
        "restarts",
        "source_changes",
        "ssrc",
    )

    def __init__(self, clock_rate: int) -> None:
        self.clock_rate = clock_rate
        self.ssrc: int | None = None
        self._seen = list(_FRESH_RING)
        self._lost_retired = 0
        self.received_total = 0
        self.duplicates = 0
        self.reordered = 0
        self.out_of_range = 0
        self.restarts = 0
        self.source_changes = 0
        self.base_ext_seq = self.max_ext_seq = self.ext_seq = self.ext_ts = self._last_ext_ts = 0
        self._last_transit: float | None = None
        self._bad_seq = -1
        self.received = self._expected_prior = self._received_prior = 0
        self.jitter = 0.0
        self._reset_source(0, 0, None)

    # ------------------------------------------------------------------------------------------ update

    def update(self, seq: int, ts: int, ssrc: int, now: float, *, audio: bool = True) -> int:
        """Account for one valid packet; sets ``ext_seq``/``ext_ts`` and returns one of the status codes."""
        if ssrc != self.ssrc:
            if self.ssrc is not None:
                self.source_changes += 1
                self._retire()
            self._reset_source(seq, ts, ssrc)
            return self._count_new(seq, ts, now, audio, SOURCE_CHANGED)
        max_ext = self.max_ext_seq
        delta = ((seq - max_ext + 0x8000) & 0xFFFF) - 0x8000
        if 0 < delta < MAX_DROPOUT:
            ext = max_ext + delta
            self.max_ext_seq = ext
            ext_ts = self._last_ext_ts + ts_delta(ts, self._last_ext_ts)
            self._last_ext_ts = ext_ts
            status = ACCEPTED
        elif -MAX_MISORDER <= delta <= 0:
            ext = max_ext + delta
            if delta == 0 or self._seen[ext % _RING] == ext:
                self.duplicates += 1
                return DUPLICATE
            ext_ts = self._last_ext_ts + ts_delta(ts, self._last_ext_ts)
            if ext < self.base_ext_seq:
                self.base_ext_seq = ext
            self.reordered += 1
            status = REORDERED
        elif seq == self._bad_seq:
            # Two sequential packets after a large jump: the sender restarted (A.1 init_seq).
            self.restarts += 1
            self._retire()
            self._reset_source(seq, ts, ssrc)
            return self._count_new(seq, ts, now, audio, RESTARTED)
        else:
            self._bad_seq = (seq + 1) & 0xFFFF
            self.out_of_range += 1
            return OUT_OF_RANGE
        self._bad_seq = -1
        self._seen[ext % _RING] = ext
        self.ext_seq = ext
        self.ext_ts = ext_ts
        self.received += 1
        self.received_total += 1
        if audio:
            self._update_jitter(ext_ts, now)
        return status

    def _count_new(self, seq: int, ts: int, now: float, audio: bool, status: int) -> int:
        self._seen[seq % _RING] = seq
        self.received = 1
        self.received_total += 1
        if audio:
            self._update_jitter(ts, now)
        return status

    def _update_jitter(self, ext_ts: int, now: float) -> None:
        transit = now * self.clock_rate - ext_ts
        last = self._last_transit
        self._last_transit = transit
        if last is not None:
            d = transit - last
            if d < 0:
                d = -d
            self.jitter += (d - self.jitter) / 16.0

    def _reset_source(self, seq: int, ts: int, ssrc: int | None) -> None:
        self.ssrc = ssrc
        self.base_ext_seq = seq
        self.max_ext_seq = seq
        self.ext_seq = seq
        self.ext_ts = ts
        self._last_ext_ts = ts
        self._last_transit = None
        self._bad_seq = -1
        self.received = 0
        self._expected_prior = 0
        self._received_prior = 0
        self.jitter = 0.0
        self._seen[:] = _FRESH_RING

    def _retire(self) -> None:
        self._lost_retired += max(0, self.expected - self.received)

    # ----------------------------------------------------------------------------------------- reading

    @property
    def expected(self) -> int:
        return 0 if self.ssrc is None else self.max_ext_seq - self.base_ext_seq + 1

    @property
    def cumulative_lost(self) -> int:
        """Packets lost over the call's lifetime (all sources), never negative."""
        return self._lost_retired + max(0, self.expected - self.received)

    @property
    def jitter_ms(self) -> float:
        return self.jitter * 1000.0 / self.clock_rate

    @property
    def loss_fraction(self) -> float:
        """Lifetime fraction lost, 0.0..1.0."""
        lost = self.cumulative_lost
        total = lost + self.received_total
        return lost / total if total else 0.0

    def report_block(self) -> tuple[int, int, int, int]:
        """Values for an RTCP report block (RFC 3550 §6.4.1, A.3); closes the reporting interval.

        Returns (fraction_lost 0..255, cumulative_lost clamped to 24-bit signed, extended highest sequence
        number, interarrival jitter in timestamp units).
        """
        expected = self.expected
        expected_interval = expected - self._expected_prior
        received_interval = self.received - self._received_prior
        self._expected_prior = expected
        self._received_prior = self.received
        lost_interval = expected_interval - received_interval
        fraction = 0 if expected_interval <= 0 or lost_interval <= 0 else (lost_interval << 8) // expected_interval
        lost = max(-0x800000, min(0x7FFFFF, expected - self.received))
        return min(fraction, 255), lost, self.max_ext_seq & 0xFFFFFFFF, int(self.jitter)
