"""The cyclic garbage collector in a media process: the frozen start-up heap (docs/adr/0006-gc-freeze.md) and
full passes paced by the media clock (docs/adr/0010-full-collections-paced-by-the-tick.md).

A full (generation 2) pass walks every live object: 30-95 ms in a worker that holds a few thousand SIP
transactions for their 32 s, long enough to hold back every live call's next frames. CPython starts one from
whichever allocation crosses its thresholds, every 10-30 s at 50 calls a second. :class:`PacedCollector`
keeps CPython's generation-0 passes as they are and takes the others over. A full pass runs right after a media
tick, as soon as one is due while no call is live, and at most once per ``full_interval_s`` while calls are. A
middle (generation 1) pass walks what survived the young passes since the last one: 3-4 ms with 400 calls up,
enough to push a 17 ms tick past its deadline wherever it lands. It runs after a tick that left room for it before
the next deadline, and at the latest once CPython would have run ``middle_overdue`` of them.
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
    """When :class:`PacedCollector` runs a full pass.

    ``full_after`` is CPython's third threshold: generation-1 passes since the last full one before another is
    due. While calls are live a due pass waits until ``full_interval_s`` has passed since the last one; with no
    call live it runs at once. Ended calls are freed by reference counting (ADR 0006), so while calls are live
    full passes only reclaim cycles nobody planned for, and the interval bounds how long those wait.
    """

    full_after: int = 10
    full_interval_s: float = 120.0
    # CPython's second threshold: generation-0 passes since the last middle pass before another is due. A due
    # pass waits for a tick that leaves it room, but never past ``middle_overdue`` times that many.
    middle_after: int = 10
    middle_overdue: int = 4

    def __post_init__(self) -> None:
        if self.full_after < 0:
            raise ValueError(f"full_after must be >= 0, got {self.full_after}")
        if self.full_interval_s <= 0:
            raise ValueError(f"full_interval_s must be > 0, got {self.full_interval_s}")
        if self.middle_after < 1:
            raise ValueError(f"middle_after must be >= 1, got {self.middle_after}")
        if self.middle_overdue < 1:
            raise ValueError(f"middle_overdue must be >= 1, got {self.middle_overdue}")


def full_pass_due(middle_passes: int, policy: CollectorPolicy, *, idle: bool, late: bool, since_full_s: float) -> bool:
    """Whether to run a full pass now, after a tick.

    ``middle_passes`` is ``gc.get_count()[2]``: generation-1 passes since the last full one. ``late``: the tick
    ended after the next deadline (a full pass now would hold back the ticks catching up). ``since_full_s``:
    seconds since the last full pass.
    """
    if late or middle_passes <= policy.full_after:
        return False
    return idle or since_full_s >= policy.full_interval_s


def middle_pass_due(young_passes: int, policy: CollectorPolicy, *, slack_s: float | None, expected_s: float) -> bool:
    """Whether to run a middle (generation 1) pass now, after a tick.

    ``young_passes`` is ``gc.get_count()[1]``: generation-0 passes since the last middle one. ``slack_s``: time
    left before the next tick's deadline (None: unknown, run when due). ``expected_s``: how long the last middle
    pass took; the pass runs when twice that and a millisecond fit in the slack, or once it is overdue.
    """
    if young_passes <= policy.middle_after:
        return False
    if young_passes > policy.middle_after * policy.middle_overdue or slack_s is None:
        return True
    return slack_s >= 2 * expected_s + 0.001


def cpython_policy(*, full_interval_s: float = 120.0) -> CollectorPolicy:
    """The policy with CPython's own thresholds for when a pass is due (those it had before any collector
    opened: an open one holds its second and third out of reach)."""
    _, middle, full = _switch.saved if _switch.holders else gc.get_threshold()
    return CollectorPolicy(full_after=full, full_interval_s=full_interval_s, middle_after=max(1, middle))


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
    """Runs the collector's middle and full passes after media ticks; CPython keeps running generation 0's.

    One per media worker; several in one process (tests) share the switch: the first :meth:`open` moves CPython's
    second and third thresholds out of reach and starts ``observe`` hearing every pass in the process (paced or
    not, with its duration); the last :meth:`close` restores the thresholds.
    """

    def __init__(
        self,
        policy: CollectorPolicy | None = None,
        *,
        observe: Observe | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy if policy is not None else cpython_policy()
        self._observe = observe
        self._monotonic = monotonic
        self._open = False
        self._held = 0
        self._last_full = monotonic()
        self.full_passes = 0
        self.middle_passes = 0
        self._middle_s = 0.002  # how long the last paced middle pass took

    def open(self) -> None:
        if self._open:
            return
        self._open = True
        if _switch.holders == 0:
            _switch.saved = gc.get_threshold()
            young, _, _ = _switch.saved
            gc.set_threshold(young, _NEVER, _NEVER)
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

    def after_tick(self, *, idle: bool, late: bool, slack_s: float | None = None) -> bool:
        """Run a full or a middle pass if one is due; True if one ran. ``slack_s``: time left before the next
        tick's deadline (None: unknown)."""
        if not self._open or self._held or not gc.isenabled() or late:
            return False
        _, young_passes, middle_passes = gc.get_count()
        now = self._monotonic()
        if full_pass_due(middle_passes, self.policy, idle=idle, late=late, since_full_s=now - self._last_full):
            self._collect(2)
            self._last_full = self._monotonic()
            self.full_passes += 1
            return True
        if middle_pass_due(young_passes, self.policy, slack_s=slack_s, expected_s=self._middle_s):
            started = time.perf_counter()
            self._collect(1)
            self._middle_s = time.perf_counter() - started
            self.middle_passes += 1
            return True
        return False

    @staticmethod
    def _collect(generation: int) -> None:
        _switch.pacing = True
        try:
            gc.collect(generation)
        finally:
            _switch.pacing = False
