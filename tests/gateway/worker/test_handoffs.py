"""The worker's side of handoffs: profiles made into targets (rendered with the call's context, served by the
worker's model), refusals for unknown profiles and unbuildable providers, and the events' names on the stream."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gateway.fleet.models import ProfileModel, ToolModel, WebhookSpec
from gateway.providers.base import Capabilities
from gateway.providers.errors import ProviderConfigError
from gateway.session.errors import HandoffRefusedError
from gateway.session.events import HandedOff, HandoffFailed, HandoffStarted
from gateway.sip.caller_context import CallContext
from gateway.worker.handoffs import ProfileHandoffs, handoff_report
from tests.gateway.session.fakes import FakeModel

CONTEXT = CallContext(call_id="c-1", caller_number="+15550111", called_number="+15550199")


def _models() -> tuple[dict[str, FakeModel], list[str]]:
    models = {"openai": FakeModel(name="openai"), "gemini": FakeModel(name="gemini", capabilities=Capabilities())}
    return models, []


def _model_for(models: dict[str, FakeModel], asked: list[str]) -> Callable[[str], FakeModel]:
    def model_for(provider: str) -> FakeModel:
        asked.append(provider)
        if provider not in models:
            raise ProviderConfigError(f"unknown provider {provider!r}")
        return models[provider]

    return model_for


def test_a_target_is_rendered_for_the_call_and_brings_its_webhooks_and_onward_handoffs() -> None:
    models, asked = _models()
    support = ProfileModel(name="support", provider="openai", handoffs=["billing"])
    billing = ProfileModel(
        name="billing",
        provider="gemini",
        instructions="Billing for {caller_number}.",
        handoffs=["support"],
        tools=[ToolModel(name="invoice", webhook=WebhookSpec(url="https://hooks.test/invoice"))],
        handoff_profiles={"support": support},
    )
    targets = ProfileHandoffs({"billing": billing}, context=CONTEXT, model_for=_model_for(models, asked))
    target = targets.resolve("billing")
    assert target.profile.instructions == 'Billing for "+15550111".'
    assert target.profile.handoffs == ("support",) and target.model is models["gemini"] and asked == ["gemini"]
    (webhook,) = target.webhook_tools
    assert webhook.url == "https://hooks.test/invoice" and webhook.context["caller_number"] == "+15550111"
    assert target.targets is not None and target.targets.resolve("support").profile.name == "support"


def test_unknown_profiles_and_providers_that_cannot_be_built_are_refused() -> None:
    models, asked = _models()
    broken = ProfileModel(name="broken", provider="nowhere")
    targets = ProfileHandoffs({"broken": broken}, context=None, model_for=_model_for(models, asked))
    with pytest.raises(HandoffRefusedError, match="no profile 'sales'"):
        targets.resolve("sales")
    with pytest.raises(HandoffRefusedError, match="profile 'broken': provider 'nowhere'"):
        targets.resolve("broken")


def test_handoff_events_have_their_stream_names() -> None:
    fields = {"from_profile": "a", "to_profile": "b", "reason": "r", "initiator": "agent"}
    assert handoff_report(HandoffStarted(**fields))[0] == "agent.handoff_started"  # type: ignore[arg-type]
    kind, data = handoff_report(HandedOff(**fields, epoch=2))  # type: ignore[arg-type]
    assert (kind, data) == ("agent.handed_off", {**fields, "epoch": 2})
    assert handoff_report(HandoffFailed(**fields, error="x"))[0] == "agent.handoff_failed"  # type: ignore[arg-type]
