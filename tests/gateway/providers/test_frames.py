"""TextFrames against the websockets library: what a server's protocol parses, and what the library would write."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson
import pytest
import websockets.frames
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.frames import Frame, Opcode
from websockets.protocol import State

from gateway.providers._frames import TextFrames
from gateway.providers._link import ProviderLink
from gateway.providers.base import ProviderDisconnected
from tests.gateway.providers.helpers import open_server_protocol

pytestmark = pytest.mark.timeout(30)

# Both sides of each length boundary of RFC 6455 section 5.2: 7-bit, 16-bit and 64-bit payload lengths.
LENGTHS = (0, 1, 125, 126, 1350, 65535, 65536, 70000)


def payload(length: int) -> bytes:
    return bytes((i * 7 + 33) % 94 + 32 for i in range(length))  # printable ASCII, so valid UTF-8 text


@pytest.mark.parametrize("length", LENGTHS)
def test_a_server_reads_each_frame_as_the_text_sent(length: int) -> None:
    server = open_server_protocol()
    frames = TextFrames()
    server.receive_data(frames.frame(payload(length)))
    (received,) = server.events_received()
    assert isinstance(received, Frame)
    assert (received.opcode, received.fin, bytes(received.data)) == (Opcode.TEXT, True, payload(length))
    assert server.state is State.OPEN


@pytest.mark.parametrize("length", LENGTHS)
def test_the_bytes_are_the_libraries_for_the_same_key(length: int, monkeypatch: pytest.MonkeyPatch) -> None:
    frames = TextFrames()
    ours = frames.frame(payload(length))
    header = 2 + (0 if length < 126 else 2 if length < 65536 else 8)
    key = ours[header : header + 4]
    monkeypatch.setattr(websockets.frames.secrets, "token_bytes", lambda n: key)
    assert ours == Frame(Opcode.TEXT, payload(length)).serialize(mask=True)


def test_keys_come_from_one_draw_per_block_and_never_repeat(monkeypatch: pytest.MonkeyPatch) -> None:
    draws: list[int] = []
    real_urandom = os.urandom

    def urandom(n: int) -> bytes:
        draws.append(n)
        return real_urandom(n)

    monkeypatch.setattr("gateway.providers._frames.os.urandom", urandom)
    frames = TextFrames(keys_per_draw=4)
    keys = [frames.frame(b"x")[2:6] for _ in range(10)]
    assert draws == [16, 16, 16]  # frames 1, 5 and 9 drew a block of four keys
    assert len(set(keys)) == 10


def test_a_block_needs_at_least_one_key() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        TextFrames(keys_per_draw=0)


@pytest.fixture
async def echo_url() -> AsyncIterator[str]:
    """A websockets server that sends every text message back, permessage-deflate offered."""

    async def echo(connection: ServerConnection) -> None:
        async for message in connection:
            await connection.send(message)

    async with serve(echo, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        yield f"ws://127.0.0.1:{port}"


@pytest.mark.parametrize("compression", [None, "deflate"])
async def test_send_nowait_messages_arrive_intact_with_and_without_an_extension(
    echo_url: str, compression: str | None
) -> None:
    """Without extensions the link frames itself; with permessage-deflate negotiated the library frames."""
    ws = await connect(echo_url, compression=compression)
    assert bool(ws.protocol.extensions) is (compression is not None)
    received: asyncio.Queue[Mapping[str, Any]] = asyncio.Queue()

    def translate(message: Mapping[str, Any]) -> tuple[()]:
        received.put_nowait(message)
        return ()

    link = ProviderLink(
        ws,
        name="echo",
        translate=translate,
        disconnected=lambda code, reason: ProviderDisconnected(reason=reason, retryable=False),
    )
    link.start()
    try:
        sent = [{"n": i, "pad": "ab" * (i * 900)} for i in range(40)]  # 2 bytes to 70 KB: every length form
        for message in sent:
            assert link.send_nowait(orjson.dumps(message)) is True
        async with asyncio.timeout(5):
            echoed = [await received.get() for _ in sent]
        assert echoed == sent
    finally:
        await link.aclose()
