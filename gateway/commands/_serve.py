"""Running an HTTP app and a media worker in one event loop, with clean SIGINT/SIGTERM handling.

uvicorn's own signal handling re-raises the signal after shutdown (the process would die by SIGTERM);
here the loop's handlers first let ``on_stop`` end the calls, then ask uvicorn to finish in-flight requests.
``on_stop`` is told why: ``"SIGTERM"`` (an orchestrator's stop: a media worker drains, its calls run up to
the drain deadline), ``"SIGINT"`` (Ctrl-C: calls are ended at once, BYE to every caller) or ``"drained"``
(``stop_when`` was set). A second signal forces the exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

log = logging.getLogger("gateway")

# Idle keep-alive connections are closed after this long. uvicorn's default (5 s) equals the idle expiry of
# httpx's and many clients' pools, so a client could reuse a connection in the instant the server closed it
# and get "Server disconnected without sending a response"; the server must keep them longer than clients do.
KEEP_ALIVE_S = 30


def run_loop(main: Callable[[], Awaitable[int]], *, use_uvloop: bool = True) -> int:
    """asyncio.run with uvloop when it is installed and wanted."""
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run(main())  # type: ignore[no-any-return]
    return asyncio.run(main())  # type: ignore[arg-type]


async def serve(
    app: Any,
    *,
    host: str,
    port: int,
    log_level: str,
    on_stop: Callable[[str], Awaitable[None]],
    stop_when: asyncio.Event | None = None,
    stop_timeout_s: Callable[[str], float] = lambda _reason: 15.0,
) -> bool:
    """Serve ``app`` until a signal (or ``stop_when``); run ``on_stop(reason)`` before uvicorn shuts down, for at
    most ``stop_timeout_s(reason)`` seconds."""
    import uvicorn

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=5,
        timeout_keep_alive=KEEP_ALIVE_S,
        lifespan="on",
        proxy_headers=False,
    )
    stopping: list[asyncio.Task[None]] = []

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            loop = asyncio.get_running_loop()

            def stop(reason: str) -> None:
                if stopping:
                    log.warning("%s again: forcing exit", reason)
                    self.force_exit = True
                    self.should_exit = True
                    return
                if reason == "SIGTERM":
                    log.info("%s: draining, then shutting down (a second signal forces the exit)", reason)
                else:
                    log.info("%s: ending calls and shutting down", reason)

                async def shutdown() -> None:
                    try:
                        await asyncio.wait_for(on_stop(reason), timeout=stop_timeout_s(reason))
                    except Exception:
                        log.exception("clean shutdown failed")
                    self.should_exit = True

                stopping.append(loop.create_task(shutdown(), name="shutdown"))

            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop, sig.name)
            watcher = None
            if stop_when is not None:

                async def watch() -> None:
                    await stop_when.wait()
                    if not stopping:  # else a SIGTERM drain emptied the worker: its shutdown is under way
                        stop("drained")

                watcher = loop.create_task(watch(), name="stop-watcher")
            try:
                yield
            finally:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(sig)
                if watcher is not None:
                    watcher.cancel()

    server = Server(config)
    await server.serve()
    for task in stopping:
        with contextlib.suppress(Exception):
            await task
    return bool(server.started)
