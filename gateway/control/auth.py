"""Authentication of the control plane's HTTP surfaces.

* ``/v1`` and ``/internal/v1``: ``Authorization: Bearer <GATEWAY_API_TOKEN>``, compared in constant time.
* ``GET /v1/events`` also accepts the ``gateway_sse`` cookie, because a browser's EventSource cannot send
  headers. ``POST /v1/session`` (with the bearer token) sets it: ``<expiry>.<HMAC-SHA256(key, expiry)>``,
  HttpOnly, SameSite=Strict, Path=/v1/events, one hour. The key is derived from the API token, so
  every control-plane process behind a balancer accepts it and rotating the token revokes it. The cookie
  opens only the read-only event stream: commands (hang-up, drain) always need the bearer header, so a
  cross-site request carrying the cookie can do nothing (and SameSite=Strict keeps it off those anyway).
* No token configured: everything is open; the process only binds loopback (see settings.check_bind).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated

from fastapi import Cookie, Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gateway.fleet.auth import token_matches
from gateway.fleet.json_errors import ApiError

SSE_COOKIE = "gateway_sse"
SSE_COOKIE_PATH = "/v1/events"
SSE_COOKIE_TTL_S = 3600

bearer_scheme = HTTPBearer(auto_error=False, description="GATEWAY_API_TOKEN")


def _unauthorized(message: str = "missing or wrong bearer token") -> ApiError:
    return ApiError(401, "unauthorized", message, headers={"WWW-Authenticate": "Bearer"})


def configured_token(request: Request) -> str | None:
    token: str | None = request.app.state.token
    return token


async def require_api_token(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> None:
    """FastAPI dependency: the bearer token must match GATEWAY_API_TOKEN (when one is configured)."""
    expected = configured_token(request)
    presented = credentials.credentials if credentials is not None else None
    if not token_matches(presented, expected):
        raise _unauthorized()


def _cookie_key(token: str) -> bytes:
    return hashlib.sha256(b"gateway-sse-cookie\x00" + token.encode("utf-8")).digest()


def make_sse_cookie(token: str, now: float, ttl_s: int = SSE_COOKIE_TTL_S) -> tuple[str, int]:
    """Cookie value and its expiry (epoch seconds)."""
    expires = int(now) + ttl_s
    mac = hmac.new(_cookie_key(token), str(expires).encode(), hashlib.sha256).hexdigest()
    return f"{expires}.{mac}", expires


def sse_cookie_valid(value: str | None, token: str, now: float) -> bool:
    if not value:
        return False
    expires_text, _, mac = value.partition(".")
    if not expires_text.isdigit() or int(expires_text) < now:
        return False
    expected = hmac.new(_cookie_key(token), expires_text.encode(), hashlib.sha256).hexdigest()
    return hmac.compare_digest(mac.encode(), expected.encode())


async def require_token_or_sse_cookie(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
    gateway_sse: Annotated[str | None, Cookie(include_in_schema=False)] = None,
) -> None:
    expected = configured_token(request)
    if not expected:
        return
    if credentials is not None and token_matches(credentials.credentials, expected):
        return
    if sse_cookie_valid(gateway_sse, expected, request.app.state.clock()):
        return
    raise _unauthorized("missing or wrong bearer token (or expired gateway_sse cookie: POST /v1/session)")
