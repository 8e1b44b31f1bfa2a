"""The cyclic garbage collector in a media process: the frozen start-up heap (docs/adr/0006-gc-freeze.md) and
collection passes paced by the media clock (docs/adr/0010-collector-paced-by-the-tick.md).

CPython starts a collection from whichever allocation crosses a threshold: in the middle of a tick, or in the
last millisecond before the next one, where a 2-17 ms pass of the young generations delays every call's
frame. :class:`PacedCollector` turns the automatic collector off and runs the same passes right after a
tick, in the slack before the next deadline; the decision is :func:`due_generation`, a pure function of
the collector's counters.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

_heap_frozen = False


def freeze_startup_heap() -> None:
    """Move everything alive now (modules, numpy/scipy/av, the app) out of the cyclic collector's reach.

    A full (generation 2) collection walks every tracked object; with the start-up heap that took 85-90 ms
    in a benchmark worker and 68 ms in the load generator: one stalled 20 ms clock that late, and a burst of
    late RTP on every call after it. Frozen objects are never walked or freed, so this runs once per process,
    when start-up is over: at the first media worker's start, and in the load generator before its clock
    starts.
    """
    global _heap_frozen
    if _heap_frozen:
        return
    _heap_frozen = True
    gc.collect()
    gc.freeze()


@dataclass(frozen=True, slots=True)
class CollectorPolicy:
    """When :class:`PacedCollector` runs a pass.

    ``thresholds`` are CPython's three (``gc.get_threshold()``): allocations before a generation-0 pass,
    generation-0 passes before a generation-1 pass, generation-1 passes before a full one. A full pass walks
    every live object (20-100 ms in a busy worker), so while calls are live it runs at most once per
    ``full_interval_s``; with no call live it runs as soon as it is due. Ended calls are freed by reference
    counting (ADR 0006), so full passes only reclaim cycles nobody planned for. A tick that ended late
    defers the young passes, unless ``defer_limit`` times the generation-0 threshold has piled up.
    """

    thresholds: tuple[int, int, int] = (700, 10, 10)
    full_interval_s: float = 120.0
    defer_limit: int = 20

    def __post_init__(self) -> None:
        if min(self.thresholds) < 1:
            raise ValueError(f"collector thresholds must be >= 1, got {self.thresholds}")
        if self.full_interval_s <= 0:
            raise ValueError(f"full_interval_s must be > 0, got {self.full_interval_s}")
        if self.defer_limit < 1:
            raise ValueError(f"defer_limit must be >= 1, got {self.defer_limit}")


def due_generation(
    counts: tuple[int, int, int], policy: CollectorPolicy, *, idle: bool, late: bool, since_full_s: float
) -> int | None:
    """The generation to collect now (0, 1 or 2), or None.

    ``counts`` is ``gc.get_count()``: tracked allocations since the last generation-0 pass, generation-0
    passes since the last generation-1 pass, generation-1 passes since the last full one. ``late``: the tick
    ended after the next deadline. ``since_full_s``: seconds since the last full pass.
    """
    allocated, young_passes, middle_passes = counts
    t0, t1, t2 = policy.thresholds
    if allocated <= t0:
        return None
    if late and allocated <= t0 * policy.defer_limit:
        return None
    if young_passes <= t1:
        return 0
    if middle_passes > t2 and (idle or since_full_s >= policy.full_interval_s):
        return 2
    return 1


Observe = Callable[[int, float, bool], None]  # (generation, seconds, paced)


@dataclass(slots=True)
class _Switch:
    """Process-wide: the automatic collector is off while any PacedCollector is open."""

    holders: int = 0
    was_enabled: bool = True
    observe: Observe | None = None
    pacing: bool = False
    started: float = 0.0

    def on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
        elif self.observe is not None:
            self.observe(info["generation"], time.perf_counter() - self.started, self.pacing)


_switch = _Switch()


class PacedCollector:
    """Runs the cyclic collector's passes after media ticks; the automatic collector is off while any is open.

    One per media worker; several in one process (tests) share the switch: the first :meth:`open` turns the
    automatic collector off and starts ``observe`` hearing every pass in the process (paced or not, with its
    duration); the last :meth:`close` restores what was there before.
    """

    def __init__(
        self,
        policy: CollectorPolicy | None = None,
        *,
        observe: Observe | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy if policy is not None else CollectorPolicy(thresholds=gc.get_threshold())
        self._observe = observe
        self._monotonic = monotonic
        self._open = False
        self._held = 0
        self._last_full = monotonic()
        self.passes = [0, 0, 0]  # paced passes by generation

    @property
    def is_open(self) -> bool:
        return self._open

    def open(self) -> None:
        if self._open:
            return
        self._open = True
        if _switch.holders == 0:
            _switch.was_enabled = gc.isenabled()
            gc.disable()
            _switch.observe = self._observe
            gc.callbacks.append(_switch.on_gc)
        _switch.holders += 1

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        _switch.holders -= 1
        if _switch.holders == 0:
            with contextlib.suppress(ValueError):
                gc.callbacks.remove(_switch.on_gc)
            _switch.observe = None
            if _switch.was_enabled:
                gc.enable()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """No paced pass inside the block (a test that needs objects to be freed by reference counting alone)."""
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1

    def after_tick(self, *, idle: bool, late: bool) -> int | None:
        """Run the pass that is due, if any; returns its generation."""
        if not self._open or self._held:
            return None
        now = self._monotonic()
        generation = due_generation(
            gc.get_count(), self.policy, idle=idle, late=late, since_full_s=now - self._last_full
        )
        if generation is None:
            return None
        _switch.pacing = True
        try:
            gc.collect(generation)
        finally:
            _switch.pacing = False
        if generation == 2:
            self._last_full = self._monotonic()
        self.passes[generation] += 1
        return generation
