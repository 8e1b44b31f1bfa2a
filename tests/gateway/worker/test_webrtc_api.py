"""The browser-call HTTP surface (gateway/control/webrtc_api.py): offer auth, call tokens, rate limit, errors.

The offer handler is a recording fake with the worker's ``answer`` signature; the app is the real control
plane app over ASGITransport with a fake clock.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from gateway.control.app import create_app
from gateway.control.config import parse_config
from gateway.control.settings import ControlSettings
from gateway.control.webrtc_api import (
    InvalidCallTokenError,
    OfferRateLimiter,
    SpentTokens,
    WebRtcApiSettings,
    mint_call_token,
    verify_call_token,
    webrtc_router,
)
from gateway.transport.webrtc import CallRefusedError, OfferError, WebRtcAnswer

TOKEN = "ops-token-0123456789abcdef"
OPS = {"Authorization": f"Bearer {TOKEN}"}
KEY = b"k" * 32
OFFER = "\r\n".join(
    [
        "v=0",
        "o=- 1 2 IN IP4 127.0.0.1",
        "s=-",
        "t=0 0",
        "a=fingerprint:sha-256 " + ":".join(["AB"] * 32),
        "m=audio 9 UDP/TLS/RTP/SAVPF 111",
        "c=IN IP4 0.0.0.0",
        "a=ice-ufrag:abcd",
        "a=ice-pwd:0123456789abcdef012345",
        "a=setup:actpass",
        "a=rtpmap:111 opus/48000/2",
        "",
    ]
)
ROUTES = [
    {"name": "support", "did": "+15550199", "profile": "echo"},
    {"name": "browser", "did": "web", "profile": "echo", "webrtc_public": True},
]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_767_225_600.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeCalls:
    """Records offers; raises `error` when set."""

    offers: list[dict[str, Any]] = field(default_factory=list)
    error: Exception | None = None

    async def answer(
        self, sdp: str, *, route: str | None, public: bool, client: str = "", metadata: Mapping[str, str] | None = None
    ) -> WebRtcAnswer:
        offer: dict[str, Any] = {"route": route, "public": public, "client": client}
        if metadata:
            offer["metadata"] = dict(metadata)
        self.offers.append(offer)
        if self.error is not None:
            raise self.error
        return WebRtcAnswer(sdp="v=0\r\nanswer\r\n", call_id=f"w-{len(self.offers)}")


@dataclass
class Api:
    client: httpx.AsyncClient
    calls: FakeCalls
    clock: FakeClock
    app: Any

    async def offer(self, headers: dict[str, str] | None = None, **body: Any) -> httpx.Response:
        return await self.client.post("/v1/webrtc/offer", json={"sdp": OFFER, "type": "offer", **body}, headers=headers)

    async def mint(self, route: str = "support", **body: Any) -> str:
        response = await self.client.post("/v1/webrtc/tokens", json={"route": route, **body}, headers=OPS)
        assert response.status_code == 200, response.text
        return str(response.json()["token"])


def _app(routes: list[dict[str, Any]], calls: FakeCalls, clock: FakeClock, **settings: Any) -> Any:
    config = parse_config({"routes": routes, "profiles": {"echo": {"provider": "echo"}}}, "test.toml")
    api_settings = WebRtcApiSettings(**{"offers_per_minute": 60.0, "offer_burst": 100, **settings})
    return create_app(
        ControlSettings(api_token=TOKEN),
        config=config,
        clock=clock,
        sweeper=False,
        routers=[webrtc_router(calls, api_settings)],
    )


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    calls, clock = FakeCalls(), FakeClock()
    app = _app(ROUTES, calls, clock)
    transport = httpx.ASGITransport(app=app, client=("198.51.100.7", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        yield Api(client=client, calls=calls, clock=clock, app=app)


def _error(response: httpx.Response) -> tuple[int, str, str]:
    body = response.json()
    assert set(body) == {"error"}, body
    return response.status_code, body["error"]["code"], body["error"]["message"]


# --------------------------------------------------------------------------------------- tokens


def test_call_token_round_trip_expiry_and_tampering() -> None:
    token = mint_call_token(KEY, route="support", expires_at=1000)
    assert token.startswith("wct1.")
    grant = verify_call_token(KEY, token, now=999.0)
    assert (grant.route, grant.expires_at) == ("support", 1000) and len(grant.nonce) >= 16
    assert verify_call_token(KEY, mint_call_token(KEY, route="support", expires_at=1000), now=0).nonce != grant.nonce
    with pytest.raises(InvalidCallTokenError, match="expired"):
        verify_call_token(KEY, token, now=1000.0)
    with pytest.raises(InvalidCallTokenError, match="signature"):
        verify_call_token(b"x" * 32, token, now=0)
    prefix, payload, mac = token.split(".")
    data = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    data["r"] = "admin"
    forged = base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()
    with pytest.raises(InvalidCallTokenError, match="signature"):
        verify_call_token(KEY, f"{prefix}.{forged}.{mac}", now=0)
    flipped = mac[:-2] + ("A" if mac[-2] != "A" else "B") + mac[-1]
    with pytest.raises(InvalidCallTokenError, match="signature"):
        verify_call_token(KEY, f"{prefix}.{payload}.{flipped}", now=0)
    for malformed in ("wct1.", "wct1.abc", "nope.abc.def", "wct1." + "a" * 2000, f"{prefix}.{payload}.!!"):
        with pytest.raises(InvalidCallTokenError):
            verify_call_token(KEY, malformed, now=0)


def test_spent_tokens_are_remembered_until_they_expire() -> None:
    spent = SpentTokens(max_entries=2)
    a = verify_call_token(KEY, mint_call_token(KEY, route="r", expires_at=100), now=0)
    b = verify_call_token(KEY, mint_call_token(KEY, route="r", expires_at=200), now=0)
    c = verify_call_token(KEY, mint_call_token(KEY, route="r", expires_at=300), now=0)
    assert spent.spend(a, now=0) and not spent.spend(a, now=1)
    assert spent.spend(b, now=1)
    assert not spent.spend(c, now=50)  # full of live nonces: refuse rather than forget one
    assert spent.spend(c, now=150)  # a's entry expired and was pruned
    assert not spent.spend(b, now=150)


def test_rate_limiter_token_bucket_per_client() -> None:
    limiter = OfferRateLimiter(rate_per_s=0.5, burst=3, max_clients=2)
    assert [limiter.take("a", 0.0) for _ in range(3)] == [None, None, None]
    assert limiter.take("a", 0.0) == pytest.approx(2.0)
    assert limiter.take("a", 1.0) == pytest.approx(1.0)  # half a token refilled (and the refusal costs nothing)
    assert limiter.take("a", 2.0) is None
    assert limiter.take("b", 2.0) is None  # another address has its own bucket
    limiter.take("c", 2.0)  # evicts "a", the least recently seen
    assert [limiter.take("a", 2.0) for _ in range(3)] == [None, None, None]


async def test_mint_needs_the_ops_token_and_a_known_route(api: Api) -> None:
    response = await api.client.post("/v1/webrtc/tokens", json={"route": "support"})
    assert _error(response)[:2] == (401, "unauthorized")
    response = await api.client.post("/v1/webrtc/tokens", json={"route": "nope"}, headers=OPS)
    assert _error(response)[:2] == (404, "no_route")
    response = await api.client.post("/v1/webrtc/tokens", json={"route": "support", "ttl_s": 7200}, headers=OPS)
    assert _error(response)[:2] == (400, "bad_request")
    response = await api.client.post("/v1/webrtc/tokens", json={"route": "support", "ttl_s": 1}, headers=OPS)
    assert _error(response)[:2] == (422, "validation_error")
    response = await api.client.post("/v1/webrtc/tokens", json={"route": "support"}, headers=OPS)
    assert response.status_code == 200
    body = response.json()
    assert body["expires_at"] == api.clock.now + 300 and body["route"] == "support"


# ---------------------------------------------------------------------------------------- offers


async def test_anonymous_offer_goes_to_the_public_route(api: Api) -> None:
    response = await api.offer()
    assert response.status_code == 200, response.text
    assert response.json() == {"sdp": "v=0\r\nanswer\r\n", "type": "answer", "call_id": "w-1"}
    assert api.calls.offers == [{"route": "browser", "public": True, "client": "198.51.100.7"}]


async def test_anonymous_offer_to_a_private_route_needs_a_token(api: Api) -> None:
    status, code, message = _error(await api.offer(route="support"))
    assert (status, code) == (401, "token_required") and "support" in message
    assert _error(await api.offer(route="nowhere"))[:2] == (404, "no_route")
    assert _error(await api.offer({"Authorization": "Bearer wrong"}, route="browser"))[:2] == (401, "unauthorized")
    assert api.calls.offers == []


async def test_ops_token_may_call_any_route(api: Api) -> None:
    assert (await api.offer(OPS, route="support")).status_code == 200
    assert api.calls.offers == [{"route": "support", "public": False, "client": "198.51.100.7"}]


async def test_call_token_is_single_use_and_bound_to_its_route(api: Api) -> None:
    token = await api.mint("support", ttl_s=60)
    bearer = {"Authorization": f"Bearer {token}"}
    assert _error(await api.offer(bearer, route="browser"))[:2] == (403, "forbidden")
    bad = await api.client.post("/v1/webrtc/offer", json={"sdp": "v=0\r\n", "type": "offer"}, headers=bearer)
    assert _error(bad)[:2] == (400, "bad_sdp")  # a bad offer does not spend the token
    assert (await api.offer(bearer)).status_code == 200
    assert api.calls.offers == [{"route": "support", "public": False, "client": "198.51.100.7"}]
    assert _error(await api.offer(bearer))[:2] == (401, "token_spent")

    expiring = {"Authorization": f"Bearer {await api.mint('support', ttl_s=60)}"}
    api.clock.now += 61
    status, code, message = _error(await api.offer(expiring))
    assert (status, code) == (401, "invalid_token") and "expired" in message
    forged = {"Authorization": f"Bearer {mint_call_token(b'z' * 32, route='support', expires_at=2_000_000_000)}"}
    assert _error(await api.offer(forged))[:2] == (401, "invalid_token")
    assert len(api.calls.offers) == 1


async def test_a_tokens_metadata_reaches_the_call_and_is_bounded(api: Api) -> None:
    metadata = {"plan": "gold", "user-id": "u-7"}
    token = await api.mint("support", metadata=metadata)
    assert (await api.offer({"Authorization": f"Bearer {token}"})).status_code == 200
    assert api.calls.offers[-1]["metadata"] == metadata
    for bad in ({"bad key": "x"}, {"k": "v" * 257}, {f"k{i}": "v" for i in range(17)}, {"k": 1}):
        response = await api.client.post("/v1/webrtc/tokens", json={"route": "support", "metadata": bad}, headers=OPS)
        assert _error(response)[:2] == (422, "validation_error"), bad
    huge = {f"k{i}": "v" * 100 for i in range(12)}
    response = await api.client.post("/v1/webrtc/tokens", json={"route": "support", "metadata": huge}, headers=OPS)
    status, _, message = _error(response)
    assert status == 422 and "at most 1024" in message


async def test_bad_sdp_is_400_with_a_reason(api: Api) -> None:
    status, code, message = _error(await api.offer(sdp=OFFER.replace("opus/48000/2", "PCMU/8000")))
    assert (status, code) == (400, "bad_sdp") and "opus" in message
    assert _error(await api.offer(type="answer"))[:2] == (422, "validation_error")
    api.calls.error = OfferError("SDP offer rejected: DTLS setup attribute must be 'active', 'passive' or 'actpass'")
    status, code, message = _error(await api.offer())
    assert (status, code) == (400, "bad_sdp") and "setup" in message


async def test_refusals_from_the_worker_keep_status_code_and_retry_after(api: Api) -> None:
    api.calls.error = CallRefusedError(
        503, "webrtc_busy", "the limit of 20 concurrent browser calls is reached", retry_after_s=5
    )
    response = await api.offer()
    assert _error(response)[:2] == (503, "webrtc_busy") and response.headers["Retry-After"] == "5"
    api.calls.error = CallRefusedError(403, "forbidden", "route 'browser' does not take public WebRTC calls")
    response = await api.offer()
    assert _error(response)[:2] == (403, "forbidden") and "Retry-After" not in response.headers


async def test_offers_are_rate_limited_per_client_address() -> None:
    calls, clock = FakeCalls(), FakeClock()
    app = _app(ROUTES, calls, clock, offers_per_minute=6.0, offer_burst=2)
    first = httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=("198.51.100.7", 1)), base_url="http://g")
    other = httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=("198.51.100.8", 1)), base_url="http://g")
    body = {"sdp": OFFER, "type": "offer"}
    async with first, other:
        assert [(await first.post("/v1/webrtc/offer", json=body)).status_code for _ in range(2)] == [200, 200]
        refused = await first.post("/v1/webrtc/offer", json=body)
        status, code, _ = _error(refused)
        assert (status, code) == (429, "rate_limited") and refused.headers["Retry-After"] == "10"
        assert (await other.post("/v1/webrtc/offer", json=body)).status_code == 200
        clock.now += 10
        assert (await first.post("/v1/webrtc/offer", json=body)).status_code == 200
    assert len(calls.offers) == 4


async def test_without_a_public_route_anonymous_callers_need_a_token() -> None:
    calls, clock = FakeCalls(), FakeClock()
    app = _app([ROUTES[0]], calls, clock)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as client:
        response = await client.post("/v1/webrtc/offer", json={"sdp": OFFER, "type": "offer"})
        assert _error(response)[:2] == (401, "token_required")
        response = await client.post("/v1/webrtc/offer", json={"sdp": OFFER, "type": "offer"}, headers=OPS)
        assert response.status_code == 200  # the ops token defaults to the first route
    assert calls.offers == [{"route": "support", "public": False, "client": "127.0.0.1"}]


async def test_phone_page_and_assets_are_served_with_a_strict_policy(api: Api) -> None:
    page = await api.client.get("/phone")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert "microphone=(self)" in page.headers["permissions-policy"]
    assert '<script src="/phone/phone.js"' in page.text and 'id="call"' in page.text
    script = await api.client.get("/phone/phone.js")
    assert script.status_code == 200 and "/v1/webrtc/offer" in script.text
    style = await api.client.get("/phone/phone.css")
    assert style.status_code == 200 and style.headers["content-type"].startswith("text/css")
    schema = (await api.client.get("/openapi.json")).json()
    assert {"/v1/webrtc/offer", "/v1/webrtc/tokens"} <= set(schema["paths"])
