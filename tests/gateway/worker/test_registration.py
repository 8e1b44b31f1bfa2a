"""A media worker registering with a trunk's registrar (gateway/worker/registration.py): settings, the snapshot
the control plane lists, metrics, backoff on a refused password, and removal on drain and on shutdown.

The registrar is tests/gateway/sip/registrar.py's, answering over real UDP on loopback; the worker is a real
MediaWorker. Kamailio as the registrar, with calls through it, is in tests/e2e/test_trunk_registration.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from pydantic import SecretStr, ValidationError

from gateway.control.app import create_app
from gateway.control.settings import ControlSettings
from gateway.fleet import InProcessControlLink
from gateway.observability import REGISTRY
from gateway.providers.echo import EchoConfig, EchoModel
from gateway.worker.registration import instance_id, registration_config
from gateway.worker.settings import TrunkSettings, WorkerSettings
from gateway.worker.worker import MediaWorker
from tests.gateway.control.conftest import AUTH, TOKEN, make_config
from tests.gateway.sip.registrar import FakeRegistrar
from tests.support.procs import free_ports

pytestmark = pytest.mark.timeout(60)


class UdpRegistrar(asyncio.DatagramProtocol):
    """FakeRegistrar answering on a loopback UDP socket, on the loop's clock."""

    def __init__(self, registrar: FakeRegistrar) -> None:
        self.registrar = registrar
        self.transport: asyncio.DatagramTransport | None = None
        self.port = 0
        self.arrivals: dict[int, float] = {}  # CSeq -> when it first arrived

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.port = transport.get_extra_info("sockname")[1]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        now = asyncio.get_running_loop().time()
        answer = self.registrar.handle(data, now)
        self.arrivals.setdefault(self.registrar.requests[-1].cseq.number, now)
        if answer is not None and self.transport is not None:
            self.transport.sendto(answer, addr)

    def distinct_cseqs(self) -> list[int]:
        return sorted({request.cseq.number for request in self.registrar.requests})


@pytest.fixture
async def registrar() -> AsyncIterator[UdpRegistrar]:
    loop = asyncio.get_running_loop()
    protocol = UdpRegistrar(FakeRegistrar(realm="registrar.test", username="gw-auth", password="s3cret"))
    transport, _ = await loop.create_datagram_endpoint(lambda: protocol, local_addr=("127.0.0.1", 0))
    try:
        yield protocol
    finally:
        transport.close()


def settings_for(registrar: UdpRegistrar, **overrides: Any) -> WorkerSettings:
    sip_port = free_ports(1)[0]
    rtp_low = free_ports(10)[0]
    rtp_low += rtp_low % 2
    options: dict[str, Any] = {
        "worker_id": "w-reg",
        "sip_port": sip_port,
        "rtp_ports": f"{rtp_low}-{rtp_low + 7}",
        "trunk": f"127.0.0.1:{registrar.port}",
        "trunk_user": "gw-auth",
        "trunk_password": "s3cret",
        "trunk_register": True,
        "trunk_aor": "sip:+15550100@registrar.test",
        "trunk_register_retry_min_s": 0.2,
        "trunk_register_retry_max_s": 0.8,
        "trunk_unregister_timeout_s": 1.0,
        **overrides,
    }
    return WorkerSettings(**options)


def make_worker(settings: WorkerSettings) -> MediaWorker:
    return MediaWorker(settings, model_factory=lambda name: EchoModel(EchoConfig(delay_frames=1)))


async def until(predicate: Callable[[], Any], *, within: float = 5.0) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not (value := predicate()):
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)
    return value


def metric(name: str, **labels: str) -> float:
    value = REGISTRY.get_sample_value(name, labels)
    return 0.0 if value is None else value


# --- settings ----------------------------------------------------------------------------------


def test_the_registrar_defaults_to_the_trunk_and_the_aor_to_the_trunk_user() -> None:
    settings = WorkerSettings(
        trunk="sip.carrier.example:5080", trunk_user="gw", trunk_password="pw", trunk_register=True
    )
    config = registration_config(
        settings.trunking, transports=settings.sip.sip_transports, worker_id=settings.worker_id
    )
    assert config.registrar == "sip:sip.carrier.example:5080" and config.aor == "sip:gw@sip.carrier.example"
    assert (config.username, config.password, config.expires) == ("gw", "pw", 3600)
    assert config.instance_id == instance_id(settings.worker_id)


def test_the_aor_user_may_differ_from_the_digest_user_and_the_registrar_from_the_trunk() -> None:
    settings = WorkerSettings(
        trunk="out.carrier.example",
        trunk_registrar="sip:reg.carrier.example;transport=tcp",
        trunk_aor="sip:+15550100@carrier.example",
        trunk_user="acct-77",
        trunk_password="pw",
        trunk_register=True,
        trunk_register_expires_s=600,
    )
    config = registration_config(
        settings.trunking, transports=settings.sip.sip_transports, worker_id=settings.worker_id
    )
    assert (config.registrar, config.aor, config.username) == (
        "sip:reg.carrier.example;transport=tcp",
        "sip:+15550100@carrier.example",
        "acct-77",
    )
    assert config.registrar_uri.transport == "tcp" and config.expires == 600


def test_the_password_is_secret() -> None:
    settings = WorkerSettings(trunk="t.example", trunk_user="gw", trunk_password="hunter2", trunk_register=True)
    assert isinstance(settings.trunking.trunk_password, SecretStr)
    assert "hunter2" not in repr(settings) and "hunter2" not in str(settings.model_dump())
    assert "hunter2" not in repr(
        registration_config(settings.trunking, transports=settings.sip.sip_transports, worker_id=settings.worker_id)
    )


def test_each_worker_has_its_own_stable_instance_id() -> None:
    assert instance_id("w-a") == instance_id("w-a") != instance_id("w-b")
    assert instance_id("w-a").startswith("urn:uuid:")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({}, "GATEWAY_TRUNK_REGISTRAR or GATEWAY_TRUNK"),
        ({"trunk": "t.example"}, "GATEWAY_TRUNK_AOR or GATEWAY_TRUNK_USER"),
        ({"trunk": "t.example", "trunk_aor": "sip:1@t.example", "trunk_password": "x"}, "needs GATEWAY_TRUNK_USER"),
        (
            {"trunk_registrar": "sip:t.example;transport=tcp", "trunk_user": "u", "sip_transports": "udp"},
            "asks for tcp",
        ),
        ({"trunk_registrar": "http://t.example", "trunk_user": "u"}, "not a SIP URI"),
        ({"trunk": "t.example", "trunk_aor": "sip:t.example"}, "user part"),
        (
            {"trunk": "t.example", "trunk_user": "u", "trunk_register_retry_min_s": 9, "trunk_register_retry_max_s": 3},
            "RETRY_MIN_S",
        ),
    ],
)
def test_registration_settings_that_cannot_work_are_refused_at_start(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        WorkerSettings(trunk_register=True, **overrides)


def test_without_trunk_register_nothing_is_checked_or_sent() -> None:
    settings = WorkerSettings(trunk_user="u")  # no trunk: fine while registration is off
    assert make_worker(settings).registration.info() is None


# --- a worker and a registrar ------------------------------------------------------------------------


async def test_the_worker_registers_lists_its_registration_and_removes_it_on_drain(
    registrar: UdpRegistrar, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    app = create_app(ControlSettings(api_token=TOKEN), config=make_config(), sweeper=False)
    settings = settings_for(registrar)
    worker = make_worker(settings)
    worker.link = InProcessControlLink(app.state.plane, worker)
    before = metric("gateway_trunk_register_total", worker="w-reg", trunk="default", outcome="registered")
    await worker.start()
    try:
        await until(lambda: worker.registration.client is not None and worker.registration.client.registered)
        [binding] = registrar.registrar.contacts("+15550100", asyncio.get_running_loop().time())
        assert binding.uri == f"sip:gateway@127.0.0.1:{settings.sip.sip_port}"
        assert f'+sip.instance="<{instance_id("w-reg")}>"' in binding.contact
        assert metric("gateway_trunk_registered", worker="w-reg", trunk="default") == 1.0
        registered = metric("gateway_trunk_register_total", worker="w-reg", trunk="default", outcome="registered")
        assert registered == before + 1

        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://plane") as api:

            async def listed() -> dict[str, Any] | None:
                items = (await api.get("/v1/workers", headers=AUTH)).json()["items"]
                registration = items[0].get("registration") if items else None
                return registration if registration and registration["state"] == "registered" else None

            deadline = time.monotonic() + 5
            while (registration := await listed()) is None:
                assert time.monotonic() < deadline, "the plane never listed the registration"
                await asyncio.sleep(0.05)
            assert registration["registrar"] == f"sip:127.0.0.1:{registrar.port}"
            assert registration["aor"] == "sip:+15550100@registrar.test"
            assert registration["expires_s"] == 3600 and registration["last_status"] == 200
            assert abs(registration["expires_at"] - (time.time() + 3600)) < 5
            assert registration["last_error"] == "" and registration["attempts"] == 0

            await worker.drain(exit_when_empty=False)
            await until(lambda: worker.registration.info().state == "unregistered")  # type: ignore[union-attr]
            assert registrar.registrar.contacts("+15550100", asyncio.get_running_loop().time()) == []
            assert metric("gateway_trunk_registered", worker="w-reg", trunk="default") == 0.0
    finally:
        await worker.aclose()
    assert not [r for r in caplog.records if "s3cret" in r.getMessage()]


async def test_a_refused_password_is_reported_and_retried_with_growing_backoff(registrar: UdpRegistrar) -> None:
    worker = make_worker(settings_for(registrar, trunk_password="wrong"))
    await worker.start()
    try:
        info = await until(lambda: (i := worker.registration.info()) is not None and i.state == "failed" and i)
        assert info.last_status == 401
        assert "'gw-auth'" in info.last_error and "'registrar.test'" in info.last_error
        assert info.next_attempt_at is not None and info.next_attempt_at > time.time() - 0.1
        assert metric("gateway_trunk_registered", worker="w-reg", trunk="default") == 0.0
        await until(lambda: worker.registration.client is not None and worker.registration.client.failures >= 4)
        client = worker.registration.client
        assert client is not None
        failures = client.failures
        # Each attempt is the challenge and one answer (CSeq 1-2, 3-4, ...), and the waits between attempts grow
        # with jitter: at least 0.1, 0.2, 0.4 s, then the 0.8 s cap's half.
        cseqs = registrar.distinct_cseqs()
        assert cseqs == list(range(1, len(cseqs) + 1)) and 2 * failures <= len(cseqs) <= 2 * failures + 2
        waits = [registrar.arrivals[2 * k + 1] - registrar.arrivals[2 * k] for k in range(1, failures)]
        for k, wait in enumerate(waits, start=1):
            assert wait >= min(0.8, 0.2 * 2 ** (k - 1)) / 2 - 0.02, (k, waits)
        assert (worker.registration.info() or info).attempts >= 4
    finally:
        await worker.aclose()


async def test_shutdown_with_a_dead_registrar_is_bounded(registrar: UdpRegistrar) -> None:
    worker = make_worker(settings_for(registrar))
    await worker.start()
    await until(lambda: worker.registration.client is not None and worker.registration.client.registered)
    registrar.registrar.silent = True
    before = metric("gateway_trunk_register_total", worker="w-reg", trunk="default", outcome="unregister_failed")
    started = time.monotonic()
    await worker.aclose()
    took = time.monotonic() - started
    assert 0.9 <= took < 3.0, took  # GATEWAY_TRUNK_UNREGISTER_TIMEOUT_S=1, not Timer F's 32 s
    info = worker.registration.info()
    assert info is not None and info.state == "unregistered" and "within 1 s" in info.last_error
    failed = metric("gateway_trunk_register_total", worker="w-reg", trunk="default", outcome="unregister_failed")
    assert failed == before + 1
    assert registrar.registrar.requests[-1].headers.get("Expires") == "0"


async def test_shutdown_removes_the_binding(registrar: UdpRegistrar) -> None:
    worker = make_worker(settings_for(registrar))
    await worker.start()
    await until(lambda: worker.registration.client is not None and worker.registration.client.registered)
    await worker.aclose()
    assert registrar.registrar.contacts("+15550100", asyncio.get_running_loop().time()) == []
    assert worker.registration.info().state == "unregistered"  # type: ignore[union-attr]


def test_every_trunk_setting_is_documented() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    docs = (root / "README.md").read_text() + (root / "docs" / "operations.md").read_text()
    names = [f"GATEWAY_{name.upper()}" for name in TrunkSettings.model_fields if name.startswith("trunk")]
    assert len(names) >= 9
    assert [name for name in names if f"`{name}`" not in docs] == []
