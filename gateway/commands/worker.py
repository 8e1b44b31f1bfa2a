"""``gateway worker --control URL``: one media worker as its own process.

It registers with the control plane over HTTP, heartbeats its load and calls, asks the plane to admit each
call, and serves the plane's commands (hang up, transfer, DTMF, originate, drain) on a small internal HTTP
API of its own, which also serves this process's ``/metrics``. Both take the same bearer token as the
control plane (GATEWAY_API_TOKEN; ``/metrics`` is open with GATEWAY_METRICS_PUBLIC=true), and every error
is the fleet's JSON shape ``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import AsyncIterator

from gateway.commands import worker_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--control",
        required=True,
        help="control plane base URL, e.g. http://127.0.0.1:8080; several, comma-separated, for replicas sharing"
        " Redis (the worker fails over between them)",
    )
    parser.add_argument("--api-host", default="127.0.0.1", help="bind address of the worker's internal API")
    parser.add_argument("--api-port", type=int, default=8081, help="port of the worker's internal API")
    parser.add_argument("--api-url", help="URL the control plane uses to reach this worker (default from host/port)")
    parser.add_argument(
        "--heartbeat-interval",
        type=float,
        default=1.0,
        help="seconds between heartbeats (keep it at or below the control plane's fleet.heartbeat_interval_s)",
    )
    parser.add_argument("--config", help="the routes file whose [trunks] the worker takes (default: GATEWAY_CONFIG)")
    worker_args.add_worker_arguments(parser)


def main(args: argparse.Namespace) -> int:
    from fastapi import FastAPI, Request, Response
    from prometheus_client import CONTENT_TYPE_LATEST
    from pydantic import ValidationError

    from gateway.commands._serve import run_loop, serve
    from gateway.control.settings import ControlSettings, is_loopback
    from gateway.fleet.auth import bearer_token, token_matches
    from gateway.fleet.http import HttpControlLink
    from gateway.fleet.json_errors import error_response, install_json_errors
    from gateway.fleet.worker_api import worker_api, worker_health
    from gateway.observability import REGISTRY, exposition
    from gateway.providers.errors import ProviderError
    from gateway.worker.worker import MediaWorker

    worker_args.setup_logging(args.log_level)
    if args.log_level != "debug":
        logging.getLogger("httpx").setLevel(logging.WARNING)  # else a line per heartbeat, every second
    try:
        settings = worker_args.worker_settings(args)
        model_factory = worker_args.model_factory(args.provider)
        amd_recognisers = worker_args.amd_recognisers()
        worker_args.preload_local_models()
        control_settings = ControlSettings()
        token = control_settings.token
    except (ValidationError, ProviderError) as exc:
        print(f"gateway worker: bad setting: {exc}", file=sys.stderr)
        return 2
    if token is None and not is_loopback(args.api_host):
        print("gateway worker: refusing a non-loopback internal API without GATEWAY_API_TOKEN", file=sys.stderr)
        return 2
    if not 0.05 <= args.heartbeat_interval <= 60:
        print("gateway worker: --heartbeat-interval must be within 0.05-60 s", file=sys.stderr)
        return 2
    url = args.api_url or f"http://{args.api_host}:{args.api_port}"
    link = HttpControlLink(args.control, token)
    from gateway.transport.tls import TlsConfigError

    try:
        worker = MediaWorker(
            settings,
            model_factory=model_factory,
            link=link,
            url=url,
            heartbeat_s=args.heartbeat_interval,
            amd_recognisers=amd_recognisers,
        )
    except (TlsConfigError, OSError) as exc:
        print(f"gateway worker: SIP over TLS: {exc}", file=sys.stderr)
        return 2

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await worker.start()
        yield

    app = FastAPI(title=f"gateway worker {settings.worker_id}", docs_url=None, redoc_url=None, lifespan=lifespan)
    install_json_errors(app)
    app.include_router(worker_api(worker, token))
    app.include_router(worker_health(worker.readiness))

    async def metrics(request: Request) -> Response:
        # A plain Starlette route: FastAPI would resolve the (string) annotations of a dependency here,
        # whose names are imported inside this function.
        presented = bearer_token(request.headers.get("authorization"))
        if not control_settings.metrics_public and not token_matches(presented, token):
            return error_response(
                401, "unauthorized", "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"}
            )
        # Rendered in slices: this loop runs the media tick (gateway.observability.exposition).
        return Response(await exposition(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    app.add_route("/metrics", metrics, methods=["GET"], include_in_schema=False)

    async def stop(reason: str) -> None:
        if reason == "SIGTERM":  # an orchestrator's stop: drain first (gateway/worker/drain.py)
            await worker.drain(exit_when_empty=True, deadline_s=settings.drain.drain_deadline_s)
            await worker.exited.wait()
        await worker.aclose("shutdown")

    async def amain() -> int:
        try:
            started = await serve(
                app,
                host=args.api_host,
                port=args.api_port,
                log_level=args.log_level,
                on_stop=stop,
                stop_when=worker.exited,
                stop_timeout_s=lambda reason: worker_args.stop_timeout_s(settings, worker.session_config, reason),
            )
        finally:
            await worker.aclose("shutdown")
            await link.aclose()
        return 0 if started else 1

    return run_loop(amain, use_uvloop=not args.no_uvloop)
