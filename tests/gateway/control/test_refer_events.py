"""Incoming REFER at the control plane: a route's ``refer`` / ``refer_allow`` reach the worker in the admission
decision (declined by default), a worker's refer reports are published on the stream with their data, and
``call.referred`` becomes a webhook event."""

from __future__ import annotations

import pytest

from gateway.control.config import ConfigError, parse_config
from gateway.control.webhook_events import from_stream
from gateway.fleet import AdmissionRequest, WorkerEvent
from gateway.fleet.models import ReferPolicyModel, ReferralLine
from tests.gateway.control.conftest import AUTH, TEST_CONFIG, Env


async def test_the_route_policy_travels_with_the_admission(env: Env) -> None:
    default = await env.plane.admit(AdmissionRequest(called="+15550199", worker="worker-a"))
    assert default.refer == ReferPolicyModel(mode="off")
    routes = [{**TEST_CONFIG["routes"][0], "refer": "accept", "refer_allow": ["sip:*@pbx.example.com"]}]  # type: ignore[index]
    config = parse_config({**TEST_CONFIG, "routes": routes}, "test.toml")
    route = config.resolve("+15550199")
    assert route is not None and route.refer_policy() == ReferPolicyModel(
        mode="accept", allow=("sip:*@pbx.example.com",)
    )


def test_a_bad_refer_setting_fails_the_load() -> None:
    routes = [{**TEST_CONFIG["routes"][0], "refer": "maybe"}]  # type: ignore[index]
    with pytest.raises(ConfigError, match="refer"):
        parse_config({**TEST_CONFIG, "routes": routes}, "test.toml")


def test_policy_matches_the_uri_or_its_host() -> None:
    policy = ReferPolicyModel(mode="accept", allow=("sip:1???@pbx.example.com", "10.0.0.*"))
    assert policy.allows("sip:1234@PBX.example.com", "pbx.example.com")
    assert policy.allows("sip:anyone@10.0.0.7:5060", "10.0.0.7")
    assert not policy.allows("sip:12345@pbx.example.com", "pbx.example.com")
    assert not policy.allows("tel:+19005550100", "")
    assert ReferPolicyModel(mode="accept").allows("tel:+19005550100", "")  # no allow-list: any target
    assert not ReferPolicyModel(mode="off", allow=("*",)).allows("sip:a@b", "b")


async def test_refer_reports_are_published_and_the_referral_stays_in_the_call(env: Env) -> None:
    decision = await env.worker.place_call("+15550199")
    mark = await env.plane.store.last_event_id()
    line = ReferralLine(at_s=3.5, target="sip:human@pbx.example.com", outcome="referred", status=200)
    call = env.worker.calls[decision.call_id].model_copy(update={"referrals": [line]})
    env.worker.calls[call.id] = call
    assert env.worker.link is not None
    target = {"target": "sip:human@pbx.example.com"}
    await env.worker.link.report(
        [
            WorkerEvent(
                type="call.refer_received",
                worker="worker-a",
                time=env.clock(),
                call=call,
                data={**target, "outcome": "accepted", "status": 202},
            ),
            WorkerEvent(
                type="call.referred", worker="worker-a", time=env.clock(), call=call, data={**target, "status": 200}
            ),
        ]
    )
    events, _, _ = await env.plane.events_since(mark)
    assert [e.type for e in events] == ["call.updated", "call.refer_received", "call.referred"]
    assert events[2].data == {"call_id": call.id, **target, "status": 200}
    view = (await env.client.get(f"/v1/calls/{call.id}", headers=AUTH)).json()
    assert view["referrals"] == [line.model_dump(mode="json")]
    (webhook,) = from_stream("call.referred", events[2].data, 1.0, event_id=3, answered_known=True)
    assert webhook.type == "call.referred" and webhook.call_id == call.id
    assert from_stream("call.refer_received", events[1].data, 1.0, event_id=2, answered_known=True) == []
