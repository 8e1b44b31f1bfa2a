"""When a worker encodes its Opus callers' frames a tick ahead (``TickEngine.opus_ahead``; docs/adr/0013).

The tick sends every caller's packet at its start, but an Opus call's packet can only leave once libopus has
encoded its frame, and the tick encodes its Opus calls one after another: with a few dozen talking, the last
packets leave several milliseconds into the tick, a pacing error the caller's jitter buffer has to absorb.
Encoded a tick ahead, every packet leaves at the start of its tick, for one tick (20 ms) more delay on the
agent's voice. A lightly loaded worker should not pay that delay, so the worker times each tick's outbound
encoding (``tick_outbound`` plus ``encode_ahead``: the same work in either mode) and this policy decides once
per window of ticks on the window's 90th percentile, the ticks where many agents talk at once (a mean is
dominated by the ticks where few do). Ahead when it is over the budget; back inline once it has stayed under
half of it for ``calm_windows`` windows in a row, so that agents' turns coming and going do not make the mode
flap. A few slow ticks in a window (a collector pass, a stolen slice of the core) are above its 90th percentile.

A budget of 0 is always ahead; a budget of a tick (20 ms) or more, never. Pure: fed durations in seconds, no
clock of its own.
"""

from __future__ import annotations

from gateway.media.errors import LocalMediaError

WINDOW_TICKS = 50  # one second of ticks per decision
NEVER_S = 0.020  # a budget of a whole tick or more: never ahead
CALM_WINDOWS = 10  # windows under half the budget, in a row, before coming back inline


class OpusAheadPolicy:
    """Decides ``TickEngine.opus_ahead`` from the outbound encode time of each tick (``observed``)."""

    __slots__ = ("_budget", "_calm", "_calm_windows", "_times", "_window", "ahead", "changes", "last_p90")

    def __init__(self, budget_s: float, *, window: int = WINDOW_TICKS, calm_windows: int = CALM_WINDOWS) -> None:
        if budget_s < 0:
            raise LocalMediaError(f"the encode-ahead budget must be >= 0 s, got {budget_s}")
        if window < 10:
            raise LocalMediaError(f"the encode-ahead window must be >= 10 ticks, got {window}")
        if calm_windows < 1:
            raise LocalMediaError(f"the encode-ahead calm must be >= 1 window, got {calm_windows}")
        self._budget = budget_s
        self._window = window
        self._calm_windows = calm_windows
        self._times: list[float] = []
        self._calm = 0  # windows in a row under half the budget, while ahead
        self.ahead = budget_s == 0  # a budget of 0: always ahead
        self.changes = 0  # times the decision changed
        self.last_p90 = 0.0  # the last window's 90th percentile, seconds

    def observed(self, seconds: float) -> bool:
        """One tick's outbound encode time; returns whether Opus calls should be encoded ahead now."""
        times = self._times
        times.append(seconds)
        if len(times) < self._window or not self._budget or self._budget >= NEVER_S:
            if len(times) >= self._window:
                times.clear()
            return self.ahead
        times.sort()
        p90 = self.last_p90 = times[(len(times) * 9) // 10]
        times.clear()
        if not self.ahead:
            if p90 > self._budget:
                self.ahead = True
                self._calm = 0
                self.changes += 1
        elif p90 < self._budget / 2:
            self._calm += 1
            if self._calm >= self._calm_windows:
                self.ahead = False
                self.changes += 1
        else:
            self._calm = 0
        return self.ahead
