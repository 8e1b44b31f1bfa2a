"""A route's early media reaches the worker with the admission decision; bad values are refused at load time."""

from __future__ import annotations

import pytest

from gateway.control.config import ConfigError, parse_config
from gateway.fleet import AdmissionRequest
from gateway.fleet.models import EarlyMediaModel
from tests.gateway.control.conftest import TEST_CONFIG, Env, make_config


async def test_the_decision_carries_the_routes_early_media(env: Env) -> None:
    plain = await env.plane.admit(AdmissionRequest(called="+15550199"))
    assert plain.accepted and plain.early_media is None  # "off", the default: no early media
    ringing = {"name": "ring", "did": "+15550777", "profile": "support", "early_media": "tone", "early_media_s": 2}
    env.plane.config = make_config(routes=[*TEST_CONFIG["routes"], ringing])  # type: ignore[list-item]
    decision = await env.plane.admit(AdmissionRequest(called="+15550777"))
    assert decision.accepted and decision.early_media == EarlyMediaModel(mode="tone", seconds=2.0)


def test_a_route_with_early_media_gives_it_to_its_calls() -> None:
    routes = [
        {"name": "ring", "did": "1", "profile": "support", "early_media": "tone", "early_media_s": 4.5},
        {"name": "hello", "did": "2", "profile": "support", "early_media": "greeting"},
        {"name": "file", "did": "3", "profile": "support", "early_media": "tone", "early_media_file": "/a/b.wav"},
    ]
    config = parse_config({**TEST_CONFIG, "routes": routes}, "test.toml")
    plans = [route.early_media_model() for route in config.routes]
    assert plans == [
        EarlyMediaModel(mode="tone", seconds=4.5),
        EarlyMediaModel(mode="greeting", seconds=3.0),
        EarlyMediaModel(mode="tone", seconds=3.0, file="/a/b.wav"),
    ]


@pytest.mark.parametrize(
    "fields", [{"early_media": "music"}, {"early_media": "tone", "early_media_s": 0}, {"early_media_s": 61}]
)
def test_bad_early_media_is_refused_at_load(fields: dict[str, object]) -> None:
    route = {"name": "x", "did": "1", "profile": "support", **fields}
    with pytest.raises(ConfigError, match="early_media"):
        parse_config({**TEST_CONFIG, "routes": [route]}, "test.toml")
