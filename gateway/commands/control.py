"""``gateway control``: run the control plane alone (ops API, SSE, metrics, dashboard) with uvicorn.

Host, port and token come from the GATEWAY_* environment (see gateway.control.settings), overridable by
flags. Without GATEWAY_API_TOKEN it binds loopback only and says so; a non-loopback bind without a
token is refused with exit status 2. SIGINT/SIGTERM stop it cleanly: event streams are closed first,
then uvicorn finishes in-flight requests (bounded), then the lifespan closes the state store; exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

log = logging.getLogger("gateway.control")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="bind address (default: GATEWAY_HTTP_HOST or 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default: GATEWAY_HTTP_PORT or 8080)")
    parser.add_argument("--config", help="routes/profiles TOML (default: GATEWAY_CONFIG or the built-in echo config)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def main(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from gateway.commands._serve import serve
    from gateway.control.app import create_app
    from gateway.control.config import ConfigError
    from gateway.control.settings import ControlSettings, InsecureBindError, check_bind
    from gateway.tracing import configure_tracing, log_format

    logging.basicConfig(level=args.log_level.upper(), format=log_format(configure_tracing("gateway-control")))
    overrides = {
        key: value
        for key, value in (("http_host", args.host), ("http_port", args.port), ("config", args.config))
        if value is not None
    }
    try:
        settings = ControlSettings(**overrides)
        mode = check_bind(settings)
        app = create_app(settings)
    except (ConfigError, InsecureBindError) as exc:
        print(f"gateway control: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:
        print(f"gateway control: bad GATEWAY_* setting: {exc}", file=sys.stderr)
        return 2
    log.info("%s", mode)
    log.info("control plane on http://%s:%d (dashboard: /dashboard)", settings.http_host, settings.http_port)

    plane = app.state.plane

    async def stop_streams(_reason: str) -> None:
        plane.shutting_down.set()  # ends the SSE streams so the connections can close

    started = asyncio.run(
        serve(app, host=settings.http_host, port=settings.http_port, log_level=args.log_level, on_stop=stop_streams)
    )
    if not started:
        return 1
    log.info("control plane stopped")
    return 0
