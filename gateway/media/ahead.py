"""When a worker encodes its Opus callers' frames a tick ahead (``TickEngine.opus_ahead``).

The tick sends every caller's packet at its start, but an Opus call's packet can only leave once libopus has
encoded its frame, and the tick encodes its Opus calls one after another: with a few dozen talking, the last
packets leave several milliseconds into the tick, a pacing error the caller's jitter buffer has to absorb
(docs/performance.md, "Opus encoded ahead under load"). Encoded a tick ahead, every packet leaves at the start of
its tick, for one tick (20 ms) more delay on the agent's voice. A lightly loaded worker should not pay that
delay, so the worker measures each tick's outbound encoding (``tick_outbound`` plus ``encode_ahead``: the same
work in either mode) and this policy decides once per window of ticks, on the window's mean: ahead above the
budget, back inline below half of it. One slow tick (a collector pass, a stolen slice of the core) moves a mean
of 50 ticks by a little, so the mode follows the load, not the noise.

Pure: fed durations in seconds, no clock of its own.
"""

from __future__ import annotations

from gateway.media.errors import LocalMediaError

WINDOW_TICKS = 50  # one second of ticks per decision


class OpusAheadPolicy:
    """Decides ``TickEngine.opus_ahead`` from the outbound encode time of each tick (``observed``)."""

    __slots__ = ("_budget", "_count", "_sum", "_window", "ahead", "changes", "last_mean")

    def __init__(self, budget_s: float, *, window: int = WINDOW_TICKS) -> None:
        if budget_s < 0:
            raise LocalMediaError(f"the encode-ahead budget must be >= 0 s, got {budget_s}")
        if window < 1:
            raise LocalMediaError(f"the encode-ahead window must be >= 1 tick, got {window}")
        self._budget = budget_s
        self._window = window
        self._count = 0
        self._sum = 0.0
        self.ahead = budget_s == 0  # a budget of 0: always ahead
        self.changes = 0  # times the decision changed
        self.last_mean = 0.0  # the last window's mean outbound encode time, seconds

    def observed(self, seconds: float) -> bool:
        """One tick's outbound encode time; returns whether Opus calls should be encoded ahead now."""
        self._sum += seconds
        self._count += 1
        if self._count < self._window:
            return self.ahead
        mean = self.last_mean = self._sum / self._count
        self._sum = 0.0
        self._count = 0
        wanted = mean > self._budget if not self.ahead else mean >= self._budget / 2
        if self._budget and wanted != self.ahead:
            self.ahead = wanted
            self.changes += 1
        return self.ahead
