"""Helpers for the cloud adapter tests: draining a port's event iterator with a deadline; the SDK models as the
authority on a message, key for key."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter

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


def _no_extra(value: Any, where: str) -> None:
    if isinstance(value, BaseModel):
        extra = value.model_extra or {}
        assert not extra, f"{where}: keys the SDK model does not know: {sorted(extra)}"
        for name in type(value).model_fields:
            _no_extra(getattr(value, name), f"{where}.{name}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _no_extra(item, f"{where}[{index}]")


def assert_exact(model: Any, message: Mapping[str, Any]) -> Any:
    """``message`` validates against the SDK's ``model`` (a class or a TypeAdapter), knows no key the model does
    not (the SDK models accept unknown keys), and dumps back to itself."""
    parsed = (
        model.validate_python(dict(message)) if isinstance(model, TypeAdapter) else model.model_validate(dict(message))
    )
    _no_extra(parsed, type(parsed).__name__)
    assert parsed.model_dump(by_alias=True, exclude_unset=True) == dict(message)
    return parsed
