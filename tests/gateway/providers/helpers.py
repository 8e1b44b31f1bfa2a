"""Helpers for the provider tests: an event reader with deadlines, caller audio, the OpenAI schema authority."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated, Any, TypeVar, Union, get_args

import numpy as np
from openai.types.realtime import RealtimeClientEvent, RealtimeServerEvent
from pydantic import BaseModel, Field, TypeAdapter
from websockets.server import ServerProtocol

from gateway.providers.base import ProviderEvent

E = TypeVar("E", bound=ProviderEvent)

FRAME_BYTES = 960


class EventReader:
    """Reads one session's events; ``until`` waits (with a deadline) for an event of a given class."""

    def __init__(self, events: AsyncIterator[ProviderEvent]) -> None:
        self._events = events
        self.seen: list[ProviderEvent] = []

    async def next(self, *, within_s: float = 5.0) -> ProviderEvent:
        async with asyncio.timeout(within_s):
            event = await anext(self._events)
        self.seen.append(event)
        return event

    async def until(self, kind: type[E], *, within_s: float = 5.0) -> E:
        async with asyncio.timeout(within_s):
            while True:
                event = await self.next(within_s=within_s)
                if isinstance(event, kind):
                    return event

    def of(self, kind: type[E]) -> list[E]:
        return [e for e in self.seen if isinstance(e, kind)]


def open_server_protocol() -> ServerProtocol:
    """A server-side protocol past its handshake, fed raw client bytes the way a provider reads them."""
    protocol = ServerProtocol(max_size=None)
    protocol.receive_data(
        b"GET / HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    protocol.send_response(protocol.accept(protocol.events_received()[0]))
    protocol.data_to_send()
    return protocol


def noise_frames(count: int, *, seed: int, level: int = 8000) -> list[bytes]:
    """Loud, random (so byte identity means something) 20 ms frames of 24 kHz PCM16."""
    rng = np.random.default_rng(seed)
    return [rng.integers(-level, level, 480, dtype=np.int16).astype("<i2").tobytes() for _ in range(count)]


def silent_frames(count: int) -> list[bytes]:
    return [bytes(FRAME_BYTES)] * count


# ------------------------------------------------------------------------------ OpenAI schema authority


def _discriminated(union_alias: Any) -> TypeAdapter[Any]:
    union, *_ = get_args(union_alias)  # Annotated[Union[...], PropertyInfo(discriminator="type")]
    members = get_args(union)
    return TypeAdapter(Annotated[Union[members], Field(discriminator="type")])  # noqa: UP007


CLIENT_EVENTS = _discriminated(RealtimeClientEvent)
SERVER_EVENTS = _discriminated(RealtimeServerEvent)


def unknown_keys(value: Any, path: str = "$") -> list[str]:
    """Paths of keys the SDK models do not define (openai's models accept and keep extras)."""
    found: list[str] = []
    if isinstance(value, BaseModel):
        found += [f"{path}.{key}" for key in (value.model_extra or {})]
        for name in type(value).model_fields:
            found += unknown_keys(getattr(value, name), f"{path}.{name}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found += unknown_keys(item, f"{path}[{i}]")
    return found


def check_client_event(event: dict[str, Any]) -> None:
    model = CLIENT_EVENTS.validate_python(event)
    assert unknown_keys(model) == [], f"{event['type']}: unknown keys {unknown_keys(model)}"
    assert model.model_dump(mode="json", exclude_unset=True) == event, f"{event['type']} changed on validation"


# The real service puts the session's id and object on session.created/updated; the SDK models the session
# with its request type, which lacks both.
ALLOWED_SERVER_EXTRAS = {"$.session.id", "$.session.object"}


def check_server_event(event: dict[str, Any]) -> None:
    model = SERVER_EVENTS.validate_python(event)
    extra = set(unknown_keys(model)) - ALLOWED_SERVER_EXTRAS
    assert not extra, f"{event['type']}: unknown keys {sorted(extra)}"
