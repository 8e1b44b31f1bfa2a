"""Fixtures for control-plane tests: a fake clock, an app over ASGITransport, a fake worker attached."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis

from gateway.control.app import create_app
from gateway.control.config import GatewayConfig, parse_config
from gateway.control.plane import ControlPlane
from gateway.control.settings import ControlSettings
from gateway.control.store import MemoryStore
from gateway.fleet import InProcessControlLink
from tests.gateway.fleet.fake_worker import FakeWorker
from tests.support.peers import require_binary
from tests.support.procs import free_ports

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


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = require_binary("redis-server")
    workdir: Path = tmp_path_factory.mktemp("redis")
    (port,) = free_ports()
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"redis://127.0.0.1:{port}/0"
        _wait_for_redis(url, process, deadline_s=10)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def _wait_for_redis(url: str, process: subprocess.Popen[bytes], deadline_s: float) -> None:
    """Poll PING until redis-server answers (it takes a few ms), failing at the deadline."""
    client = redis.Redis.from_url(url, socket_connect_timeout=1)
    deadline = time.monotonic() + deadline_s
    try:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {process.returncode}")
            with contextlib.suppress(OSError, redis.ConnectionError):
                if client.ping():
                    return
            time.sleep(0.02)
        raise TimeoutError(f"redis-server did not answer within {deadline_s} s")
    finally:
        client.close()
