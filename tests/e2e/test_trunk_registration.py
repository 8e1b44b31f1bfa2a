"""``gateway run`` registering with a real registrar (Kamailio: registrar + usrloc in memory + digest auth with a
fixed password, tests/support/kamailio-registrar.cfg) as a trunk that only calls registered contacts.

One story with two gateways registering their own contacts for the same AOR, one over UDP, one over TCP:
1. each authenticates (digest, its auth user distinct from the AOR's user) and is bound: Kamailio's location
   table lists both contacts, each with its own +sip.instance, and /v1/workers shows each registration; the
   one that asked 3600 s was granted the registrar's maximum (8 s), the one that asked 2 s got 423 and asked
   again with the Min-Expires (4 s);
2. they refresh before expiry: the contact's CSeq grows and its binding never lapses, across the registrar's
   nonce expiry (a refresh reusing an old nonce is challenged with stale=true and answered);
3. one drains: its contact disappears from the location table at once (Expires: 0 confirmed by a 200);
4. a call to the AOR through Kamailio (lookup("location"), relayed) reaches the other and the echo agent
   answers: the caller (baresip) hears its own speech;
5. SIGTERM: the gateway drains, removes its contact and exits 0.

And a gateway with a wrong password: /v1/workers says why (realm and user named, 401), and it retries with a
growing backoff, not in a loop.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.gateway_proc import GatewayProcess, start_gateway
from tests.e2e.ops_support import metric_value, poll
from tests.support.audio import align_and_correlate, read_wav
from tests.support.baresip import BaresipPhone
from tests.support.kamailio import Binding, KamailioRegistrar
from tests.support.peers import require_binary
from tests.support.procs import ProcessGroup

pytestmark = [pytest.mark.peer, pytest.mark.timeout(180)]

AOR_USER = "+15550100"
AUTH_USER = "gateway-auth"
PASSWORD = "s3cret-trunk"


def _registration_env(registrar: KamailioRegistrar, worker_id: str, **extra: str) -> dict[str, str]:
    return {
        "GATEWAY_WORKER_ID": worker_id,
        "GATEWAY_SIP_TRANSPORTS": "udp",
        "GATEWAY_TRUNK_REGISTER": "true",
        "GATEWAY_TRUNK_REGISTRAR": registrar.uri,
        "GATEWAY_TRUNK_AOR": f"sip:{AOR_USER}@{registrar.realm}",
        "GATEWAY_TRUNK_USER": AUTH_USER,
        "GATEWAY_TRUNK_PASSWORD": PASSWORD,
        **extra,
    }


async def _registration(gateway: GatewayProcess) -> dict[str, Any] | None:
    workers = (await gateway.api("GET", "/v1/workers"))["items"]
    return workers[0].get("registration") if workers else None


async def _registered(gateway: GatewayProcess) -> dict[str, Any] | None:
    registration = await _registration(gateway)
    return registration if registration is not None and registration["state"] == "registered" else None


def _of(bindings: list[Binding], gateway: GatewayProcess) -> Binding | None:
    address = f"sip:gateway@127.0.0.1:{gateway.sip_port}"
    return next((b for b in bindings if b.address.split(";")[0] == address), None)


async def _metrics(gateway: GatewayProcess) -> str:
    async with gateway.client() as client:
        response = await client.get("/metrics")
        response.raise_for_status()
        return response.text


@pytest.fixture(autouse=True)
def _peers() -> None:
    require_binary("kamailio")
    require_binary("kamcmd", package="kamailio")


async def test_two_gateways_register_refresh_take_a_call_and_unregister(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    require_binary("baresip", package="baresip baresip-core")
    registrar = KamailioRegistrar(
        peer_procs,
        tmp_path,
        auth_user=AUTH_USER,
        auth_password=PASSWORD,
        min_expires=4,
        max_expires=8,
        nonce_expire=5,
        lifetime=170,
    )
    registrar.check_config()
    await registrar.start()
    long_ask, short_ask = await asyncio.gather(
        start_gateway(peer_procs, env=_registration_env(registrar, "w-long"), name="gw-long", lifetime=170),
        start_gateway(
            peer_procs,
            env=_registration_env(
                registrar,
                "w-short",
                GATEWAY_TRUNK_REGISTER_EXPIRES_S="2",
                GATEWAY_TRUNK_REGISTRAR=f"{registrar.uri};transport=tcp",
                GATEWAY_SIP_TRANSPORTS="udp,tcp",
            ),
            name="gw-short",
            lifetime=170,
        ),
    )

    # 1. Both bound, each with its own contact and instance; the grants are the registrar's.
    both = await registrar.wait_bindings(
        AOR_USER, lambda b: _of(b, long_ask) is not None and _of(b, short_ask) is not None, within=15, what="both"
    )
    first_long, first_short = _of(both, long_ask), _of(both, short_ask)
    assert first_long is not None and first_short is not None
    assert first_long.instance and first_short.instance and first_long.instance != first_short.instance
    assert first_short.address.endswith(";transport=tcp") and ";" not in first_long.address  # each its transport
    long_reg = await poll(lambda: _registered(long_ask), within=10, what="w-long registered")
    short_reg = await poll(lambda: _registered(short_ask), within=10, what="w-short registered")
    assert long_reg["expires_s"] == 8 and short_reg["expires_s"] == 4  # asked 3600: max; asked 2: 423, then 4
    assert long_reg["registrar"] == registrar.uri and short_reg["registrar"] == f"{registrar.uri};transport=tcp"
    for registration, gateway in ((long_reg, long_ask), (short_reg, short_ask)):
        assert registration["aor"] == f"sip:{AOR_USER}@{registrar.realm}"
        assert f"127.0.0.1:{gateway.sip_port}" in registration["contact"]
        assert registration["last_status"] == 200 and registration["last_error"] == ""
        assert 0 < registration["expires_at"] - time.time() <= 8.5
    assert first_short.cseq >= 3  # the 401, its answer refused as too brief (423), then the longer ask
    assert "not authorized (-5)" in (registrar.process.output if registrar.process else "")

    # 2. Refreshes before expiry, across a stale nonce: the CSeq grows, the binding never lapses.
    started = time.monotonic()
    cseq = first_long.cseq
    while time.monotonic() - started < 12:  # one and a half grants of w-long, past the 5 s nonce expiry
        current = _of(await registrar.bindings(AOR_USER), long_ask)
        assert current is not None, "w-long's binding lapsed"
        assert current.cseq >= cseq
        cseq = current.cseq
        await asyncio.sleep(0.5)
    assert cseq >= first_long.cseq + 2  # three or more refreshes in 12 s at 0.4-0.5 of 8 s
    assert "not authorized (-4)" in (registrar.process.output if registrar.process else "")  # stale nonces met
    long_metrics = await _metrics(long_ask)
    assert (metric_value(long_metrics, "gateway_trunk_register_total", {"outcome": "refreshed"}) or 0) >= 2
    assert metric_value(long_metrics, "gateway_trunk_registered", {"worker": "w-long"}) == 1.0
    for outcome in ("rejected", "auth_rejected", "timeout"):
        assert not metric_value(long_metrics, "gateway_trunk_register_total", {"outcome": outcome})
    assert (await _registered(long_ask)) is not None

    # 3. w-short drains: its contact goes at once, confirmed by the registrar.
    await short_ask.api("POST", "/v1/workers/w-short/drain", json={"exit_when_empty": False})
    left = await registrar.wait_bindings(
        AOR_USER, lambda b: _of(b, short_ask) is None, within=3, what="w-short's contact removed"
    )
    assert _of(left, long_ask) is not None
    short_after = await poll(
        lambda: _state(short_ask, "unregistered"), within=5, what="w-short unregistered in /v1/workers"
    )
    assert short_after["last_error"] == "" and short_after["last_status"] == 200
    short_metrics = await _metrics(short_ask)
    assert metric_value(short_metrics, "gateway_trunk_register_total", {"outcome": "unregistered"}) == 1.0
    assert metric_value(short_metrics, "gateway_trunk_registered", {"worker": "w-short"}) == 0.0

    # 4. A call to the AOR through the registrar reaches w-long; the echo agent answers.
    phone = BaresipPhone(peer_procs, tmp_path, source_wav=speech_8k, name="caller", user="alice", tail_silence=1.5)
    async with phone:
        await phone.dial(registrar.sip_uri(AOR_USER))
        await phone.wait_established(within=15)
        await phone.wait_closed(within=40)
    sent = read_wav(speech_8k)
    heard = read_wav(phone.last_recording().decoded)
    correlation, _ = align_and_correlate(sent.samples, heard.samples, sent.rate, max_slip_seconds=0.25)
    assert correlation >= 0.9, correlation
    ended = (await long_ask.api("GET", "/v1/calls", params={"state": "ended"}))["items"]
    assert [(c["to"], c["from"]) for c in ended] == [(AOR_USER, "alice")]
    assert not (await short_ask.api("GET", "/v1/calls"))["items"]  # the drained one was never offered it

    # 5. SIGTERM: drain, remove the contact, exit 0.
    os.kill(long_ask.process.pid, signal.SIGTERM)
    await registrar.wait_bindings(AOR_USER, lambda b: not b, within=5, what="w-long's contact removed")
    assert await long_ask.process.wait(within=30) == 0
    assert "trunk registration removed (binding removed)" in long_ask.process.output
    assert PASSWORD not in long_ask.process.output and PASSWORD not in short_ask.process.output


async def _state(gateway: GatewayProcess, state: str) -> dict[str, Any] | None:
    registration = await _registration(gateway)
    return registration if registration is not None and registration["state"] == state else None


async def test_a_wrong_password_is_reported_and_retried_with_backoff(peer_procs: ProcessGroup, tmp_path: Path) -> None:
    registrar = KamailioRegistrar(peer_procs, tmp_path, auth_user=AUTH_USER, auth_password=PASSWORD, lifetime=100)
    await registrar.start()
    env = _registration_env(
        registrar,
        "w-wrong",
        GATEWAY_TRUNK_PASSWORD="not-the-password",
        GATEWAY_TRUNK_REGISTER_RETRY_MIN_S="0.5",
        GATEWAY_TRUNK_REGISTER_RETRY_MAX_S="2",
    )
    gateway = await start_gateway(peer_procs, env=env, name="gw-wrong", lifetime=100)
    failed = await poll(lambda: _state(gateway, "failed"), within=15, what="the registration failed")
    assert failed["last_status"] == 401
    assert f"'{AUTH_USER}'" in failed["last_error"] and f"'{registrar.realm}'" in failed["last_error"]
    assert failed["next_attempt_at"] is not None

    first_seen = time.monotonic()
    later = await poll(
        lambda: _attempts_at_least(gateway, 4), within=20, what="four attempts", every=0.2
    )  # waits of 0.25-0.5, 0.5-1, 1-2 s between them
    elapsed = time.monotonic() - first_seen
    assert later["state"] in ("failed", "registering") and later["last_status"] == 401
    text = await _metrics(gateway)
    rejected = metric_value(text, "gateway_trunk_register_total", {"outcome": "auth_rejected"}) or 0
    # Not a hot loop: each attempt is one challenge and one answer, with a growing wait in between.
    assert 3 <= rejected <= 4 + elapsed / 0.25, (rejected, elapsed)
    assert metric_value(text, "gateway_trunk_registered", {"worker": "w-wrong"}) == 0.0
    assert not await registrar.bindings(AOR_USER)
    assert "not-the-password" not in gateway.process.output


async def _attempts_at_least(gateway: GatewayProcess, attempts: int) -> dict[str, Any] | None:
    registration = await _registration(gateway)
    return registration if registration is not None and registration["attempts"] >= attempts else None


async def test_registering_through_an_outbound_proxy_to_a_registrar_name_that_does_not_resolve(
    peer_procs: ProcessGroup, tmp_path: Path
) -> None:
    # The registrar's name is .invalid (RFC 2606): only the outbound proxy (Kamailio's address, over TCP) reaches it.
    registrar = KamailioRegistrar(peer_procs, tmp_path, auth_user=AUTH_USER, auth_password=PASSWORD, lifetime=60)
    await registrar.start()
    env = _registration_env(
        registrar,
        "w-proxied",
        GATEWAY_TRUNK_REGISTRAR="sip:registrar.invalid",
        GATEWAY_SIP_OUTBOUND_PROXY=f"127.0.0.1:{registrar.port};transport=tcp",
        GATEWAY_SIP_TRANSPORTS="udp,tcp",
    )
    gateway = await start_gateway(peer_procs, env=env, name="gw-proxied", lifetime=60)
    registration = await poll(lambda: _registered(gateway), within=15, what="registered through the proxy")
    assert registration["registrar"] == "sip:registrar.invalid" and registration["last_status"] == 200
    [binding] = await registrar.wait_bindings(
        AOR_USER, lambda b: _of(b, gateway) is not None, within=5, what="the proxied contact"
    )
    assert binding.address == f"sip:gateway@127.0.0.1:{gateway.sip_port};transport=tcp"  # the proxy's transport
