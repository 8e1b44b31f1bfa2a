"""The session core on its real public path: a CallSession speaking the OpenAI adapter to the fake OpenAI server
over a real websocket on 127.0.0.1. The test drives the media tick by hand (push_inbound / pull_outbound)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from gateway.providers.base import AgentProfile, HistoryItem, RealtimeModel
from gateway.providers.fake_server import FakeRealtimeServer
from gateway.providers.openai import OpenAIConfig, OpenAIRealtimeModel, OpenAISession
from gateway.session import CallSession
from gateway.session.config import SessionConfig
from gateway.session.events import SessionEvent
from gateway.session.tools import ToolRegistry
from tests.gateway.session.fakes import FakeCallControl, fast_config

DEADLINE = 5.0


def openai_model(url: str) -> OpenAIRealtimeModel:
    return OpenAIRealtimeModel(OpenAIConfig(url=url, setup_timeout_s=2.0, open_timeout_s=2.0))


class RoutedModel:
    """The worker's model registry in small: each connect goes to the model named by the profile's ``model``
    (another endpoint), so one call can meet a second, broken provider. Capabilities are the first model's."""

    def __init__(self, models: dict[str, OpenAIRealtimeModel], *, default: str) -> None:
        self._models = models
        self._default = default
        self.name = "openai"
        self.capabilities = models[default].capabilities

    async def connect(
        self, profile: AgentProfile, *, history: tuple[HistoryItem, ...] = (), resume_handle: str | None = None
    ) -> OpenAISession:
        model = self._models.get(profile.model, self._models[self._default])
        return await model.connect(profile, history=history, resume_handle=resume_handle)


def real_session(
    model: RealtimeModel,
    *,
    config: SessionConfig | None = None,
    profile: AgentProfile | None = None,
    tools: ToolRegistry | None = None,
    call_id: str = "c1",
) -> tuple[CallSession, FakeCallControl]:
    control = FakeCallControl()
    session = CallSession(
        call_id=call_id,
        profile=profile or AgentProfile(name="agent", provider="openai"),
        model=model,
        control=control,
        config=config or fast_config(),
        tools=tools,
    )
    return session, control


async def wait_for(session: CallSession, predicate: Callable[[SessionEvent], bool]) -> SessionEvent:
    return (await session.events.wait_for(predicate, timeout_s=DEADLINE)).event


def events_of(session: CallSession, kind: type[SessionEvent]) -> list[Any]:
    return [r.event for r in session.events.events_since(0)[0] if isinstance(r.event, kind)]


async def wait_record(fake: FakeRealtimeServer, predicate: Callable[[], bool]) -> None:
    await fake.wait_until(predicate, within_s=DEADLINE)


async def tick_until(session: CallSession, predicate: Callable[[], bool], *, limit: int = 250) -> int:
    """Pull a frame every 20 ms as the media tick would, until ``predicate()`` (at most ``limit`` ticks); returns
    the number of agent frames pulled."""
    frames = 0
    for _ in range(limit):
        if predicate():
            return frames
        if session.pull_outbound() is not None:
            frames += 1
        await asyncio.sleep(0.02)
    raise AssertionError("the condition never held")
