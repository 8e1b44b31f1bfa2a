"""The authenticated ops REST API under ``/v1``: calls, workers and the dashboard's SSE session cookie.

Every answer other than 2xx is ``{"error": {"code", "message"}}`` (see :mod:`gateway.fleet.json_errors`).
Commands go to the worker that holds the call (in-process or over HTTP); their effect arrives on
``GET /v1/events`` as ``call.updated`` / ``call.ended``.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from gateway.control.auth import SSE_COOKIE, SSE_COOKIE_PATH, SSE_COOKIE_TTL_S, make_sse_cookie, require_api_token
from gateway.control.plane import ControlPlane
from gateway.fleet.json_errors import ApiError
from gateway.fleet.models import (
    AdmissionDecision,
    AgentCommand,
    AgentUpdateRequest,
    CallCreated,
    CallSnapshot,
    CallState,
    DrainRequest,
    DtmfRequest,
    HangupRequest,
    InjectRequest,
    OriginateRequest,
    SayRequest,
    TransferRequest,
    WorkerInfo,
)


class ErrorDetail(BaseModel):
    code: str = Field(examples=["not_found"])
    message: str = Field(examples=["no call 'c-123'"])


class ErrorBody(BaseModel):
    """The shape of every error answer."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"error": {"code": "unauthorized", "message": "missing or wrong bearer token"}}]
        }
    )

    error: ErrorDetail


class CallPage(BaseModel):
    items: list[CallSnapshot]
    next_cursor: str | None = Field(default=None, description="Pass as ?cursor= for the next page")
    total: int = Field(description="Calls matching the filters")
    last_event_id: int = Field(description="Event id current when the page was read: ?last_event_id= for SSE")


class WorkerList(BaseModel):
    items: list[WorkerInfo]


class SessionInfo(BaseModel):
    expires_at: int | None = Field(description="Cookie expiry (epoch s); null when auth is off")
    auth_required: bool


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorBody} for status in (400, 401, 422, *statuses)}


def get_plane(request: Request) -> ControlPlane:
    """FastAPI dependency: the ControlPlane of this app (also for routers mounted later, e.g. WebRTC)."""
    plane: ControlPlane = request.app.state.plane
    return plane


PlaneDep = Annotated[ControlPlane, Depends(get_plane)]
CallId = Annotated[str, Path(min_length=1, max_length=128, description="Call id")]
WorkerId = Annotated[str, Path(min_length=1, max_length=128, description="Worker id")]

router = APIRouter(prefix="/v1", dependencies=[Depends(require_api_token)])


def _encode_cursor(call: CallSnapshot) -> str:
    return base64.urlsafe_b64encode(orjson.dumps([call.started or 0.0, call.id])).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        started, call_id = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        return float(started), str(call_id)
    except (ValueError, TypeError, binascii.Error, orjson.JSONDecodeError):
        raise ApiError(422, "invalid_cursor", "cursor is not one this API returned") from None


def _rejected(decision: AdmissionDecision) -> ApiError:
    headers = {"Retry-After": str(decision.retry_after_s)} if decision.retry_after_s else None
    return ApiError(decision.status, decision.code or "rejected", decision.reason, headers=headers)


@router.get("/calls", response_model=CallPage, tags=["calls"], responses=errors())
async def list_calls(
    plane: PlaneDep,
    state: Annotated[CallState | None, Query(description="Only calls in this state")] = None,
    worker: Annotated[str | None, Query(max_length=128)] = None,
    route: Annotated[str | None, Query(max_length=128)] = None,
    live: Annotated[bool | None, Query(description="true: not ended; false: ended only")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: Annotated[str | None, Query(max_length=512, description="next_cursor of the previous page")] = None,
) -> Any:
    """Calls, newest first, with filters and keyset pagination (transcripts only on GET /v1/calls/{id})."""
    last_event_id = await plane.store.last_event_id()
    calls = await plane.list_calls()
    selected = [
        call
        for call in calls
        if (state is None or call.state == state)
        and (worker is None or call.worker == worker)
        and (route is None or call.route == route)
        and (live is None or call.is_live == live)
    ]
    selected.sort(key=lambda c: (c.started or 0.0, c.id), reverse=True)
    total = len(selected)
    if cursor is not None:
        after = _decode_cursor(cursor)
        selected = [c for c in selected if (c.started or 0.0, c.id) < after]
    page = selected[:limit]
    next_cursor = _encode_cursor(page[-1]) if len(selected) > limit else None
    items = [call.model_copy(update={"transcript": []}) for call in page]
    return CallPage(items=items, next_cursor=next_cursor, total=total, last_event_id=last_event_id)


@router.get("/calls/{call_id}", response_model=CallSnapshot, tags=["calls"], responses=errors(404))
async def get_call(plane: PlaneDep, call_id: CallId) -> Any:
    """One call with its statistics and transcript (kept for a while after it ended)."""
    return await plane.get_call(call_id)


@router.post(
    "/calls",
    status_code=201,
    response_model=CallCreated,
    tags=["calls"],
    responses=errors(403, 404, 502, 503),
)
async def originate(plane: PlaneDep, body: OriginateRequest, response: Response) -> Any:
    """Place an outbound call on the least-loaded worker (or ``worker``). 503 + Retry-After when full."""
    decision = await plane.originate(body)
    if not decision.accepted:
        raise _rejected(decision)
    response.headers["Location"] = f"/v1/calls/{decision.call_id}"
    return CallCreated(id=decision.call_id, worker=decision.worker, route=decision.route)


@router.post("/calls/{call_id}/hangup", status_code=204, tags=["calls"], responses=errors(404, 409, 502))
async def hang_up(plane: PlaneDep, call_id: CallId, body: Annotated[HangupRequest | None, Body()] = None) -> Response:
    """Ask the call's worker to hang up; the ``call.ended`` event follows."""
    await plane.hang_up(call_id, body.reason if body else "api")
    return Response(status_code=204)


@router.post("/calls/{call_id}/transfer", status_code=204, tags=["calls"], responses=errors(404, 409, 502))
async def transfer(plane: PlaneDep, call_id: CallId, body: TransferRequest) -> Response:
    """Blind transfer (SIP REFER) of the caller to ``target``."""
    await plane.transfer(call_id, body.target)
    return Response(status_code=204)


@router.post("/calls/{call_id}/dtmf", status_code=204, tags=["calls"], responses=errors(404, 409, 502))
async def send_dtmf(plane: PlaneDep, call_id: CallId, body: DtmfRequest) -> Response:
    """Send DTMF digits (RFC 4733) to the caller."""
    await plane.send_dtmf(call_id, body.digits)
    return Response(status_code=204)


@router.post("/calls/{call_id}/say", status_code=204, tags=["calls"], responses=errors(404, 409, 502))
async def say(plane: PlaneDep, call_id: CallId, body: SayRequest) -> Response:
    """The agent says ``text``: after its current turn, or at once (cutting it) with ``interrupt``."""
    await plane.command_agent(call_id, AgentCommand(say=body))
    return Response(status_code=204)


@router.post("/calls/{call_id}/inject", status_code=204, tags=["calls"], responses=errors(404, 409, 502))
async def inject(plane: PlaneDep, call_id: CallId, body: InjectRequest) -> Response:
    """Add a user or system message to the agent's conversation; ``respond`` asks it to answer now."""
    await plane.command_agent(call_id, AgentCommand(inject=body))
    return Response(status_code=204)


@router.post("/calls/{call_id}/update", status_code=204, tags=["calls"], responses=errors(404, 409, 502))
async def update_agent(plane: PlaneDep, call_id: CallId, body: AgentUpdateRequest) -> Response:
    """Change the running agent's instructions or voice; a fresh provider session carries the conversation."""
    await plane.command_agent(call_id, AgentCommand(update=body))
    return Response(status_code=204)


@router.get("/workers", response_model=WorkerList, tags=["workers"], responses=errors())
async def list_workers(plane: PlaneDep) -> Any:
    """Every known worker: up, draining, lost (no heartbeat) or gone (exited after a drain)."""
    return WorkerList(items=await plane.list_workers())


@router.get("/workers/{worker_id}", response_model=WorkerInfo, tags=["workers"], responses=errors(404))
async def get_worker(plane: PlaneDep, worker_id: WorkerId) -> Any:
    return await plane.get_worker(worker_id)


@router.post("/workers/{worker_id}/drain", response_model=WorkerInfo, tags=["workers"], responses=errors(404, 502))
async def drain_worker(plane: PlaneDep, worker_id: WorkerId, body: DrainRequest) -> Any:
    """Stop sending new calls to the worker; its calls continue. ``exit_when_empty``: it exits after the last.
    ``deadline_s``: calls still up after that long are ended politely (goodbye, then BYE with a Reason)."""
    return await plane.drain(worker_id, body.exit_when_empty, body.deadline_s)


@router.post("/session", response_model=SessionInfo, tags=["auth"], responses=errors())
async def open_session(request: Request) -> Any:
    """Set the ``gateway_sse`` cookie that lets a browser EventSource read ``/v1/events`` (one hour)."""
    token: str | None = request.app.state.token
    if not token:
        return SessionInfo(expires_at=None, auth_required=False)
    value, expires = make_sse_cookie(token, request.app.state.clock())
    response = JSONResponse(SessionInfo(expires_at=expires, auth_required=True).model_dump())
    response.set_cookie(
        SSE_COOKIE,
        value,
        max_age=SSE_COOKIE_TTL_S,
        path=SSE_COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.delete("/session", status_code=204, tags=["auth"], responses=errors())
async def close_session() -> Response:
    response = Response(status_code=204)
    response.delete_cookie(SSE_COOKIE, path=SSE_COOKIE_PATH)
    return response
