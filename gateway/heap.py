"""The cyclic garbage collector and a media process's start-up heap (docs/adr/0006-gc-freeze.md)."""

from __future__ import annotations

import gc

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
