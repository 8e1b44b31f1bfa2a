"""Synchronous work on the media worker's event loop, done in slices with the loop let in between.

The loop that runs a worker's 20 ms media tick also serves its ``/metrics``, builds its heartbeats and exports
its counters. Each of those walks every live call, and at a few hundred calls a walk in one stretch takes
milliseconds: a tick due meanwhile starts late by the rest of it, and a loaded worker's tick has only a few
milliseconds to spare. A walk that awaits :meth:`Slices.next` after each item lets the loop in (due timers
first, under uvloop) once ``slice_s`` has passed since it last did.
"""

from __future__ import annotations

import asyncio
import time

SLICE_S = 0.0005


class Slices:
    """``await slices.next()`` between items: returns at once until ``slice_s`` has passed, then lets the loop
    run what is ready (``asyncio.sleep(0)``) and starts the next slice."""

    __slots__ = ("_slice_s", "_started", "yields")

    def __init__(self, slice_s: float = SLICE_S) -> None:
        self._slice_s = slice_s
        self._started = time.perf_counter()
        self.yields = 0  # how many times the loop was let in

    async def next(self) -> None:
        if time.perf_counter() - self._started >= self._slice_s:
            await asyncio.sleep(0)
            self.yields += 1
            self._started = time.perf_counter()
