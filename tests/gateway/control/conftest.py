"""Fixtures for control-plane tests: a fake clock, an app over ASGITransport, a fake worker attached."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from gateway.control.app import create_app
from gateway.control.config import GatewayConfig, parse_config
from gateway.control.plane import ControlPlane
from gateway.control.settings import ControlSettings
from gateway.control.store import MemoryStore
from gateway.fleet import InProcessControlLink
from tests.gateway.fleet.fake_worker import FakeWorker

TOKEN = "test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class FakeClock:
    def __init__(self, now: float = 1_767_225_600.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


TEST_CONFIG = {
    "limits": {"max_calls": 6, "retry_after_s": 7},
    "fleet": {"heartbeat_interval_s": 2.0, "lost_after_missed": 3, "forget_after_s": 60.0, "event_ring_size": 50},
    "routes": [
        {"name": "support", "did": "+15550199", "profile": "support", "max_calls": 2},
        {"name": "sales", "did": "+1555020*", "profile": "sales"},
        {"name": "uk", "did_regex": r"^\+44", "profile": "sales"},
        {"name": "browser", "did": "web", "profile": "support", "webrtc_public": True},
    ],
    "profiles": {
        "support": {"provider": "echo", "greeting": "Hello"},
        "sales": {"provider": "openai", "model": "gpt-realtime", "voice": "marin"},
    },
}


def make_config(**overrides: object) -> GatewayConfig:
    data = {**TEST_CONFIG, **overrides}
    return parse_config(data, "test.toml")


@dataclass
class Env:
    app: object
    plane: ControlPlane
    client: httpx.AsyncClient
    clock: FakeClock
    worker: FakeWorker

    async def add_worker(self, worker_id: str, capacity: int = 10) -> FakeWorker:
        worker = FakeWorker(worker_id, capacity=capacity, clock=self.clock)
        await worker.connect(InProcessControlLink(self.plane, worker))
        return worker


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def env(clock: FakeClock) -> AsyncIterator[Env]:
    settings = ControlSettings(api_token=TOKEN)
    config = make_config()
    store = MemoryStore(ring_size=config.fleet.event_ring_size)
    app = create_app(settings, config=config, store=store, clock=clock, sweeper=False)
    plane: ControlPlane = app.state.plane
    worker = FakeWorker("worker-a", capacity=10, clock=clock)
    await worker.connect(InProcessControlLink(plane, worker))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://control.test") as client:
        yield Env(app=app, plane=plane, client=client, clock=clock, worker=worker)
