"""The authenticated ops REST API under ``/v1``: calls, workers and the dashboard's SSE session cookie.

Every answer other than 2xx is ``{"error": {"code", "message"}}`` (see :mod:`gateway.fleet.json_errors`).
Commands go to the worker that holds the call (in-process or over HTTP); their effect arrives on
``GET /v1/events`` as ``call.updated`` / ``call.ended``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from gateway.control.auth import (
    MEDIA_COOKIE,
    MEDIA_COOKIE_PATH,
    SSE_COOKIE,
    SSE_COOKIE_PATH,
    SSE_COOKIE_TTL_S,
    make_media_cookie,
    make_sse_cookie,
    require_api_token,
)
from gateway.control.history import CallHistory
from gateway.control.plane import ControlPlane
from gateway.fleet.errors import CallNotFoundError
from gateway.fleet.json_errors import ApiError
from gateway.fleet.models import (
    AdmissionDecision,
    AgentCommand,
    AgentUpdateRequest,
    CallCreated,
    CallDirection,
    CallState,
    DrainRequest,
    DtmfRequest,
    HandoffRequest,
    HangupRequest,
    InjectRequest,
    OriginateRequest,
    SayRequest,
    TransferLine,
    TransferRequest,
    WarmTransferRequest,
    WorkerInfo,
)
from gateway.records import CallRecord
from gateway.records.history import CursorError, HistoryQuery, SortKey, decode_cursor


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
    items: list[CallRecord]
    next_cursor: str | None = Field(default=None, description="Pass as ?cursor= for the next page")
    total: int = Field(description="Calls matching the filters")
    last_event_id: int = Field(description="Event id current when the page was read: ?last_event_id= for SSE")


class WorkerList(BaseModel):
    items: list[WorkerInfo]


class ProfileInfo(BaseModel):
    name: str = Field(examples=["support"])
    provider: str = Field(examples=["openai"], description="The realtime provider the profile's agent runs on")


class ProfileList(BaseModel):
    items: list[ProfileInfo]


class SessionInfo(BaseModel):
    expires_at: int | None = Field(description="Cookie expiry (epoch s); null when auth is off")
    auth_required: bool


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorBody} for status in (400, 401, 422, *statuses)}


def get_plane(request: Request) -> ControlPlane:
    """FastAPI dependency: the ControlPlane of this app (also for routers mounted later, e.g. WebRTC)."""
    plane: ControlPlane = request.app.state.plane
    return plane


def get_history(request: Request) -> CallHistory:
    history: CallHistory = request.app.state.history
    return history


PlaneDep = Annotated[ControlPlane, Depends(get_plane)]
HistoryDep = Annotated[CallHistory, Depends(get_history)]
CallId = Annotated[str, Path(min_length=1, max_length=128, description="Call id")]
WorkerId = Annotated[str, Path(min_length=1, max_length=128, description="Worker id")]

router = APIRouter(prefix="/v1", dependencies=[Depends(require_api_token)])


def _rejected(decision: AdmissionDecision) -> ApiError:
    headers = {"Retry-After": str(decision.retry_after_s)} if decision.retry_after_s else None
    return ApiError(decision.status, decision.code or "rejected", decision.reason, headers=headers)


class HistoryFilters:
    """The query parameters of ``GET /v1/calls`` and its export that pick calls (FastAPI dependency)."""

    def __init__(
        self,
        since: Annotated[float | None, Query(ge=0, description="Calls started at or after (epoch s)")] = None,
        until: Annotated[float | None, Query(ge=0, description="Calls started before (epoch s)")] = None,
        number: Annotated[
            str | None, Query(min_length=1, max_length=256, description="The caller's or called number contains this")
        ] = None,
        direction: Annotated[CallDirection | None, Query()] = None,
        end_reason: Annotated[str | None, Query(min_length=1, max_length=64)] = None,
        profile: Annotated[str | None, Query(min_length=1, max_length=128)] = None,
        worker: Annotated[str | None, Query(max_length=128)] = None,
        route: Annotated[str | None, Query(max_length=128)] = None,
        trunk: Annotated[
            str | None, Query(min_length=1, max_length=64, description="Calls that came in on or left by this trunk")
        ] = None,
        text: Annotated[
            str | None, Query(min_length=1, max_length=256, description="A transcript item contains this (any case)")
        ] = None,
        sort: Annotated[SortKey, Query(description="started or duration; a leading - sorts descending")] = "-started",
    ) -> None:
        if since is not None and until is not None and until <= since:
            raise ApiError(422, "invalid_time_range", f"until ({until}) must be after since ({since})")
        self.query = HistoryQuery(
            since=since,
            until=until,
            number=number,
            direction=direction,
            end_reason=end_reason,
            profile=profile,
            worker=worker,
            route=route,
            trunk=trunk,
            text=text,
            sort=sort,
        )


FiltersDep = Annotated[HistoryFilters, Depends()]


@router.get("/calls", response_model=CallPage, tags=["calls"], responses=errors())
async def list_calls(
    plane: PlaneDep,
    history: HistoryDep,
    filters: FiltersDep,
    state: Annotated[CallState | None, Query(description="Only calls in this state")] = None,
    live: Annotated[bool | None, Query(description="true: not ended; false: ended only")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: Annotated[str | None, Query(max_length=512, description="next_cursor of the previous page")] = None,
) -> Any:
    """The call history: live calls and the ended calls of the database, newest first by default, with filters,
    sorting and keyset pagination (transcripts only on GET /v1/calls/{id})."""
    last_event_id = await plane.store.last_event_id()
    query = filters.query
    after = None
    if cursor is not None:
        try:
            after = decode_cursor(cursor, query.sort)
        except CursorError as exc:
            raise ApiError(422, "invalid_cursor", str(exc)) from None
    page = await history.page(
        HistoryQuery(**{**_fields(query), "limit": limit, "after": after}), state=state, live=live
    )
    return CallPage(items=page.items, next_cursor=page.next_cursor, total=page.total, last_event_id=last_event_id)


def _fields(query: HistoryQuery) -> dict[str, Any]:
    return {name: getattr(query, name) for name in HistoryQuery.__dataclass_fields__}


@router.get(
    "/calls/export",
    tags=["calls"],
    response_class=StreamingResponse,
    responses={
        **errors(),
        200: {"content": {"text/csv": {"schema": {"type": "string"}}, "application/x-ndjson": {}}},
    },
)
async def export_calls(
    history: HistoryDep,
    filters: FiltersDep,
    format: Annotated[Literal["csv", "jsonl"], Query(description="csv: one line per call; jsonl: one record")] = "csv",
) -> StreamingResponse:
    """Every ended call matching the filters, streamed in the sort's order (without transcripts)."""
    media_type = "text/csv; charset=utf-8" if format == "csv" else "application/x-ndjson"
    headers = {"Content-Disposition": f'attachment; filename="calls.{format}"'}
    return StreamingResponse(history.export(filters.query, format), media_type=media_type, headers=headers)


@router.get("/calls/{call_id}", response_model=CallRecord, tags=["calls"], responses=errors(404))
async def get_call(history: HistoryDep, call_id: CallId) -> Any:
    """One call with its statistics, transcript and tool calls: live, or ended (from the database of calls)."""
    record = await history.get(call_id)
    if record is None:
        raise CallNotFoundError(call_id)
    return record


@router.post(
    "/calls",
    status_code=201,
    response_model=CallCreated,
    tags=["calls"],
    responses=errors(403, 404, 422, 502, 503),
)
async def originate(plane: PlaneDep, body: OriginateRequest, response: Response) -> Any:
    """Place an outbound call on the least-loaded worker (or ``worker``), through ``trunk`` or the route's trunk
    (422 for an unknown one). 503 + Retry-After when full."""
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


@router.post(
    "/calls/{call_id}/warm_transfer",
    status_code=202,
    tags=["calls"],
    response_model=TransferLine,
    responses=errors(404, 409, 502),
)
async def warm_transfer(plane: PlaneDep, call_id: CallId, body: WarmTransferRequest) -> TransferLine:
    """Warm transfer: the caller waits on hold while a human (number, SIP URI or queue name) is dialled and briefed
    with ``summary`` (made from the transcript when empty), then the two are joined and the agent leaves the call.
    Answered once the human's phone rings; ``call.transferred`` or ``call.transfer_failed`` follows (on failure the
    caller is back with the agent, who says so). 409 when the call is not up with its agent, is on hold, is in a
    transfer already, is a browser call, or the target cannot be dialled (a number and no trunk)."""
    return await plane.warm_transfer(call_id, body)


@router.post(
    "/calls/{call_id}/warm_transfer/join",
    status_code=202,
    tags=["calls"],
    response_model=TransferLine,
    responses=errors(404, 409, 502),
)
async def warm_transfer_join(plane: PlaneDep, call_id: CallId) -> TransferLine:
    """Join a warm transfer's caller and human now (the id of either leg), without waiting for the briefing to
    end; ``call.transferred`` follows. 409 when the call has no warm transfer in briefing."""
    return await plane.warm_transfer_join(call_id)


@router.post("/calls/{call_id}/hold", status_code=204, tags=["calls"], responses=errors(404, 409, 502))
async def hold(plane: PlaneDep, call_id: CallId) -> Response:
    """Put the caller on hold: a re-INVITE with a=sendonly, the hold audio meanwhile, the agent paused
    (``call.held`` follows). 409 when the call is not answered, is held already, or is a browser call."""
    await plane.hold(call_id, True)
    return Response(status_code=204)


@router.post("/calls/{call_id}/unhold", status_code=204, tags=["calls"], responses=errors(404, 409, 502))
async def unhold(plane: PlaneDep, call_id: CallId) -> Response:
    """Take the caller off the hold of ``/hold`` (a=sendrecv); the agent continues where the caller left off
    (``call.resumed`` follows). 409 when the gateway does not hold the call."""
    await plane.hold(call_id, False)
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
    """Change the running agent's instructions, voice or tools; a fresh provider session carries the
    conversation. 409 when a tool cannot be made or the provider refuses: the agent stays as it was."""
    await plane.command_agent(call_id, AgentCommand(update=body))
    return Response(status_code=204)


@router.post("/calls/{call_id}/handoff", status_code=204, tags=["calls"], responses=errors(404, 409, 502))
async def hand_off(plane: PlaneDep, call_id: CallId, body: HandoffRequest) -> Response:
    """Hand the call to another agent profile (its provider, instructions, voice, tools); a fresh provider session
    carries the conversation. 409 when the profile is unknown or the handoff fails: the current agent keeps the
    call. ``agent.handoff_started`` / ``agent.handed_off`` / ``agent.handoff_failed`` follow on ``/v1/events``."""
    await plane.command_agent(call_id, AgentCommand(handoff=body))
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


@router.get("/profiles", response_model=ProfileList, tags=["calls"], responses=errors())
async def list_profiles(plane: PlaneDep) -> Any:
    """The agent profiles of the routes file, by name (what ``POST /v1/calls/{id}/handoff`` can switch to)."""
    profiles = plane.config.profiles
    return ProfileList(items=[ProfileInfo(name=name, provider=profiles[name].provider) for name in sorted(profiles)])


@router.post("/session", response_model=SessionInfo, tags=["auth"], responses=errors())
async def open_session(request: Request) -> Any:
    """Set the cookies a browser needs where it cannot send the bearer header (one hour): ``gateway_sse`` for an
    EventSource on ``/v1/events``, ``gateway_media`` for an ``<audio>`` element on ``/v1/calls/{id}/recording``."""
    token: str | None = request.app.state.token
    if not token:
        return SessionInfo(expires_at=None, auth_required=False)
    now = request.app.state.clock()
    value, expires = make_sse_cookie(token, now)
    media, _ = make_media_cookie(token, now)
    response = JSONResponse(SessionInfo(expires_at=expires, auth_required=True).model_dump())
    for name, cookie, path in ((SSE_COOKIE, value, SSE_COOKIE_PATH), (MEDIA_COOKIE, media, MEDIA_COOKIE_PATH)):
        response.set_cookie(
            name,
            cookie,
            max_age=SSE_COOKIE_TTL_S,
            path=path,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
    return response


@router.delete("/session", status_code=204, tags=["auth"], responses=errors())
async def close_session() -> Response:
    response = Response(status_code=204)
    response.delete_cookie(SSE_COOKIE, path=SSE_COOKIE_PATH)
    response.delete_cookie(MEDIA_COOKIE, path=MEDIA_COOKIE_PATH)
    return response
