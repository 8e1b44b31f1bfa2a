"""The call-time hook's sans-I/O half: answers parsed and validated, overrides applied through the profiles (templates
checked as at load time), the fallback chosen, refusals shaped for SIP and browser callers, the request's context."""

from __future__ import annotations

import json

import pytest

from gateway.control.call_hook import HookOutcome, decide, hook_request, refusal
from gateway.control.config import ConfigError, GatewayConfig, parse_config
from gateway.fleet.models import AdmissionRequest, InviteFacts

CONFIG = {
    "context": {"headers": ["X-Account"], "trusted_sources": ["10.0.0.0/8"]},
    "routes": [
        {"name": "support", "did": "+1555*", "profile": "agent", "application": {"url": "http://127.0.0.1:9/call"}},
        {
            "name": "strict",
            "did": "*",
            "profile": "agent",
            "application": {"url": "https://app.example/call", "timeout_s": 1.5, "fallback": "reject"},
        },
    ],
    "profiles": {
        "agent": {"provider": "echo", "instructions": "Help {caller_number}."},
        "vip": {"provider": "echo", "voice": "marin", "instructions": "Treat {caller_number} well."},
    },
}


@pytest.fixture
def config() -> GatewayConfig:
    return parse_config(CONFIG, "test.toml")


def _decide(config: GatewayConfig, answer: object, *, status: int = 200, route: str = "support") -> HookOutcome:
    body = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
    found = config.route_named(route)
    assert found is not None
    return decide(status, body, route=found, config=config)


def test_an_accept_picks_a_profile_and_overrides_its_fields(config: GatewayConfig) -> None:
    outcome = _decide(
        config,
        {
            "action": "accept",
            "profile": "vip",
            "instructions": "Caller {caller_number}, account {headers.X-Account}.",
            "greeting": "Hello {caller_name}",
            "provider": "openai",
            "tools": [{"name": "lookup", "url": "http://127.0.0.1:9/tool"}],
            "metadata": {"tier": "gold"},
        },
    )
    assert outcome.action == "accept" and not outcome.fell_back
    profile = outcome.profile
    assert profile is not None
    assert (profile.name, profile.voice, profile.provider) == ("vip", "marin", "openai")
    assert profile.instructions == "Caller {caller_number}, account {headers.X-Account}."
    assert profile.greeting == "Hello {caller_name}"
    assert [tool.name for tool in profile.tools] == ["lookup"] and profile.tools[0].webhook is not None
    assert profile.context.headers == ["X-Account"]  # the routes file's [context] stays
    assert outcome.metadata == {"tier": "gold"}


def test_an_accept_without_overrides_is_the_routes_profile(config: GatewayConfig) -> None:
    outcome = _decide(config, {"action": "accept"})
    assert outcome.profile == config.profiles["agent"]


def test_reject_and_redirect(config: GatewayConfig) -> None:
    busy = _decide(config, {"action": "reject", "status": 486, "reason": "Busy Here"})
    assert (busy.action, busy.status, busy.reason, busy.fell_back) == ("reject", 486, "Busy Here", False)
    moved = _decide(config, {"action": "redirect", "target": "sip:+15550123@pbx.example.net"})
    assert (moved.action, moved.status, moved.target) == ("redirect", 302, "sip:+15550123@pbx.example.net")


@pytest.mark.parametrize(
    ("status", "answer", "problem"),
    [
        (500, {"action": "accept"}, "HTTP 500"),
        (200, b"{not json", "not JSON"),
        (200, {"action": "hold"}, "schema: "),
        (200, {"action": "reject", "status": 200}, "schema: reject.status"),
        (200, {"action": "reject", "reason": "Busy\r\nX-Evil: 1"}, "schema: reject.reason"),
        (200, {"action": "redirect", "target": "http://elsewhere"}, "schema: redirect.target"),
        (200, {"action": "accept", "provider": "nope"}, "unknown provider 'nope'"),
        (200, {"action": "accept", "surprise": 1}, "accept.surprise"),
        (200, {"action": "accept", "profile": "ghost"}, "unknown profile 'ghost'"),
        (200, {"action": "accept", "instructions": "Hi {caller_nmber}"}, "instructions: {caller_nmber}: unknown name"),
        (200, {"action": "accept", "greeting": "{headers.X-Other}"}, "greeting: {headers.X-Other}: header"),
    ],
)
def test_a_bad_answer_takes_the_fallback_naming_the_problem(
    config: GatewayConfig, status: int, answer: object, problem: str
) -> None:
    outcome = _decide(config, answer, status=status)
    assert outcome.fell_back and problem in outcome.problem, outcome.problem
    assert outcome.action == "accept" and outcome.profile == config.profiles["agent"]  # the route's profile
    strict = _decide(config, answer, status=status, route="strict")
    assert (strict.action, strict.status) == ("reject", 503) and problem in strict.problem


def test_refusals_for_sip_and_browser_callers(config: GatewayConfig) -> None:
    busy = _decide(config, {"action": "reject", "status": 486, "reason": "Busy Here"})
    assert (refusal(busy, "sip").status, refusal(busy, "sip").reason) == (486, "Busy Here")
    web = refusal(busy, "webrtc")
    assert (web.status, web.code) == (403, "application_rejected") and "486 (Busy Here)" in web.reason
    moved = _decide(config, {"action": "redirect", "target": "sip:desk@pbx.example.net"})
    assert (refusal(moved, "sip").status, refusal(moved, "sip").contact) == (302, "sip:desk@pbx.example.net")
    assert refusal(moved, "webrtc").status == 403 and "cannot follow" in refusal(moved, "webrtc").reason
    failed = _decide(config, b"", status=502, route="strict")
    assert (refusal(failed, "sip").status, refusal(failed, "webrtc").code) == (503, "application_unavailable")


def test_the_request_carries_the_context_built_from_the_invite(config: GatewayConfig) -> None:
    invite = InviteFacts(
        request_uri="sip:+15550199@gw.example",
        from_header="<sip:anonymous@caller.example>",
        to_uri="<sip:+15550199@gw.example>",
        headers=[("P-Asserted-Identity", "<sip:+15550111@carrier.example>"), ("X-Account", "A-42")],
        transport="udp",
    )
    admission = AdmissionRequest(called="+15550199", source="10.1.2.3:5060", invite=invite)
    route = config.route_named("support")
    assert route is not None
    body = hook_request(admission, call_id="c-1", route=route, config=config).model_dump()
    assert (body["type"], body["call_id"], body["kind"], body["route"], body["profile"]) == (
        "call.incoming",
        "c-1",
        "sip",
        "support",
        "agent",
    )
    context = body["context"]
    assert context["caller_number"] == "+15550111" and context["identity_source"] == "p-asserted-identity"
    assert context["called_number"] == "+15550199" and context["headers"] == {"X-Account": "A-42"}
    assert context["source"] == "10.1.2.3:5060"
    page = AdmissionRequest(kind="webrtc", route="support", source="127.0.0.1", metadata={"plan": "gold"})
    web = hook_request(page, call_id="w-1", route=route, config=config).model_dump()
    assert web["kind"] == "webrtc" and web["context"]["metadata"] == {"plan": "gold"}


def test_a_routes_application_is_checked_at_load() -> None:
    bad = {**CONFIG, "routes": [{"name": "r", "did": "*", "profile": "agent", "application": {"url": "ftp://x"}}]}
    with pytest.raises(ConfigError, match=r"routes\[0\]\.application\.url"):
        parse_config(bad, "test.toml")
    slow = {
        **CONFIG,
        "routes": [{"name": "r", "did": "*", "profile": "agent", "application": {"url": "http://x", "timeout_s": 9}}],
    }
    with pytest.raises(ConfigError, match="timeout_s"):
        parse_config(slow, "test.toml")
