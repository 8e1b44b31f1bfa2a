"""The pipeline session tests' event reader: waits for an event of a class with given attributes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from gateway.providers.base import ProviderEvent

E = TypeVar("E", bound=ProviderEvent)


def _type_name(event: ProviderEvent) -> str:
    return type(event).__name__


class Reader:
    """Reads one session's events; ``until`` fails with the events seen, each shown by ``describe``."""

    def __init__(
        self,
        events: AsyncIterator[ProviderEvent],
        *,
        within_s: float = 5.0,
        describe: Callable[[ProviderEvent], str] = _type_name,
    ) -> None:
        self._events = events
        self._within_s = within_s
        self._describe = describe
        self.seen: list[ProviderEvent] = []

    async def until(self, kind: type[E], *, within_s: float | None = None, **match: Any) -> E:
        try:
            async with asyncio.timeout(self._within_s if within_s is None else within_s):
                async for event in self._events:
                    self.seen.append(event)
                    if isinstance(event, kind) and all(getattr(event, k) == v for k, v in match.items()):
                        return event
        except TimeoutError:
            pass
        raise AssertionError(f"no {kind.__name__} {match}; saw {[self._describe(e) for e in self.seen]}")
