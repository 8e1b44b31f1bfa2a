"""``/internal/v1``: the control plane's endpoints for workers (the server side of HttpControlLink).

Same bearer token as the ops API. Admission always answers 200 with an AdmissionDecision: a rejection
is a decision (status 403/404/503 inside), not a failed request, so a worker can tell "no" from "down".

A worker may run a newer version than the plane (a rolling update of the workers first): its bodies are parsed
by :class:`gateway.fleet.compat.FleetMessageRoute`, which ignores the fields this version does not know and
still refuses a wrong type or a missing field with a 422 naming it; the plane logs the ignored fields once per
worker (:meth:`ControlPlane.note_unknown_fields`).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request, Response

from gateway.control.api import PlaneDep, errors
from gateway.control.auth import require_api_token
from gateway.control.plane import ControlPlane
from gateway.fleet.compat import FleetMessageRoute
from gateway.fleet.http import INTERNAL_PREFIX
from gateway.fleet.json_errors import ApiError
from gateway.fleet.models import AdmissionDecision, AdmissionRequest, HeartbeatRequest, ReportRequest, WorkerInfo

router = APIRouter(
    prefix=INTERNAL_PREFIX,
    dependencies=[Depends(require_api_token)],
    tags=["internal"],
    route_class=FleetMessageRoute,
)


def _note_skew(plane: ControlPlane, request: Request, worker_id: str, version: str = "") -> None:
    unknown: list[str] = getattr(request.state, "unknown_fields", [])
    if unknown:
        plane.note_unknown_fields(worker_id, version, unknown)


@router.post("/workers/register", response_model=WorkerInfo, responses=errors())
async def register(plane: PlaneDep, info: WorkerInfo, request: Request) -> Any:
    """A worker announces itself (id, command API url, capacity)."""
    if not info.url:
        raise ApiError(422, "validation_error", "url: a worker registering over HTTP must give its command API url")
    _note_skew(plane, request, info.id, info.version)
    return await plane.register(info)


@router.post("/workers/{worker_id}/heartbeat", response_model=WorkerInfo, responses=errors())
async def heartbeat(
    plane: PlaneDep,
    worker_id: Annotated[str, Path(min_length=1, max_length=128)],
    body: HeartbeatRequest,
    request: Request,
) -> Any:
    """Load and the snapshot of every call the worker holds (re-registers a worker the plane forgot)."""
    if body.info.id != worker_id:
        raise ApiError(422, "validation_error", f"info.id {body.info.id!r} does not match the path {worker_id!r}")
    _note_skew(plane, request, worker_id, body.info.version)
    return await plane.heartbeat(body.info, body.calls)


@router.post("/admit", response_model=AdmissionDecision, responses=errors())
async def admit(plane: PlaneDep, admission: AdmissionRequest, request: Request) -> Any:
    _note_skew(plane, request, admission.worker or admission.source or "(unnamed)")
    return await plane.admit(admission)


@router.post("/events", status_code=204, responses=errors())
async def report(plane: PlaneDep, body: ReportRequest, request: Request) -> Response:
    if body.events:
        _note_skew(plane, request, body.events[0].worker)
    await plane.report(body.events)
    return Response(status_code=204)
