"""Browser callers: ``POST /v1/webrtc/offer``, ``POST /v1/webrtc/tokens`` and the ``/phone`` page.

Mounted by ``gateway run`` with ``create_app(routers=[webrtc_router(worker.webrtc)])``; the handler is the
in-process worker's :class:`gateway.worker.webrtc.WebRtcCalls` (anything with the same ``answer`` method).

Offer/answer is non-trickle JSEP (RFC 8829): the page posts its complete offer, the answer comes back with
every candidate, plus the new call's id. Who may call:

* the ops bearer token (``GATEWAY_API_TOKEN``) may call any route;
* a **call token** (``Authorization: Bearer wct1....``) may call the one route it names;
* nobody else, except on a route whose config says ``webrtc_public = true``.

With no API token configured, authentication is off (the process binds loopback only), as for ``/v1``.

Call tokens: ``wct1.<base64url(JSON {"r": route, "e": expiry, "n": nonce})>.<base64url(HMAC-SHA256)>``.
Verifying one needs no server state: the signature and the expiry (epoch seconds) say it is good. Each token
is **single-use**: the first offer that passes authentication and SDP checks spends its nonce, remembered in
memory until the token expires, and — when the control plane shares state in Redis — taken as a lease in the
store too, so a token opens one call fleet-wide. The HMAC key is ``GATEWAY_WEBRTC_TOKEN_SECRET``, else derived
from the API token (rotating the token revokes every call token), else a random key of this process.

Offers are rate-limited per client IP (the TCP peer; a reverse proxy's X-Forwarded-For is not trusted) by a
token bucket; a refusal is 429 with Retry-After. Errors are ``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Annotated, Any, Literal, Protocol

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel, ConfigDict, Field, SecretStr, StringConstraints, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.control.auth import bearer_scheme, require_api_token
from gateway.control.config import GatewayConfig, RouteConfig
from gateway.control.plane import ControlPlane
from gateway.fleet.auth import token_matches
from gateway.fleet.json_errors import ApiError
from gateway.transport.webrtc import MAX_OFFER_BYTES, CallRefusedError, OfferError, WebRtcAnswer, check_offer

TOKEN_PREFIX = "wct1."
STATIC_DIR = resources.files("gateway.control") / "static"
_PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "media-src 'self' blob: mediastream:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Permissions-Policy": "microphone=(self), camera=()",
    "Cache-Control": "no-store",
}


class WebRtcApiSettings(BaseSettings):
    """``GATEWAY_WEBRTC_*`` settings of the offer endpoint (the worker reads its own: ICE, limits)."""

    model_config = SettingsConfigDict(env_prefix="GATEWAY_WEBRTC_", frozen=True, extra="ignore")

    token_secret: SecretStr | None = Field(
        default=None,
        description="HMAC key of browser call tokens; unset: one derived from `GATEWAY_API_TOKEN`, else a random "
        "key per process.",
    )
    offers_per_minute: float = Field(default=12.0, gt=0.0, description="Sustained offers per client IP.")
    offer_burst: int = Field(default=10, ge=1, description="Offers a client IP may make back to back.")
    max_token_ttl_s: int = Field(
        default=3600, ge=10, le=86_400, description="Longest lifetime a call token may be asked for, in seconds."
    )


class WebRtcCallHandler(Protocol):
    """What answers an offer: the worker's WebRtcCalls. Raises OfferError (400) or CallRefusedError."""

    async def answer(
        self, sdp: str, *, route: str | None, public: bool, client: str = "", metadata: Mapping[str, str] | None = None
    ) -> WebRtcAnswer: ...


# ------------------------------------------------------------------------------------------ models


class OfferRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"sdp": "v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\n...", "type": "offer"}]},
    )

    sdp: str = Field(min_length=1, max_length=MAX_OFFER_BYTES, description="The browser's complete SDP offer")
    type: Literal["offer"]
    route: str | None = Field(
        default=None, max_length=128, description="Route name (default: the call token's, else the first public)"
    )


class OfferAnswer(BaseModel):
    sdp: str = Field(description="The gateway's SDP answer with every ICE candidate")
    type: Literal["answer"] = "answer"
    call_id: str = Field(description="Id of the call in /v1/calls")


MetadataKey = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
MetadataValue = Annotated[str, StringConstraints(max_length=256)]
MAX_METADATA_BYTES = 1024  # of its compact JSON: the token carries it, and a token is at most 2048 chars


class TokenRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"route": "support", "ttl_s": 300, "metadata": {"plan": "gold"}}]},
    )

    route: str = Field(min_length=1, max_length=128)
    ttl_s: int = Field(default=300, ge=10, le=86_400, description="Lifetime in seconds")
    metadata: dict[MetadataKey, MetadataValue] = Field(
        default_factory=dict,
        max_length=16,
        description="Signed into the token and given to the call as its context ({metadata.<key>} in templates); "
        "at most 16 keys, 1024 bytes of JSON",
    )

    @field_validator("metadata")
    @classmethod
    def _small(cls, value: dict[str, str]) -> dict[str, str]:
        size = len(json.dumps(value, separators=(",", ":")).encode("utf-8"))
        if size > MAX_METADATA_BYTES:
            raise ValueError(f"metadata is {size} bytes of JSON; at most {MAX_METADATA_BYTES}")
        return value


class TokenResponse(BaseModel):
    token: str = Field(description="Send as 'Authorization: Bearer <token>' with one offer, or put in the /phone URL")
    expires_at: float = Field(description="Epoch seconds")
    route: str


# ---------------------------------------------------------------------------------------- tokens


class InvalidCallTokenError(Exception):
    """The call token is malformed, badly signed or expired (the message says which)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CallToken:
    route: str
    expires_at: int
    nonce: str
    metadata: Mapping[str, str] = field(default_factory=dict)


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def mint_call_token(key: bytes, *, route: str, expires_at: int, metadata: Mapping[str, str] | None = None) -> str:
    claims: dict[str, Any] = {"r": route, "e": expires_at, "n": secrets.token_urlsafe(12)}
    if metadata:
        claims["m"] = dict(metadata)
    payload = _b64encode(json.dumps(claims, separators=(",", ":")).encode())
    mac = hmac.new(key, (TOKEN_PREFIX + payload).encode("ascii"), hashlib.sha256).digest()
    return f"{TOKEN_PREFIX}{payload}.{_b64encode(mac)}"


def verify_call_token(key: bytes, token: str, *, now: float) -> CallToken:
    if not token.startswith(TOKEN_PREFIX) or len(token) > 2048:
        raise InvalidCallTokenError("not a call token")
    payload, dot, mac_text = token[len(TOKEN_PREFIX) :].partition(".")
    if not dot or not payload or not mac_text:
        raise InvalidCallTokenError("malformed call token")
    expected = hmac.new(key, (TOKEN_PREFIX + payload).encode("ascii", "replace"), hashlib.sha256).digest()
    try:
        mac = _b64decode(mac_text)
        if not hmac.compare_digest(mac, expected):
            raise InvalidCallTokenError("call token signature does not match")
        data = json.loads(_b64decode(payload))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise InvalidCallTokenError("malformed call token") from None
    if not isinstance(data, dict):
        raise InvalidCallTokenError("malformed call token")
    route, expires_at, nonce = data.get("r"), data.get("e"), data.get("n")
    if not isinstance(route, str) or not isinstance(expires_at, int) or not isinstance(nonce, str):
        raise InvalidCallTokenError("malformed call token")
    metadata = data.get("m", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise InvalidCallTokenError("malformed call token")
    if expires_at <= now:
        raise InvalidCallTokenError("call token has expired")
    return CallToken(route=route, expires_at=expires_at, nonce=nonce, metadata=metadata)


class SpentTokens:
    """Nonces of call tokens already used, kept until the token would have expired anyway."""

    def __init__(self, *, max_entries: int = 100_000) -> None:
        self._spent: dict[str, int] = {}
        self._max = max_entries

    def spend(self, token: CallToken, now: float) -> bool:
        """True the first time a token's nonce is spent in this process."""
        if len(self._spent) >= self._max:
            self._spent = {nonce: exp for nonce, exp in self._spent.items() if exp > now}
            if len(self._spent) >= self._max:
                return False  # refuse rather than forget: a forgotten nonce could be replayed
        if token.nonce in self._spent:
            return False
        self._spent[token.nonce] = token.expires_at
        return True


# ------------------------------------------------------------------------------------ rate limit


class OfferRateLimiter:
    """A token bucket per client address: ``burst`` offers at once, then ``rate_per_s`` sustained."""

    def __init__(self, *, rate_per_s: float, burst: int, max_clients: int = 10_000) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._max_clients = max_clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def take(self, client: str, now: float) -> float | None:
        """None when the offer may go ahead; otherwise the seconds until it may be retried."""
        tokens, last = self._buckets.pop(client, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + max(0.0, now - last) * self.rate_per_s)
        wait: float | None = None
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            wait = (1.0 - tokens) / self.rate_per_s
        self._buckets[client] = (tokens, now)
        while len(self._buckets) > self._max_clients:
            self._buckets.popitem(last=False)  # the least recently seen client starts afresh
        return wait


# ---------------------------------------------------------------------------------------- router


def _default_route(config: GatewayConfig, *, public_only: bool) -> RouteConfig | None:
    for route in config.routes:
        if route.webrtc_public:
            return route
    if public_only or not config.routes:
        return None
    return config.routes[0]


def _refused(exc: CallRefusedError) -> ApiError:
    headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s else None
    status = exc.status if exc.status in (403, 404, 429, 503) else 503
    return ApiError(status, exc.code, str(exc), headers=headers)


def webrtc_router(
    calls: WebRtcCallHandler,
    settings: WebRtcApiSettings | None = None,
    *,
    clock: Callable[[], float] | None = None,
) -> APIRouter:
    """The browser-caller endpoints and the /phone page, answering offers with ``calls``."""
    settings = settings or WebRtcApiSettings()
    limiter = OfferRateLimiter(rate_per_s=settings.offers_per_minute / 60.0, burst=settings.offer_burst)
    spent = SpentTokens()
    process_key = secrets.token_bytes(32)
    router = APIRouter()

    def now_of(request: Request) -> float:
        return (clock or request.app.state.clock or time.time)()

    def key_of(request: Request) -> bytes:
        if settings.token_secret is not None and settings.token_secret.get_secret_value():
            return hashlib.sha256(settings.token_secret.get_secret_value().encode("utf-8")).digest()
        api_token: str | None = request.app.state.token
        if api_token:
            return hashlib.sha256(b"gateway-webrtc-call-token\x00" + api_token.encode("utf-8")).digest()
        return process_key

    errors: dict[int | str, dict[str, Any]] = {
        status: {"description": text}
        for status, text in (
            (400, "bad SDP (bad_sdp)"),
            (401, "no or bad credentials (token_required, invalid_token, token_spent, unauthorized)"),
            (403, "the route is not open to this caller, or its call-time application refused the call"),
            (404, "no such route"),
            (429, "too many offers from this address (Retry-After)"),
            (503, "no capacity, draining, or no worker (Retry-After)"),
        )
    }

    @router.post("/v1/webrtc/offer", response_model=OfferAnswer, tags=["webrtc"], responses=errors)
    async def offer(
        request: Request,
        body: OfferRequest,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
    ) -> OfferAnswer:
        """Answer a browser's offer (non-trickle); the call joins the session core like a SIP call."""
        now = now_of(request)
        client = request.client.host if request.client is not None else ""
        wait = limiter.take(client, now)
        if wait is not None:
            raise ApiError(
                429,
                "rate_limited",
                f"too many offers from {client or 'this address'}; retry in {math.ceil(wait)} s",
                headers={"Retry-After": str(max(1, math.ceil(wait)))},
            )
        plane: ControlPlane = request.app.state.plane
        presented = credentials.credentials if credentials is not None else None
        grant: CallToken | None = None
        public = False
        route_name = body.route
        if presented is not None and presented.startswith(TOKEN_PREFIX):
            try:
                grant = verify_call_token(key_of(request), presented, now=now)
            except InvalidCallTokenError as exc:
                raise ApiError(401, "invalid_token", str(exc), headers={"WWW-Authenticate": "Bearer"}) from None
            if route_name is not None and route_name != grant.route:
                raise ApiError(403, "forbidden", f"the call token is for route {grant.route!r}, not {route_name!r}")
            route_name = grant.route
        elif not token_matches(presented, request.app.state.token):
            if presented is not None:
                raise ApiError(401, "unauthorized", "wrong bearer token", headers={"WWW-Authenticate": "Bearer"})
            public = True  # anonymous: public routes only
        if route_name is None:
            default = _default_route(plane.config, public_only=public)
            if default is None:
                raise ApiError(401, "token_required", "no route takes public browser calls: a call token is needed")
            route_name = default.name
        route = plane.config.route_named(route_name)
        if route is None:
            raise ApiError(404, "no_route", f"no route named {route_name!r}")
        if public and not route.webrtc_public:
            raise ApiError(
                401,
                "token_required",
                f"route {route.name!r} is not public: a call token is needed (POST /v1/webrtc/tokens)",
                headers={"WWW-Authenticate": "Bearer"},
            )
        try:
            check_offer(body.sdp)
        except OfferError as exc:
            raise ApiError(400, "bad_sdp", str(exc)) from None
        if grant is not None:
            lease_s = max(1.0, grant.expires_at - now + 1.0)
            if not spent.spend(grant, now) or not await plane.store.try_lock(f"webrtc-token:{grant.nonce}", lease_s):
                raise ApiError(401, "token_spent", "this call token was already used; ask for a new one")
        try:
            metadata = grant.metadata if grant is not None else None
            answer = await calls.answer(body.sdp, route=route.name, public=public, client=client, metadata=metadata)
        except OfferError as exc:
            raise ApiError(400, "bad_sdp", str(exc)) from None
        except CallRefusedError as exc:
            raise _refused(exc) from None
        return OfferAnswer(sdp=answer.sdp, call_id=answer.call_id)

    @router.post(
        "/v1/webrtc/tokens",
        response_model=TokenResponse,
        tags=["webrtc"],
        dependencies=[Depends(require_api_token)],
        responses={401: errors[401], 404: errors[404]},
    )
    async def mint(request: Request, body: TokenRequest) -> TokenResponse:
        """A short-lived, single-use call token for one route (for a /phone link or your own web page)."""
        plane: ControlPlane = request.app.state.plane
        if plane.config.route_named(body.route) is None:
            raise ApiError(404, "no_route", f"no route named {body.route!r}")
        if body.ttl_s > settings.max_token_ttl_s:
            raise ApiError(
                400,
                "bad_request",
                f"ttl_s may be at most {settings.max_token_ttl_s} s (GATEWAY_WEBRTC_MAX_TOKEN_TTL_S)",
            )
        expires_at = int(now_of(request)) + body.ttl_s
        token = mint_call_token(key_of(request), route=body.route, expires_at=expires_at, metadata=body.metadata)
        return TokenResponse(token=token, expires_at=float(expires_at), route=body.route)

    def page_file(name: str, media_type: str) -> FileResponse:
        return FileResponse(str(STATIC_DIR / name), media_type=media_type, headers=_PAGE_HEADERS)

    @router.get("/phone", include_in_schema=False)
    async def phone() -> FileResponse:
        return page_file("phone.html", "text/html")

    @router.get("/phone/phone.js", include_in_schema=False)
    async def phone_js() -> FileResponse:
        return page_file("phone.js", "text/javascript")

    @router.get("/phone/phone.css", include_in_schema=False)
    async def phone_css() -> FileResponse:
        return page_file("phone.css", "text/css")

    return router
