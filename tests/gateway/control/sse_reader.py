"""A small Server-Sent Events reader for tests: messages and comments, with a deadline on every read."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx


@dataclass
class Message:
    event: str = "message"
    id: str | None = None
    data: str = ""
    comment: str | None = None
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def json(self) -> dict:
        return json.loads(self.data)


class SseReader:
    def __init__(self, response: httpx.Response) -> None:
        self._lines: AsyncIterator[str] = response.aiter_lines()

    async def next(self, deadline_s: float = 5.0) -> Message:
        """The next message or comment; fails the test when none arrives within ``deadline_s``."""
        async with asyncio.timeout(deadline_s):
            message = Message()
            data: list[str] = []
            async for line in self._lines:
                if line == "":
                    if data or message.id is not None or message.event != "message" or message.fields:
                        message.data = "\n".join(data)
                        return message
                    continue
                if line.startswith(":"):
                    return Message(event="", comment=line[1:].strip())
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if name == "data":
                    data.append(value)
                elif name == "id":
                    message.id = value
                elif name == "event":
                    message.event = value
                else:
                    message.fields[name] = value
            raise EOFError("event stream ended")

    async def next_event(self, deadline_s: float = 5.0) -> Message:
        """The next message that is not a comment or a retry hint."""
        async with asyncio.timeout(deadline_s):
            while True:
                message = await self.next(deadline_s)
                if message.comment is None and "retry" not in message.fields:
                    return message
