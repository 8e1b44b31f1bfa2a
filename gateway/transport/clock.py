"""The worker's one media clock: a 20 ms tick at absolute deadlines.

A loop of ``await asyncio.sleep(0.02)`` drifts by the work done in each iteration and by timer slack, so
RTP timestamps and wall time part ways within minutes. Here deadline *k* is ``t0 + k * period`` on the
event loop's monotonic clock and every tick is scheduled with ``loop.call_at`` for its own deadline.

When the loop falls behind (a long GC pause, a CPU-starved container) the missed ticks are run as soon as
possible, up to ``max_catch_up`` in a row, so every call still gets exactly one frame per 20 ms of media time;
beyond that the clock re-anchors, counts the skipped ticks and tells ``on_skipped`` how many (the media
engine advances every call's RTP clock by them, so a stall never adds to the delay a phone sees). A tick whose
work ends after the next deadline is an *overrun*.

A catch-up tick is not run back to back with the late one: it is scheduled 1 ms out, so the event loop polls
its sockets and runs the callbacks and tasks that are ready before it. The packets that
arrived during the stall then reach the jitter buffers, and the audio that tasks woken by the late tick
produce reaches the playout buffers, before the next frame is taken from them. Run back to back, a stall of
two periods made every call's jitter buffer underrun (its next packet was still unread in the socket) and
left a gap in every call's agent audio, at the same moment on every call.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

_CATCH_UP_DELAY_S = 0.001


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
        on_skipped: Callable[[int], None] | None = None,
    ) -> None:
        self._on_tick = on_tick
        self._on_measured = on_measured  # (lag_s, duration_s, overrun)
        self._on_skipped = on_skipped  # (ticks skipped by a re-anchor)
        self.period = period
        self.max_catch_up = max_catch_up
        self.stats = ClockStats()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._t0 = 0.0
        self._k = 0
        self._behind = 0  # ticks in a row that ended after the next deadline

    @property
    def running(self) -> bool:
        return self._handle is not None

    def start(self) -> None:
        if self._handle is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time() + self.period
        self._k = 0
        self._behind = 0
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
            try:
                self._on_measured(lag, duration, overrun)
            except Exception:  # neither may stop the clock: the next tick must still be scheduled
                log.exception("media tick measurement failed")
        if end < next_deadline:
            self._behind = 0
        else:
            self._behind += 1
            if self._behind >= self.max_catch_up:
                behind = int((end - next_deadline) // self.period) + 1
                stats.skipped += behind
                self._k += behind
                self._behind = 0
                log.warning("media clock fell %d ticks behind; re-anchored", behind)
                if self._on_skipped is not None:
                    try:
                        self._on_skipped(behind)
                    except Exception:
                        log.exception("handling skipped media ticks failed")
        if self._handle is not None:
            when = self._deadline(self._k)
            if when <= end:
                # Catching up: a timer 1 ms out, not one already due, so that the loop polls first. uvloop runs a
                # timer whose delay rounds to 0 ms as call_soon, ahead of the poll; asyncio would poll either way.
                when = end + _CATCH_UP_DELAY_S
            self._handle = loop.call_at(when, self._fire)
