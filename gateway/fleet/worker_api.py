"""The worker's internal command API: a FastAPI router serving WorkerCommands under ``/internal/v1``.

``gateway worker --control URL`` mounts ``worker_api(commands, token)`` on its own small HTTP server; the
control plane reaches it with :class:`gateway.fleet.http.HttpWorkerCommands`. Command errors are answered as
``{"error": {"code", "message"}}`` directly from the endpoints; mount the router in an app that has
:func:`gateway.fleet.json_errors.install_json_errors` so 401/422 answers share that shape.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Response
from fastapi.responses import JSONResponse

from gateway.fleet.auth import bearer_token, token_matches
from gateway.fleet.compat import LoggedFleetMessageRoute
from gateway.fleet.errors import CallNotFoundError, CommandRejectedError, FleetError
from gateway.fleet.http import INTERNAL_PREFIX
from gateway.fleet.json_errors import ApiError, error_response
from gateway.fleet.models import (
    AgentCommand,
    CallSnapshot,
    DrainRequest,
    DtmfRequest,
    HangupRequest,
    OriginateCommand,
    TransferRequest,
    WarmTransferRequest,
)
from gateway.fleet.protocols import WorkerCommands

log = logging.getLogger(__name__)


async def _run(action: Callable[[], Awaitable[Any]]) -> Any:
    """Run a command and translate fleet errors into JSON error answers."""
    try:
        return await action()
    except CallNotFoundError as exc:
        return error_response(404, "call_not_found", str(exc), call_id=exc.call_id)
    except CommandRejectedError as exc:
        return error_response(409, "command_rejected", str(exc))
    except FleetError as exc:
        log.warning("worker command failed: %s", exc)
        return error_response(502, "command_failed", str(exc))


def worker_health(readiness: Callable[[], dict[str, Any]]) -> APIRouter:
    """``/healthz`` and ``/readyz`` for probes (no token: they say nothing a caller could use).

    ``/healthz``: 200 while the worker's loop answers. ``/readyz``: ``readiness()`` as JSON, 200 when its
    ``ready`` is true, else 503 (draining, closing, or its control plane unreachable)."""
    router = APIRouter(tags=["worker-health"])

    @router.get("/healthz")
    async def healthz() -> Any:
        return {"ok": True}

    @router.get("/readyz")
    async def readyz() -> Any:
        state = readiness()
        return JSONResponse(state, status_code=200 if state.get("ready") else 503)

    return router


def worker_api(commands: WorkerCommands, token: str | None) -> APIRouter:
    """A router serving ``commands`` (with bearer-token auth when ``token`` is set)."""

    async def require_token(authorization: Annotated[str | None, Header()] = None) -> None:
        if not token_matches(bearer_token(authorization), token):
            raise ApiError(401, "unauthorized", "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    # The plane may run a newer version (updated before its workers): fields it added are ignored and logged.
    router = APIRouter(
        prefix=INTERNAL_PREFIX,
        dependencies=[Depends(require_token)],
        tags=["worker-internal"],
        route_class=LoggedFleetMessageRoute,
    )

    @router.post("/calls/{call_id}/hangup", status_code=204, response_model=None)
    async def hang_up(call_id: str, body: HangupRequest) -> Any:
        result = await _run(lambda: commands.hang_up(call_id, body.reason))
        return result if isinstance(result, Response) else Response(status_code=204)

    @router.post("/calls/{call_id}/transfer", status_code=204, response_model=None)
    async def transfer(call_id: str, body: TransferRequest) -> Any:
        result = await _run(lambda: commands.transfer(call_id, body.target))
        return result if isinstance(result, Response) else Response(status_code=204)

    @router.post("/calls/{call_id}/dtmf", status_code=204, response_model=None)
    async def send_dtmf(call_id: str, body: DtmfRequest) -> Any:
        result = await _run(lambda: commands.send_dtmf(call_id, body.digits))
        return result if isinstance(result, Response) else Response(status_code=204)

    @router.post("/calls/{call_id}/hold", status_code=204, response_model=None)
    async def hold(call_id: str) -> Any:
        result = await _run(lambda: commands.hold(call_id, True))
        return result if isinstance(result, Response) else Response(status_code=204)

    @router.post("/calls/{call_id}/unhold", status_code=204, response_model=None)
    async def unhold(call_id: str) -> Any:
        result = await _run(lambda: commands.hold(call_id, False))
        return result if isinstance(result, Response) else Response(status_code=204)

    @router.post("/calls/{call_id}/warm_transfer", status_code=202, response_model=None)
    async def warm_transfer(call_id: str, body: WarmTransferRequest) -> Any:
        result = await _run(lambda: commands.warm_transfer(call_id, body))
        if isinstance(result, Response):
            return result
        return JSONResponse(result.model_dump(mode="json"), status_code=202)

    @router.post("/calls/{call_id}/warm_transfer/join", status_code=202, response_model=None)
    async def warm_transfer_join(call_id: str) -> Any:
        joined = await _run(lambda: commands.warm_transfer_join(call_id))
        return joined if isinstance(joined, Response) else JSONResponse(joined.model_dump(mode="json"), status_code=202)

    @router.post("/calls/{call_id}/agent", status_code=204, response_model=None)
    async def command_agent(call_id: str, body: AgentCommand) -> Any:
        result = await _run(lambda: commands.command_agent(call_id, body))
        return result if isinstance(result, Response) else Response(status_code=204)

    @router.post("/originate", status_code=201, response_model=None)
    async def originate(body: OriginateCommand) -> Any:
        result = await _run(lambda: commands.originate(body.request, body.admission))
        return result if isinstance(result, Response) else JSONResponse({"call_id": result}, status_code=201)

    @router.post("/drain", status_code=204, response_model=None)
    async def drain(body: DrainRequest) -> Any:
        result = await _run(lambda: commands.drain(body.exit_when_empty, body.deadline_s))
        return result if isinstance(result, Response) else Response(status_code=204)

    @router.get("/calls", response_model=list[CallSnapshot])
    async def snapshot() -> Any:
        result = await _run(commands.snapshot)
        if isinstance(result, Response):
            return result
        return JSONResponse([call.wire() for call in result])

    return router
