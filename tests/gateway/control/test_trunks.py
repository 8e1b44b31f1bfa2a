"""Trunks in the control plane: the routes file's [trunks] tables and routes[].trunk checked at load, an
originate through the route's trunk or a named one (422 for an unknown), secrets never in the config's repr, and
each worker's registrations listed by trunk in /v1/workers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from gateway.control.app import create_app
from gateway.control.config import ConfigError, parse_config
from gateway.control.settings import ControlSettings
from gateway.control.store import MemoryStore
from gateway.fleet import InProcessControlLink
from gateway.fleet.models import TrunkRegistration
from tests.gateway.control.conftest import AUTH, TEST_CONFIG, TOKEN, FakeClock
from tests.gateway.fleet.fake_worker import FakeWorker

TRUNKS: dict[str, Any] = {
    "a": {"address": "sip.carrier-a.example", "user": "gw", "password": "hunter2", "sources": ["198.51.100.0/24"]},
    "b": {
        "address": "sip.carrier-b.example",
        "register": True,
        "sources": ["203.0.113.0/24"],
        "inbound_credentials": [{"user": "carrier-b", "password": "in-b-secret"}],
    },
}


def _config(**overrides: object) -> dict[str, Any]:
    routes = [{**route, "trunk": "a"} if route["name"] == "support" else route for route in TEST_CONFIG["routes"]]
    return {**TEST_CONFIG, "routes": routes, "trunks": TRUNKS, **overrides}


def test_routes_name_trunks_the_file_declares_or_default() -> None:
    config = parse_config(_config(), "gw.toml")
    assert sorted(config.trunks) == ["a", "b"] and config.route_named("support").trunk == "a"  # type: ignore[union-attr]
    assert config.knows_trunk("default") and not config.knows_trunk("c")
    assert "hunter2" not in repr(config.trunks) and "in-b-secret" not in repr(config.trunks)
    routes = [{**TEST_CONFIG["routes"][0], "trunk": "c"}, {**TEST_CONFIG["routes"][1], "trunk": "default"}]
    with pytest.raises(ConfigError, match=r"gw\.toml: routes\[0\]\.trunk: unknown trunk 'c' \(known: a, b, default\)"):
        parse_config(_config(routes=routes), "gw.toml")


@pytest.mark.parametrize(
    ("trunk", "message"),
    [
        ({"sources": ["10.0.0.0/40"]}, r"gw\.toml: trunks\.x\.sources: .*is not a network"),
        ({"codecs": ["g729"]}, r"gw\.toml: trunks\.x\.codecs: .*unknown codec"),
        ({"transport": "sctp"}, r"gw\.toml: trunks\.x\.transport: "),
        ({"adress": "typo"}, r"gw\.toml: trunks\.x\.adress: Extra inputs"),
        ({"inbound_credentials": [{"user": "u", "password": "p"}]}, r"trunks\.x: .*need sources"),
    ],
)
def test_a_trunk_table_that_cannot_work_fails_the_load_naming_its_key(trunk: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(_config(trunks={"x": trunk}), "gw.toml")


@pytest.fixture
async def api() -> AsyncIterator[tuple[httpx.AsyncClient, FakeWorker]]:
    clock = FakeClock()
    config = parse_config(_config(), "gw.toml")
    app = create_app(
        ControlSettings(api_token=TOKEN), config=config, store=MemoryStore(ring_size=50), clock=clock, sweeper=False
    )
    worker = FakeWorker("worker-a", capacity=10, clock=clock)
    await worker.connect(InProcessControlLink(app.state.plane, worker))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://control.test") as client:
        yield client, worker


async def test_an_originate_goes_through_the_routes_trunk_or_the_one_it_names(
    api: tuple[httpx.AsyncClient, FakeWorker],
) -> None:
    client, worker = api
    by_route = await client.post("/v1/calls", headers=AUTH, json={"to": "+15550123", "route": "support"})
    assert by_route.status_code == 201
    named = await client.post("/v1/calls", headers=AUTH, json={"to": "+15550123", "route": "support", "trunk": "b"})
    assert named.status_code == 201
    neither = await client.post("/v1/calls", headers=AUTH, json={"to": "+15550123", "route": "sales"})
    assert neither.status_code == 201
    assert [request.trunk for request, _ in worker.originated] == ["a", "b", None]
    assert [admission.trunk for _, admission in worker.originated] == ["a", "a", None]  # the route's, for its dialling

    unknown = await client.post("/v1/calls", headers=AUTH, json={"to": "+15550123", "route": "sales", "trunk": "zz"})
    assert unknown.status_code == 422
    error = unknown.json()["error"]
    assert error["code"] == "unknown_trunk" and "'zz' (known: a, b, default)" in error["message"]
    assert len(worker.originated) == 3  # nothing was dialled


async def test_workers_list_each_trunks_registration(api: tuple[httpx.AsyncClient, FakeWorker]) -> None:
    client, worker = api
    registrations = [
        TrunkRegistration(trunk="a", state="registered", registrar="sip:reg-a", aor="sip:1@a", expires_s=60),
        TrunkRegistration(trunk="b", state="failed", registrar="sip:reg-b", aor="sip:2@b", last_status=403),
    ]
    worker.registration = registrations[0]
    worker.registrations = registrations
    await worker.heartbeat()
    (listed,) = (await client.get("/v1/workers", headers=AUTH)).json()["items"]
    assert [(r["trunk"], r["state"], r["registrar"]) for r in listed["registrations"]] == [
        ("a", "registered", "sip:reg-a"),
        ("b", "failed", "sip:reg-b"),
    ]
    assert listed["registration"]["trunk"] == "a"
