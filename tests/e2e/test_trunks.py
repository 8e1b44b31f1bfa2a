"""``gateway run`` with two trunks from its routes file (GATEWAY_CONFIG ``[trunks.a]``, ``[trunks.b]``), each a real
Kamailio registrar with its own account (tests/support/kamailio-registrar.cfg), and baresip phones on distinct
loopback addresses as each trunk's callers:

1. both trunks register (each with its own digest account and AOR): each registrar's location table holds the
   gateway's contact, and GET /v1/workers lists both registrations by trunk, each ``registered``;
2. a call from trunk A's address (127.0.0.2) answering A's inbound credentials is taken: the caller hears its
   own speech back from the echo agent; the same address answering with B's credentials is refused (401 again,
   never established), and so is a source of no trunk (403, ``GATEWAY_TRUNK_UNMATCHED_CALLS=reject``); the taken
   call's record names trunk ``a``, and ``GET /v1/calls?trunk=`` finds it by that name only;
3. a call placed through trunk B (the route's ``trunk = "b"``) reaches B: B's registrar relays it to the phone
   registered there, which answers; trunk A's registrar never sees an INVITE; its record names trunk ``b``;
4. no password of any trunk appears in the gateway's output.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.gateway_proc import GatewayProcess, start_gateway
from tests.e2e.ops_support import poll
from tests.support.audio import align_and_correlate, read_wav
from tests.support.baresip import BaresipPhone
from tests.support.kamailio import KamailioRegistrar
from tests.support.peers import require_binary
from tests.support.procs import ProcessGroup

pytestmark = [pytest.mark.peer, pytest.mark.timeout(180)]

SECRETS = ("out-a-secret", "out-b-secret", "in-a-secret", "in-b-secret")


def _routes_file(tmp_path: Path, a: KamailioRegistrar, b: KamailioRegistrar) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(
        f"""
[[routes]]
name = "via-b"
did = "+1555014*"
profile = "echo"
trunk = "b"

[[routes]]
name = "default"
did = "*"
profile = "echo"

[profiles.echo]
provider = "echo"

[trunks.a]
address = "127.0.0.1:{a.port}"
user = "gw-a"
password = "out-a-secret"
register = true
aor = "sip:+15550100@{a.realm}"
sources = ["127.0.0.2/32"]
inbound_credentials = [{{ user = "carrier-a", password = "in-a-secret" }}]

[trunks.b]
address = "127.0.0.1:{b.port}"
user = "gw-b"
password = "out-b-secret"
register = true
aor = "sip:+15550200@{b.realm}"
sources = ["127.0.0.3/32"]
inbound_credentials = [{{ user = "carrier-b", password = "in-b-secret" }}]
"""
    )
    return path


async def _registrations(gateway: GatewayProcess) -> dict[str, dict[str, Any]] | None:
    workers = (await gateway.api("GET", "/v1/workers"))["items"]
    if not workers:
        return None
    registrations = {r["trunk"]: r for r in workers[0].get("registrations", [])}
    if sorted(registrations) != ["a", "b"] or any(r["state"] != "registered" for r in registrations.values()):
        return None
    return registrations


async def test_two_trunks_register_take_their_callers_and_carry_calls_out(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    require_binary("kamailio")
    require_binary("kamcmd", package="kamailio")
    require_binary("baresip", package="baresip baresip-core")
    registrar_a = KamailioRegistrar(
        peer_procs, tmp_path, name="carrier-a", realm="carrier-a.test", auth_user="gw-a",
        auth_password="out-a-secret", max_expires=60, lifetime=170,
    )  # fmt: skip
    registrar_b = KamailioRegistrar(
        peer_procs, tmp_path, name="carrier-b", realm="carrier-b.test", auth_user="gw-b",
        auth_password="out-b-secret", max_expires=60, lifetime=170,
    )  # fmt: skip
    await asyncio.gather(registrar_a.start(), registrar_b.start())
    gateway = await start_gateway(
        peer_procs,
        env={
            "GATEWAY_WORKER_ID": "w-trunks",
            "GATEWAY_SIP_TRANSPORTS": "udp",
            "GATEWAY_CONFIG": str(_routes_file(tmp_path, registrar_a, registrar_b)),
            "GATEWAY_TRUNK_UNMATCHED_CALLS": "reject",
            # baresip 1.0 binds its RTP to any address, so its packets to 127.0.0.1 leave from 127.0.0.1 whatever
            # its SDP (127.0.0.2) says: latch to the source the packets come from.
            "GATEWAY_RTP_STRICT_SOURCE": "false",
        },
        name="gw-trunks",
        lifetime=170,
    )

    # 1. One registration per trunk, each at its own registrar, both listed by trunk.
    registrations = await poll(lambda: _registrations(gateway), within=15, what="both trunks registered")
    assert registrations["a"]["registrar"] == registrar_a.uri and registrations["b"]["registrar"] == registrar_b.uri
    assert registrations["a"]["aor"] == "sip:+15550100@carrier-a.test"
    assert registrations["b"]["aor"] == "sip:+15550200@carrier-b.test"
    contact = f"sip:gateway@127.0.0.1:{gateway.sip_port}"
    [bound_a] = await registrar_a.wait_bindings("+15550100", bool, within=5, what="A's binding")
    [bound_b] = await registrar_b.wait_bindings("+15550200", bool, within=5, what="B's binding")
    assert bound_a.address == contact and bound_b.address == contact
    assert not await registrar_a.bindings("+15550200") and not await registrar_b.bindings("+15550100")
    workers = (await gateway.api("GET", "/v1/workers"))["items"]
    assert workers[0]["registration"]["trunk"] in ("a", "b")  # the old single field is still filled

    gateway_uri = f"sip:+15550199@127.0.0.1:{gateway.sip_port}"
    # 2a. From A's address with A's credentials: taken, and the echo agent answers.
    caller_a = BaresipPhone(
        peer_procs, tmp_path, source_wav=speech_8k, name="caller-a", user="+15550111", host="127.0.0.2",
        auth=("carrier-a", "in-a-secret"), tail_silence=1.5,
    )  # fmt: skip
    async with caller_a:
        await caller_a.dial(gateway_uri)
        await caller_a.wait_established(within=15)
        await caller_a.wait_closed(within=40)
    sent = read_wav(speech_8k)
    heard = read_wav(caller_a.last_recording().decoded)
    correlation, _ = align_and_correlate(sent.samples, heard.samples, sent.rate, max_slip_seconds=0.25)
    assert correlation >= 0.9, correlation

    # 2b. From A's address with B's credentials: challenged again and never taken.
    impostor = BaresipPhone(
        peer_procs, tmp_path, source_wav=speech_8k, name="impostor", user="+15550112", host="127.0.0.2",
        auth=("carrier-b", "in-b-secret"),
    )  # fmt: skip
    async with impostor:
        await impostor.dial(gateway_uri)
        closed = await impostor.wait_closed(within=15)
    assert not [e for e in impostor.events if e.type == "CALL_ESTABLISHED"]
    assert "401" in closed.param or "Unauthorized" in closed.param, closed

    # 2c. From no trunk's address: refused before any challenge.
    stranger = BaresipPhone(
        peer_procs, tmp_path, source_wav=speech_8k, name="stranger", user="+15550113", host="127.0.0.4",
        auth=("carrier-a", "in-a-secret"),
    )  # fmt: skip
    async with stranger:
        await stranger.dial(gateway_uri)
        refused = await stranger.wait_closed(within=15)
    assert not [e for e in stranger.events if e.type == "CALL_ESTABLISHED"]
    assert "403" in refused.param or "Forbidden" in refused.param, refused
    calls = (await gateway.api("GET", "/v1/calls", params={"state": "ended"}))["items"]
    assert [(c["from"], c["trunk"]) for c in calls] == [("+15550111", "a")]  # only A's caller became a call
    assert [c["id"] for c in await _by_trunk(gateway, "a")] == [calls[0]["id"]]
    assert await _by_trunk(gateway, "b") == []

    # 3. Out through trunk B (the route's trunk): B's registrar relays it to the phone registered there (only
    #    there: A has no binding for it and would answer 404), which answers and hears its own speech back.
    callee_b = BaresipPhone(
        peer_procs, tmp_path, source_wav=speech_8k, name="callee-b", user="+15550142",
        aor=f"sip:+15550142@127.0.0.1:{registrar_b.port}", auth=("gw-b", "out-b-secret"), regint=60,
        auto_answer=True, tail_silence=1.5,
    )  # fmt: skip
    async with callee_b:
        await registrar_b.wait_bindings("+15550142", bool, within=10, what="the callee registered at B")
        assert not await registrar_a.bindings("+15550142")
        created = await gateway.api("POST", "/v1/calls", json={"to": "+15550142", "caller_id": "+15550142"})
        assert created["route"] == "via-b"
        await callee_b.wait_established(within=15)
        await callee_b.wait_closed(within=40)
    heard = read_wav(callee_b.last_recording().decoded)
    correlation, _ = align_and_correlate(sent.samples, heard.samples, sent.rate, max_slip_seconds=0.25)
    assert correlation >= 0.9, correlation
    placed = await poll(
        lambda: _ended_call(gateway, created["id"]), within=10, what="the placed call ended in the history"
    )
    assert (placed["direction"], placed["to"], placed["route"]) == ("outbound", "+15550142", "via-b")
    assert placed["trunk"] == "b"
    assert [c["id"] for c in await _by_trunk(gateway, "b")] == [created["id"]]

    # 4. No password of any trunk in the gateway's output.
    for secret in SECRETS:
        assert secret not in gateway.process.output


async def _by_trunk(gateway: GatewayProcess, trunk: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = (await gateway.api("GET", "/v1/calls", params={"trunk": trunk}))["items"]
    return items


async def _ended_call(gateway: GatewayProcess, call_id: str) -> dict[str, Any] | None:
    call = await gateway.api("GET", f"/v1/calls/{call_id}")
    return call if call.get("state") == "ended" else None
