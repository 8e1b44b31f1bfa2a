"""Authentication of the control plane's HTTP surfaces.

* ``/v1`` and ``/internal/v1``: ``Authorization: Bearer <GATEWAY_API_TOKEN>``, compared in constant time.
* ``GET /v1/events`` also accepts the ``gateway_sse`` cookie, because a browser's EventSource cannot send
  headers. ``POST /v1/session`` (with the bearer token) sets it: ``<expiry>.<HMAC-SHA256(key, expiry)>``,
  HttpOnly, SameSite=Strict, Path=/v1/events, one hour. The key is derived from the API token, so
  every control-plane process behind a balancer accepts it and rotating the token revokes it. The cookie
  opens only the read-only event stream: commands (hang-up, drain) always need the bearer header, so a
  cross-site request carrying the cookie can do nothing (and SameSite=Strict keeps it off those anyway).
* ``GET /v1/calls/{id}/recording`` also accepts the ``gateway_media`` cookie, set by the same
  ``POST /v1/session``, because a browser's ``<audio>`` element cannot send headers either. Same form, its own
  key (an event-stream cookie does not open recordings), Path=/v1/calls; it too opens only that read-only route.
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
MEDIA_COOKIE = "gateway_media"
MEDIA_COOKIE_PATH = "/v1/calls"
_SSE_PURPOSE = b"gateway-sse-cookie"
_MEDIA_PURPOSE = b"gateway-media-cookie"

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


def _cookie_key(token: str, purpose: bytes = _SSE_PURPOSE) -> bytes:
    return hashlib.sha256(purpose + b"\x00" + token.encode("utf-8")).digest()


def make_sse_cookie(
    token: str, now: float, ttl_s: int = SSE_COOKIE_TTL_S, *, purpose: bytes = _SSE_PURPOSE
) -> tuple[str, int]:
    """Cookie value and its expiry (epoch seconds)."""
    expires = int(now) + ttl_s
    mac = hmac.new(_cookie_key(token, purpose), str(expires).encode(), hashlib.sha256).hexdigest()
    return f"{expires}.{mac}", expires


def make_media_cookie(token: str, now: float, ttl_s: int = SSE_COOKIE_TTL_S) -> tuple[str, int]:
    """The ``gateway_media`` cookie's value and expiry: like the event stream's, under its own key."""
    return make_sse_cookie(token, now, ttl_s, purpose=_MEDIA_PURPOSE)


def sse_cookie_valid(value: str | None, token: str, now: float, *, purpose: bytes = _SSE_PURPOSE) -> bool:
    if not value:
        return False
    expires_text, _, mac = value.partition(".")
    if not expires_text.isdigit() or int(expires_text) < now:
        return False
    expected = hmac.new(_cookie_key(token, purpose), expires_text.encode(), hashlib.sha256).hexdigest()
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


async def require_token_or_media_cookie(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
    gateway_media: Annotated[str | None, Cookie(include_in_schema=False)] = None,
) -> None:
    """FastAPI dependency of the read-only media routes: the bearer token, or the ``gateway_media`` cookie."""
    expected = configured_token(request)
    if not expected:
        return
    if credentials is not None and token_matches(credentials.credentials, expected):
        return
    if sse_cookie_valid(gateway_media, expected, request.app.state.clock(), purpose=_MEDIA_PURPOSE):
        return
    raise _unauthorized("missing or wrong bearer token (or expired gateway_media cookie: POST /v1/session)")
