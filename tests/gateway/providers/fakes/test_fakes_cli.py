"""``python -m gateway.providers.fakes VENDOR`` serves a fake in its own process until SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import pytest

from gateway.providers.fakes import speech
from gateway.providers.pipeline.cloud.cartesia import CartesiaConfig, CartesiaTts
from gateway.providers.pipeline.ports import TtsDone
from tests.gateway.providers.pipeline.cloud.helpers import drain

pytestmark = pytest.mark.timeout(60)


async def test_a_fake_process_serves_the_adapter_and_stops_on_sigterm() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.providers.fakes",
        "cartesia",
        "--pace",
        "0",
        "--api-key",
        "ca",
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(30):
            line = (await process.stdout.readline()).decode().strip()
        assert line.startswith("listening ws://127.0.0.1:")
        base_url = line.split(" ", 1)[1]
        tts = CartesiaTts(CartesiaConfig(url=f"{base_url}/tts/websocket", api_key="ca", voice="v"))
        stream = await tts.open("item-1")
        await stream.push("Hello from another process. ")
        await stream.flush()
        events = await drain(stream.events())
        await tts.aclose()
        assert isinstance(events[-1], TtsDone)
        heard = sum(len(e.pcm) for e in events if hasattr(e, "pcm"))
        assert heard == len(speech.render("Hello from another process. ")[0])
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(10):
            code = await process.wait()
    assert code == 0
