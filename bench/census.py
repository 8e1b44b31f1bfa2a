"""What the collector's middle passes walk: a census of the young generations (``gateway bench calls --gc-census``).

A middle (generation 1) pass of CPython's cyclic collector walks every object in generations 0 and 1: what was
made since the last such pass and outlived a young pass. Its length follows their number, so the way to shorten
it is to know which objects they are. At the start of a middle pass, at most once per ``every_s``, the census
counts those objects by kind and appends one JSON line to a file: the wall time, how many objects the pass was
about to walk, and the most common kinds. A tuple's kind names the kinds of its first items, so a queue of
``(frame, item, samples)`` tuples reads as one kind rather than as "tuple".

Counting walks the same objects in Python, about 20 ms for the 20,000 of a 400-call worker, in the pass's
tick: a step with a census measures what is walked, not the overruns.
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_TUPLE_ITEMS = 4  # items of a tuple that name its kind


def kind(obj: object) -> str:
    """The census name of an object: its type's qualified name, a tuple's with the kinds of its first items.

    A tuple's items are read the way the collector reads them (``gc.get_referents``, its traversal), never by
    indexing: the young generations can hold a tuple still being built, whose empty slots are NULL, and
    indexing or slicing it would touch them (a segfault)."""
    if type(obj) is tuple:
        items = gc.get_referents(obj)[::-1]  # a tuple's traversal goes from its last item to its first
        inner = ",".join(type(item).__qualname__ for item in items[:_TUPLE_ITEMS])
        more = f",+{len(items) - _TUPLE_ITEMS}" if len(items) > _TUPLE_ITEMS else ""
        return f"tuple({inner}{more})"
    return type(obj).__qualname__


def count(objects: Iterable[object], *, top: int) -> tuple[int, list[tuple[str, int]]]:
    """How many objects, and the ``top`` most common kinds among them with their counts."""
    kinds = Counter(kind(obj) for obj in objects)
    return sum(kinds.values()), kinds.most_common(top)


class YoungCensus:
    """Appends a census of generations 0 and 1 to ``path`` at the start of a middle pass, at most once per
    ``every_s``. :meth:`install` hooks it into ``gc.callbacks``; :meth:`close` takes it out."""

    def __init__(self, path: Path, *, every_s: float = 2.0, top: int = 12) -> None:
        self.path = path
        self.every_s = every_s
        self.top = top
        self._next = 0.0

    def install(self) -> None:
        gc.callbacks.append(self._on_gc)

    def close(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase != "start" or info["generation"] != 1:
            return
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.every_s
        young = gc.get_objects(0) + gc.get_objects(1)
        walked, kinds = count(young, top=self.top)
        del young
        line = json.dumps({"at": time.time(), "walked": walked, "kinds": kinds})
        with self.path.open("a") as out:
            out.write(line + "\n")


def read(path: Path, *, since: float, until: float) -> list[dict[str, Any]]:
    """The censuses taken in [since, until] (wall time); none when the file does not exist."""
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if since <= record["at"] <= until:
            found.append(record)
    return found


def summary(records: list[dict[str, Any]], *, top: int = 6) -> str:
    """One line: the median number walked and the ``top`` kinds by their median count."""
    if not records:
        return "no middle pass started a census"
    walked = statistics.median(r["walked"] for r in records)
    tables = [dict(r["kinds"]) for r in records]
    names = {name for table in tables for name in table}
    # A kind missing from a census's top list counts 0 there (it was below that census's top).
    medians = {name: statistics.median(table.get(name, 0) for table in tables) for name in names}
    ranked = sorted(((name, n) for name, n in medians.items() if n > 0), key=lambda kv: (-kv[1], kv[0]))[:top]
    kinds = ", ".join(f"{name} {n:.0f}" for name, n in ranked)
    return f"a middle pass walked {walked:.0f} objects (median of {len(records)} censuses); most: {kinds}"
