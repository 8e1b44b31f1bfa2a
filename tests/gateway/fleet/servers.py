"""Real loopback uvicorn servers for tests: random port on 127.0.0.1, started and stopped in the test."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import uvicorn


class _QuietServer(uvicorn.Server):
    """Leaves the test process's signal handlers alone."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def serve(app: Any, *, startup_timeout_s: float = 10.0) -> AsyncIterator[str]:
    """Run ``app`` on 127.0.0.1:<free port> in this loop; yields the base URL; stops it on exit."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    server = _QuietServer(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name=f"uvicorn-{port}")
    try:
        async with asyncio.timeout(startup_timeout_s):
            while not server.started:
                if task.done():
                    task.result()
                    raise RuntimeError("uvicorn exited during start-up")
                await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        try:
            async with asyncio.timeout(10):
                await task
        finally:
            sock.close()
