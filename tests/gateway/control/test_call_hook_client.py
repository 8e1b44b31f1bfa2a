"""The call-time hook through the control plane's admission, against a real application on 127.0.0.1 (uvicorn):
signed requests, overrides in the decision, refusals releasing the slot, the fallback within the deadline with a
``call.hook_failed`` event for a slow, failing or absent application."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.control.call_hook_client import CallHookClient
from gateway.control.plane import ControlPlane
from gateway.control.signing import WebhookSigner
from gateway.control.store import MemoryStore
from gateway.fleet import InProcessControlLink
from gateway.fleet.models import AdmissionRequest
from gateway.observability import REGISTRY
from tests.gateway.control.conftest import FakeClock, make_config
from tests.gateway.fleet.fake_worker import FakeWorker
from tests.gateway.fleet.servers import serve
from tests.support.call_hook_app import CallHookApp
from tests.support.procs import free_ports

SECRET = "test-hook-secret"
DEADLINE_S = 0.5


@contextlib.asynccontextmanager
async def _plane(url: str, *, fallback: str = "profile") -> AsyncIterator[ControlPlane]:
    config = make_config(
        routes=[
            {
                "name": "support",
                "did": "*",
                "profile": "support",
                "application": {"url": url, "fallback": fallback},
            }
        ]
    )
    plane = ControlPlane(config, MemoryStore(), clock=FakeClock())
    worker = FakeWorker("worker-a", capacity=10, clock=FakeClock())
    await worker.connect(InProcessControlLink(plane, worker))
    client = CallHookClient(signer=WebhookSigner(SECRET), default_timeout_s=DEADLINE_S)
    plane.call_hook = client
    try:
        yield plane
    finally:
        await client.aclose()
        await plane.aclose()


async def _hook_events(plane: ControlPlane) -> list[dict[str, Any]]:
    events, _, _ = await plane.events_since(0)
    return [event.data for event in events if event.type == "call.hook_failed"]


async def test_an_accept_gives_the_call_the_applications_profile() -> None:
    async def decide(body: dict[str, Any]) -> tuple[int, Any]:
        number = body["context"]["caller_number"]
        return 200, {"action": "accept", "profile": "sales", "instructions": f"VIP {number}", "metadata": {"k": "v"}}

    hook = CallHookApp(decide, secret=SECRET)
    async with serve(hook.app()) as base, _plane(base + "/call") as plane:
        decision = await plane.admit(AdmissionRequest(called="+15550199", caller="+15550111", worker="worker-a"))
        # A retried admission (the first answer lost on the way) gets the same decision without asking again.
        again = await plane.admit(
            AdmissionRequest(called="+15550199", caller="+15550111", worker="worker-a", call_id=decision.call_id)
        )
    assert again == decision
    assert decision.accepted and hook.unsigned == 0
    assert decision.profile is not None and decision.profile.name == "sales"
    assert decision.profile.instructions == "VIP +15550111" and decision.metadata == {"k": "v"}
    (request,) = hook.requests
    assert request["call_id"] == decision.call_id and request["route"] == "support"


async def test_a_reject_refuses_the_call_and_frees_its_slot() -> None:
    async def decide(body: dict[str, Any]) -> tuple[int, Any]:
        return 200, {"action": "reject", "status": 486, "reason": "Busy Here"}

    hook = CallHookApp(decide, secret=SECRET)
    async with serve(hook.app()) as base, _plane(base + "/call") as plane:
        sip = await plane.admit(AdmissionRequest(called="+1", worker="worker-a"))
        web = await plane.admit(AdmissionRequest(kind="webrtc", route="support", worker="worker-a"))
        assert await plane.store.held_cost() in ({}, {"worker-a": 0.0})
    assert (sip.accepted, sip.status, sip.reason, sip.code) == (False, 486, "Busy Here", "application_rejected")
    assert (web.accepted, web.status) == (False, 403) and "486 (Busy Here)" in web.reason


async def test_outbound_calls_are_not_asked() -> None:
    async def decide(body: dict[str, Any]) -> tuple[int, Any]:
        return 200, {"action": "reject"}

    hook = CallHookApp(decide, secret=SECRET)
    async with serve(hook.app()) as base, _plane(base + "/call") as plane:
        decision = await plane.admit(AdmissionRequest(called="+1", direction="outbound", worker="worker-a"))
    assert decision.accepted and hook.requests == []


@pytest.mark.parametrize("fallback", ["profile", "reject"])
async def test_a_slow_application_gets_the_fallback_at_the_deadline(fallback: str) -> None:
    release = asyncio.Event()

    async def decide(body: dict[str, Any]) -> tuple[int, Any]:
        await asyncio.wait_for(release.wait(), timeout=10)
        return 200, {"action": "reject"}

    hook = CallHookApp(decide, secret=SECRET)
    async with serve(hook.app()) as base, _plane(base + "/call", fallback=fallback) as plane:
        started = time.monotonic()
        decision = await plane.admit(AdmissionRequest(called="+1", worker="worker-a"))
        waited = time.monotonic() - started
        release.set()
        (event,) = await _hook_events(plane)
    assert DEADLINE_S <= waited < DEADLINE_S + 1.0
    assert event["problem"] == f"no answer within {DEADLINE_S:g} s" and event["fallback"] == fallback
    assert event["call_id"] == decision.call_id or not decision.accepted
    if fallback == "profile":
        assert decision.accepted and decision.profile is not None and decision.profile.name == "support"
    else:
        assert (decision.accepted, decision.status, decision.code) == (False, 503, "application_unavailable")


async def test_a_refused_connection_and_a_bad_answer_get_the_fallback_and_an_event() -> None:
    (port,) = free_ports()
    fallbacks = REGISTRY.get_sample_value("gateway_call_hook_seconds_count", {"outcome": "fallback"}) or 0.0
    async with _plane(f"http://127.0.0.1:{port}/call") as plane:
        decision = await plane.admit(AdmissionRequest(called="+1", worker="worker-a"))
        (event,) = await _hook_events(plane)
    assert REGISTRY.get_sample_value("gateway_call_hook_seconds_count", {"outcome": "fallback"}) == fallbacks + 1
    assert decision.accepted and decision.profile is not None and decision.profile.name == "support"
    assert "ConnectError" in event["problem"]

    async def decide(body: dict[str, Any]) -> tuple[int, Any]:
        return 200, {"action": "accept", "instructions": "Hello {nobody}"}

    hook = CallHookApp(decide, secret=SECRET)
    async with serve(hook.app()) as base, _plane(base + "/call") as plane:
        decision = await plane.admit(AdmissionRequest(called="+1", worker="worker-a"))
        (event,) = await _hook_events(plane)
    assert decision.accepted and decision.profile is not None and decision.profile.instructions != "Hello {nobody}"
    assert "{nobody}: unknown name" in event["problem"]
