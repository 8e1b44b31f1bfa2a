"""Helpers for the cloud adapter tests: draining a port's event iterator with a deadline."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

T = TypeVar("T")


async def drain(events: AsyncIterator[T], *, within_s: float = 10.0) -> list[T]:
    """Every event until the iterator ends."""
    out: list[T] = []
    async with asyncio.timeout(within_s):
        async for event in events:
            out.append(event)
    return out


async def until(events: AsyncIterator[T], kind: type, *, within_s: float = 10.0) -> list[T]:
    """Events up to and including the first of ``kind``."""
    out: list[T] = []
    async with asyncio.timeout(within_s):
        async for event in events:
            out.append(event)
            if isinstance(event, kind):
                return out
    raise AssertionError(f"events ended before a {kind.__name__}: {out!r}")
