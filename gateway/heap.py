"""The cyclic garbage collector in a media process: the frozen start-up heap (docs/adr/0006-gc-freeze.md) and
full passes paced by the media clock (docs/adr/0010-full-collections-paced-by-the-tick.md).

A full (generation 2) pass walks every live object: 30-95 ms in a worker that holds a few thousand SIP
transactions for their 32 s, long enough to hold back every live call's next frames. CPython starts one from
whichever allocation crosses its thresholds, every 10-30 s at 50 calls a second. :class:`PacedCollector`
keeps CPython's young-generation passes as they are and takes the full passes over: right after a media
tick, as soon as one is due while no call is live, and at most once per ``full_interval_s`` while calls are.
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

    A full (generation 2) collection walks every tracked object; with the start-up heap that took several
    ticks (docs/adr/0006-gc-freeze.md): one stalled 20 ms clock that late, and a burst of late RTP on every
    call after it. Frozen objects are never walked or freed, so this runs once per process,
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
    """When :class:`PacedCollector` runs a full pass.

    ``full_after`` is CPython's third threshold: generation-1 passes since the last full one before another is
    due. While calls are live a due pass waits until ``full_interval_s`` has passed since the last one; with no
    call live it runs at once. Ended calls are freed by reference counting (ADR 0006), so while calls are live
    full passes only reclaim cycles nobody planned for, and the interval bounds how long those wait.

    ``middle_after`` is CPython's second threshold while the collector is open: young passes before a middle
    (generation-1) one, which walks what outlived the young passes since the last. None keeps CPython's.
    """

    full_after: int = 10
    full_interval_s: float = 120.0
    middle_after: int | None = None

    def __post_init__(self) -> None:
        if self.full_after < 0:
            raise ValueError(f"full_after must be >= 0, got {self.full_after}")
        if self.middle_after is not None and self.middle_after < 1:
            raise ValueError(f"middle_after must be >= 1, got {self.middle_after}")
        if self.full_interval_s <= 0:
            raise ValueError(f"full_interval_s must be > 0, got {self.full_interval_s}")


def full_pass_due(middle_passes: int, policy: CollectorPolicy, *, idle: bool, late: bool, since_full_s: float) -> bool:
    """Whether to run a full pass now, after a tick.

    ``middle_passes`` is ``gc.get_count()[2]``: generation-1 passes since the last full one. ``late``: the tick
    ended after the next deadline (a full pass now would hold back the ticks catching up). ``since_full_s``:
    seconds since the last full pass.
    """
    if late or middle_passes <= policy.full_after:
        return False
    return idle or since_full_s >= policy.full_interval_s


Observe = Callable[[int, float, bool], None]  # (generation, seconds, paced)

# CPython never starts a full pass by itself while a PacedCollector is open: its third threshold is out of reach.
_NEVER = 1 << 30


@dataclass(slots=True)
class _Switch:
    """Process-wide: CPython's automatic full passes are off while any PacedCollector is open."""

    holders: int = 0
    saved: tuple[int, int, int] = (700, 10, 10)
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
    """Runs the collector's full passes after media ticks; CPython keeps running the young generations' passes.

    One per media worker; several in one process (tests) share the switch: the first :meth:`open` moves CPython's
    third threshold out of reach and starts ``observe`` hearing every pass in the process (paced or not, with
    its duration); the last :meth:`close` restores the thresholds.
    """

    def __init__(
        self,
        policy: CollectorPolicy | None = None,
        *,
        observe: Observe | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy if policy is not None else CollectorPolicy(full_after=gc.get_threshold()[2])
        self._observe = observe
        self._monotonic = monotonic
        self._open = False
        self._held = 0
        self._last_full = monotonic()
        self.full_passes = 0

    def open(self) -> None:
        if self._open:
            return
        self._open = True
        if _switch.holders == 0:
            _switch.saved = gc.get_threshold()
            young, middle, _ = _switch.saved
            gc.set_threshold(young, self.policy.middle_after or middle, _NEVER)
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
            gc.set_threshold(*_switch.saved)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """No paced pass inside the block (a test that needs objects to be freed by reference counting alone)."""
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1

    def after_tick(self, *, idle: bool, late: bool) -> bool:
        """Run a full pass if one is due; True if it ran."""
        if not self._open or self._held or not gc.isenabled():
            return False
        now = self._monotonic()
        if not full_pass_due(gc.get_count()[2], self.policy, idle=idle, late=late, since_full_s=now - self._last_full):
            return False
        _switch.pacing = True
        try:
            gc.collect()
        finally:
            _switch.pacing = False
        self._last_full = self._monotonic()
        self.full_passes += 1
        return True
