"""JSON error answers for every FastAPI app of the gateway: ``{"error": {"code", "message"}}``.

Installed on the control plane app and on a worker's internal API app, so 401, 404 (also for unknown
paths), 405, 422 and unexpected 500s all share one shape that clients and the fleet links can parse.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    415: "unsupported_media_type",
    422: "validation_error",
    429: "too_many_requests",
    500: "internal_error",
    502: "bad_gateway",
    503: "unavailable",
}


class ApiError(StarletteHTTPException):
    """An HTTP error with a machine-readable ``code`` (and optional extra fields in the error object)."""

    def __init__(
        self,
        status_code: int,
        code: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(status_code=status_code, detail=message, headers=headers)
        self.code = code
        self.extra = extra


def error_response(
    status: int, code: str, message: str, *, headers: Mapping[str, str] | None = None, **extra: Any
) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, **extra}}, status_code=status, headers=headers)


def _status_phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "error"


async def _http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    if isinstance(exc, ApiError):
        return error_response(status, exc.code, str(exc.detail), headers=exc.headers, **exc.extra)
    code = _CODES.get(status, "error")
    message = exc.detail if isinstance(exc.detail, str) and exc.detail else _status_phrase(status)
    if status == 404 and message == "Not Found":
        message = f"no such resource: {request.url.path}"
    if status == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    return error_response(status, code, message, headers=getattr(exc, "headers", None))


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    problems = []
    for error in exc.errors():
        location = ".".join(str(part) for part in error.get("loc", ()))
        problems.append(f"{location}: {error.get('msg', 'invalid')}")
    message = "; ".join(problems[:10]) or "invalid request"
    return error_response(422, "validation_error", message)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal_error", "internal error (see the server log)")


def install_json_errors(app: FastAPI) -> None:
    app.add_exception_handler(StarletteHTTPException, _http_exception)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _unexpected)
