"""The worker's one media clock: a 20 ms tick at absolute deadlines.

A loop of ``await asyncio.sleep(0.02)`` drifts by the work done in each iteration and by timer slack, so
RTP timestamps and wall time part ways within minutes. Here deadline *k* is ``t0 + k * period`` on the
event loop's monotonic clock and every tick is scheduled with ``loop.call_at`` for its own deadline.

When the loop falls behind (a long GC pause, a CPU-starved container) the missed ticks are run back to
back, up to ``max_catch_up``, so every call still gets exactly one frame per 20 ms of media time; beyond
that the clock re-anchors and counts the skipped ticks. A tick whose work ends after the next deadline
is an *overrun*.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ClockStats:
    ticks: int = 0
    overruns: int = 0
    skipped: int = 0
    max_lag_s: float = 0.0
    last_duration_s: float = 0.0
    max_duration_s: float = 0.0


class MediaClock:
    """Calls ``on_tick(deadline)`` once per ``period`` seconds at absolute deadlines."""

    def __init__(
        self,
        on_tick: Callable[[float], None],
        *,
        period: float = 0.02,
        max_catch_up: int = 5,
        on_measured: Callable[[float, float, bool], None] | None = None,
    ) -> None:
        self._on_tick = on_tick
        self._on_measured = on_measured  # (lag_s, duration_s, overrun)
        self.period = period
        self.max_catch_up = max_catch_up
        self.stats = ClockStats()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._t0 = 0.0
        self._k = 0

    @property
    def running(self) -> bool:
        return self._handle is not None

    def start(self) -> None:
        if self._handle is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time() + self.period
        self._k = 0
        self._handle = self._loop.call_at(self._t0, self._fire)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _deadline(self, k: int) -> float:
        return self._t0 + k * self.period

    def _fire(self) -> None:
        loop = self._loop
        assert loop is not None
        runs = 0
        while True:
            deadline = self._deadline(self._k)
            start = loop.time()
            lag = start - deadline
            try:
                self._on_tick(deadline)
            except Exception:  # a bug in one tick must not stop the media of every call
                log.exception("media tick failed")
            end = loop.time()
            duration = end - start
            self._k += 1
            runs += 1
            next_deadline = self._deadline(self._k)
            overrun = end > next_deadline
            stats = self.stats
            stats.ticks += 1
            stats.last_duration_s = duration
            stats.max_duration_s = max(stats.max_duration_s, duration)
            stats.max_lag_s = max(stats.max_lag_s, lag)
            if overrun:
                stats.overruns += 1
            if self._on_measured is not None:
                self._on_measured(lag, duration, overrun)
            if end < next_deadline:
                break
            if runs >= self.max_catch_up:
                behind = int((end - next_deadline) // self.period) + 1
                stats.skipped += behind
                self._k += behind
                log.warning("media clock fell %d ticks behind; re-anchored", behind)
                break
        if self._handle is not None:
            self._handle = loop.call_at(self._deadline(self._k), self._fire)
