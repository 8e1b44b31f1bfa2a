"""The control plane's cookies for browsers: the ``gateway_media`` cookie opens the recordings route, and only it.

Past the authorisation, the route answers 404 for a call it does not know; a refused request is 401."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from gateway.control.app import create_app
from gateway.control.auth import make_media_cookie, make_sse_cookie
from gateway.control.settings import ControlSettings
from tests.gateway.control.conftest import AUTH, TOKEN, FakeClock, make_config


@pytest.fixture
async def client(clock: FakeClock) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(ControlSettings(api_token=TOKEN), config=make_config(), clock=clock, sweeper=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://control.test") as client:
        yield client


async def test_the_session_sets_a_media_cookie_that_opens_recordings_only(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/session", headers=AUTH)
    cookies = response.headers.get_list("set-cookie")
    media_cookie = next(c for c in cookies if c.startswith("gateway_media="))
    for part in ("HttpOnly", "Path=/v1/calls", "SameSite=strict", "Max-Age=3600"):
        assert part.lower() in media_cookie.lower()
    value = media_cookie.split(";")[0].split("=", 1)[1]
    headers = {"Cookie": f"gateway_media={value}"}
    past = await client.get("/v1/calls/c-1/recording", headers=headers)
    assert past.status_code == 404 and past.json()["error"]["code"] == "call_not_found"
    # Not the history, not a command: those still need the bearer header.
    assert (await client.get("/v1/calls", headers=headers)).status_code == 401
    assert (await client.post("/v1/calls/c-1/say", headers=headers, json={"text": "hi"})).status_code == 401


async def test_a_media_route_refuses_forged_expired_and_event_stream_cookies(
    client: httpx.AsyncClient, clock: FakeClock
) -> None:
    sse, _ = make_sse_cookie(TOKEN, clock())
    expired, _ = make_media_cookie(TOKEN, clock() - 7200)
    other_token, _ = make_media_cookie("another-token-0123456789", clock())
    for value in (sse, expired, other_token, "99999999999.deadbeef", "garbage"):
        response = await client.get("/v1/calls/c-1/recording", headers={"Cookie": f"gateway_media={value}"})
        assert response.status_code == 401, value
        assert "gateway_media cookie" in response.json()["error"]["message"]
    assert (await client.get("/v1/calls/c-1/recording", headers=AUTH)).status_code == 404
