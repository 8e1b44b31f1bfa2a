"""``create_app``: the control plane as one FastAPI application.

Mounted here: the ops API (``/v1``), SSE (``/v1/events``), the worker endpoints (``/internal/v1``),
``/metrics``, ``/healthz``, ``/readyz`` and the dashboard (``/dashboard``). Extra routers — the WebRTC
offer endpoint — are passed as ``routers=`` (or ``app.include_router`` later); they get the plane with
``Depends(gateway.control.api.get_plane)`` and authenticate with ``Depends(require_api_token)``.
``startup`` hooks run inside the app's lifespan with the plane (``gateway run`` starts its in-process
worker there, and registers it through :class:`gateway.fleet.InProcessControlLink`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from importlib import resources
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel

from gateway.control import api, call_hook, call_hook_client, events, internal, recordings, webhooks_api
from gateway.control.auth import require_api_token
from gateway.control.config import GatewayConfig, load_config
from gateway.control.history import CallHistory
from gateway.control.plane import ControlPlane
from gateway.control.settings import ControlSettings
from gateway.control.store import MemoryStore, StateStore
from gateway.control.webhooks import EventWebhookSettings, Webhooks, endpoints_of
from gateway.fleet.errors import CallNotFoundError, CommandRejectedError, LinkError, WorkerNotFoundError
from gateway.fleet.json_errors import error_response, install_json_errors
from gateway.observability import REGISTRY, exposition
from gateway.records import Database, DatabaseError, DatabaseTooNewError, RecordWriter, RetentionJob, open_database

log = logging.getLogger(__name__)

StartupHook = Callable[[ControlPlane], Awaitable[None]]

# How long a stopping plane waits for the record writer to write what it holds.
RECORDS_FLUSH_S = 5.0

STATIC_DIR = resources.files("gateway.control") / "static"
_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


class Health(BaseModel):
    status: str
    auth_required: bool


class Readiness(BaseModel):
    ready: bool
    workers_up: int
    shutting_down: bool


def build_store(settings: ControlSettings, config: GatewayConfig) -> StateStore:
    if settings.redis_url:
        from gateway.control.redis_store import RedisStore

        return RedisStore(
            settings.redis_url,
            ring_size=config.fleet.event_ring_size,
            ended_retention=config.fleet.ended_call_retention,
        )
    return MemoryStore(ring_size=config.fleet.event_ring_size, ended_retention=config.fleet.ended_call_retention)


def create_app(
    settings: ControlSettings | None = None,
    *,
    config: GatewayConfig | None = None,
    store: StateStore | None = None,
    clock: Callable[[], float] = time.time,
    routers: Sequence[APIRouter] = (),
    startup: Sequence[StartupHook] = (),
    sweeper: bool = True,
    records: bool = True,
    webhook_settings: EventWebhookSettings | None = None,
) -> FastAPI:
    """Build the control-plane app. Config comes from ``settings.config`` (TOML) unless given.

    ``records``: the lifespan opens (and migrates) the database of calls and writes ended calls to it.
    """
    settings = settings or ControlSettings()
    config = config or load_config(settings.config)
    owns_store = store is None
    store = store or build_store(settings, config)
    plane = ControlPlane(config, store, token=settings.token, clock=clock)
    history = CallHistory(plane)
    webhook_settings = webhook_settings or EventWebhookSettings()
    secret = settings.webhook_secret.get_secret_value() if settings.webhook_secret is not None else None
    webhooks = Webhooks(
        endpoints_of(config, webhook_settings, secret),
        webhook_settings,
        clock=clock,
        lease=lambda ttl_s: plane.store.try_lock("webhooks", ttl_s=ttl_s),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        plane.shutting_down.clear()  # a host may run the lifespan again after a shutdown
        async with contextlib.AsyncExitStack() as stack:
            if records:
                await stack.enter_async_context(_records(settings, plane, history, webhooks, clock))
            await stack.enter_async_context(call_hook_client.attached(plane, settings))
            sweeper_task = asyncio.create_task(plane.run_sweeper(), name="control-sweeper") if sweeper else None
            try:
                for hook in startup:
                    await hook(plane)
                yield
            finally:
                plane.shutting_down.set()
                if sweeper_task is not None:
                    sweeper_task.cancel()
                    await asyncio.gather(sweeper_task, return_exceptions=True)
                await plane.aclose()
        if owns_store:
            await store.aclose()

    app = FastAPI(
        title="Voice gateway control plane",
        version="0.1.0",
        description=(
            "Ops API of the telephony gateway for realtime AI voice agents. Authenticate with "
            '`Authorization: Bearer <GATEWAY_API_TOKEN>`. Errors are always `{"error": {"code", "message"}}`.'
        ),
        lifespan=lifespan,
        webhooks=call_hook.webhooks,
    )
    app.state.plane = plane
    app.state.history = history
    app.state.webhooks = webhooks
    app.state.settings = settings
    app.state.token = settings.token
    app.state.clock = clock
    install_json_errors(app)
    _install_fleet_errors(app)

    app.include_router(events.router)
    app.include_router(api.router)
    app.include_router(recordings.router)
    app.include_router(webhooks_api.router)
    app.include_router(internal.router)
    for extra in routers:
        app.include_router(extra)
    _add_operational_routes(app, settings)
    _add_dashboard(app)
    return app


@contextlib.asynccontextmanager
async def _records(
    settings: ControlSettings,
    plane: ControlPlane,
    history: CallHistory,
    webhooks: Webhooks,
    clock: Callable[[], float],
) -> AsyncIterator[None]:
    """The database of calls for the app's life: opened and migrated, its writer and retention job running.

    A database a newer gateway migrated stops the start-up. One that cannot be reached does not: calls need the
    plane more than their records, so it starts, its ended calls wait in the writer's backlog, and the database
    is opened again with backoff until it answers. The event webhooks' outbox is in it (:mod:`.webhooks`).
    """
    writer = RecordWriter(None, capacity=settings.db_write_backlog, clock=clock, outbox=webhooks.feed)
    plane.records = writer
    if webhooks.endpoints:
        plane.event_tap = webhooks.feed
    tasks = {asyncio.create_task(writer.run(), name="records-writer")}
    opened: list[Database] = []

    def start(database: Database) -> None:
        opened.append(database)
        writer.attach(database)
        history.attach(database, writer)
        tasks.update(webhooks.start(database))
        if settings.retention_days > 0:
            retention = RetentionJob(
                database,
                retention_days=settings.retention_days,
                clock=clock,
                lease=lambda ttl_s: plane.store.try_lock("retention", ttl_s=ttl_s),
                recordings_dir=settings.recordings_path,
            )
            tasks.add(asyncio.create_task(retention.run(), name="records-retention"))

    async def open_later(first_error: DatabaseError) -> None:
        delay = 1.0
        error: DatabaseError = first_error
        while True:
            log.error("the database of calls cannot be opened (records wait; next try in %.0f s): %s", delay, error)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)
            try:
                database = await open_database(settings.records_url)
            except DatabaseTooNewError as exc:
                log.error("the database of calls is refused, records are not kept: %s", exc)
                return
            except DatabaseError as exc:
                error = exc
                continue
            log.warning("the database of calls is open; %d records waiting are written now", writer.backlog)
            start(database)
            return

    try:
        try:
            start(await open_database(settings.records_url))
        except DatabaseTooNewError as exc:
            log.error("control plane cannot start: %s", exc)
            raise
        except DatabaseError as exc:
            tasks.add(asyncio.create_task(open_later(exc), name="records-open"))
        yield
    finally:
        plane.records = None
        plane.event_tap = None
        if opened and not await writer.flush(RECORDS_FLUSH_S):
            log.error("stopping with %d call records unwritten: the database of calls is down", writer.backlog)
        elif not opened and writer.backlog:
            log.error("stopping with %d call records unwritten: the database of calls never opened", writer.backlog)
        if opened and webhooks.feed.backlog:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(webhooks.feed.flush(), RECORDS_FLUSH_S)
        history.detach()
        webhooks.stop()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for database in opened:
            await database.aclose()


def _install_fleet_errors(app: FastAPI) -> None:
    async def call_not_found(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, CallNotFoundError)
        return error_response(404, "call_not_found", str(exc), call_id=exc.call_id)

    async def worker_not_found(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, WorkerNotFoundError)
        return error_response(404, "worker_not_found", str(exc), worker_id=exc.worker_id)

    async def rejected(request: Request, exc: Exception) -> JSONResponse:
        return error_response(409, "command_rejected", str(exc))

    async def unreachable(request: Request, exc: Exception) -> JSONResponse:
        log.warning("worker command failed: %s", exc)
        return error_response(502, "worker_unreachable", str(exc))

    app.add_exception_handler(CallNotFoundError, call_not_found)
    app.add_exception_handler(WorkerNotFoundError, worker_not_found)
    app.add_exception_handler(CommandRejectedError, rejected)
    app.add_exception_handler(LinkError, unreachable)


def _add_operational_routes(app: FastAPI, settings: ControlSettings) -> None:
    metrics_deps: list[Any] = [] if settings.metrics_public else [Depends(require_api_token)]

    @app.get("/healthz", response_model=Health, tags=["ops"])
    async def healthz(request: Request) -> Any:
        """Liveness: the process answers. ``auth_required`` tells the dashboard whether to ask for a token."""
        return Health(status="ok", auth_required=bool(request.app.state.token))

    @app.get(
        "/readyz",
        response_model=Readiness,
        tags=["ops"],
        responses={503: {"model": Readiness, "description": "shutting down, or no worker up"}},
    )
    async def readyz(request: Request) -> Any:
        """Readiness: 200 when at least one worker is up (not draining) and the plane is not shutting down."""
        plane: ControlPlane = request.app.state.plane
        workers = await plane.list_workers()
        body = Readiness(
            ready=plane.ready(workers),
            workers_up=sum(1 for w in workers if w.status == "up"),
            shutting_down=plane.shutting_down.is_set(),
        )
        return JSONResponse(body.model_dump(), status_code=200 if body.ready else 503)

    @app.get(
        "/metrics",
        tags=["ops"],
        dependencies=metrics_deps,
        response_class=Response,
        responses={
            200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}}},
            401: {"model": api.ErrorBody},
        },
    )
    async def metrics() -> Response:
        """Prometheus text exposition of the shared registry (token required unless GATEWAY_METRICS_PUBLIC)."""
        return Response(await exposition(REGISTRY), media_type=CONTENT_TYPE_LATEST)


def _add_dashboard(app: FastAPI) -> None:
    static = STATIC_DIR

    @app.get("/dashboard", include_in_schema=False)
    async def dashboard() -> FileResponse:
        return FileResponse(
            str(static / "dashboard.html"), media_type="text/html", headers={"Cache-Control": "no-store"}
        )

    @app.middleware("http")
    async def security_headers(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        response = await call_next(request)
        if request.url.path.startswith("/dashboard"):
            response.headers.update(_SECURITY_HEADERS)
        return response

    app.mount("/dashboard/static", StaticFiles(directory=str(static)), name="dashboard-static")
