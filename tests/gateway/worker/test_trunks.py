"""A worker with two trunks from its routes file, over real UDP on loopback (scripted SIP peers as the carriers):
a call placed through trunk B goes to B's address, answers B's challenge with B's credentials and offers B's
codecs, A sees nothing; a call from A's address is accepted with A's inbound credentials and refused with B's;
a caller from no trunk's address gets 403 with ``GATEWAY_TRUNK_UNMATCHED_CALLS=reject``. Each call's snapshot
names its trunk: the one its INVITE came from (by source address; none for a caller of no trunk's), or the one it
was placed through."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from gateway.fleet.models import AdmissionDecision, OriginateRequest
from gateway.observability import REGISTRY
from gateway.sip.auth import DigestAuthenticator, DigestClientCredentials
from gateway.sip.digest import DigestChallenger
from gateway.sip.events import CallOffered, OutboundCallAnswered, OutboundCallFailed
from tests.gateway.worker.sip_peer import SipPeer, echo_worker

pytestmark = pytest.mark.timeout(60)


def _challenging(user: str, password: str) -> DigestAuthenticator:
    challenger = DigestChallenger(realm="carrier", credentials={user: password}.get, nonce_secret=b"n" * 32)
    return DigestAuthenticator(challenger, rng=random.Random(3))


def _routes_file(tmp_path: Path, a_port: int, b_port: int) -> str:
    path = tmp_path / "gateway.toml"
    path.write_text(
        f"""
[trunks.a]
address = "127.0.0.1:{a_port}"
user = "gw-a"
password = "out-a"
sources = ["127.0.0.2/32"]
inbound_credentials = [{{ user = "carrier-a", password = "in-a" }}]

[trunks.b]
address = "127.0.0.1:{b_port}"
user = "gw-b"
password = "out-b"
codecs = ["PCMA"]
sources = ["127.0.0.3/32"]
inbound_credentials = [{{ user = "carrier-b", password = "in-b" }}]
"""
    )
    return str(path)


async def test_a_call_placed_through_trunk_b_reaches_b_with_bs_credentials_and_codecs(tmp_path: Path) -> None:
    async with (
        SipPeer() as carrier_a,
        SipPeer(authenticator=_challenging("gw-b", "out-b")) as carrier_b,
    ):
        config = _routes_file(tmp_path, carrier_a.port, carrier_b.port)
        async with echo_worker(worker_id="w-trunks", rtp_timeout_s=5.0, config=config) as worker:
            before = REGISTRY.get_sample_value(
                "gateway_trunk_calls_total", {"worker": "w-trunks", "trunk": "b", "direction": "outbound"}
            )
            await worker.originate(
                OriginateRequest(to="+15550123", trunk="b"),
                AdmissionDecision(accepted=True, call_id="c-via-b", route="default"),
            )
            offered = await carrier_b.wait_for(CallOffered)
            assert isinstance(offered, CallOffered)
            assert offered.request_uri == f"sip:+15550123@127.0.0.1:{carrier_b.port}"
            invites = [r for r in carrier_b.requests if r.method == "INVITE"]
            assert len(invites) == 2 and 'username="gw-b"' in (invites[1].headers.get("Authorization") or "")
            assert b"PCMA" in offered.body and b"PCMU" not in offered.body and b"G722" not in offered.body
            assert not carrier_a.requests
            after = REGISTRY.get_sample_value(
                "gateway_trunk_calls_total", {"worker": "w-trunks", "trunk": "b", "direction": "outbound"}
            )
            assert after == (before or 0) + 1
            carrier_b.answer(offered)
            leg = worker.legs["c-via-b"]
            assert leg.answered is not None and await leg.answered
            assert (await leg.snapshot()).trunk == "b"
            await worker.hang_up("c-via-b", "test")


async def test_a_call_from_trunk_as_address_answers_as_credentials_not_bs(tmp_path: Path) -> None:
    async with (
        SipPeer(host="127.0.0.2") as from_a,
        echo_worker(worker_id="w-in", rtp_timeout_s=5.0, config=_routes_file(tmp_path, 5, 6)) as worker,
    ):
        target = f"sip:+15550199@127.0.0.1:{worker.settings.sip.sip_port}"
        wrong = from_a.invite(target, credentials=DigestClientCredentials(username="carrier-b", password="in-b"))
        failed = await from_a.wait_for(OutboundCallFailed, call=wrong.handle)
        assert isinstance(failed, OutboundCallFailed) and failed.status == 401
        right = from_a.invite(target, credentials=DigestClientCredentials(username="carrier-a", password="in-a"))
        answered = await from_a.wait_for(OutboundCallAnswered, call=right.handle, within=10.0)
        assert isinstance(answered, OutboundCallAnswered)
        taken = {"worker": "w-in", "trunk": "a", "direction": "inbound"}
        assert REGISTRY.get_sample_value("gateway_trunk_calls_total", taken) == 1.0
        from_a.hang_up(right)


async def test_a_call_from_no_trunks_address_is_refused_when_unmatched_calls_are(tmp_path: Path) -> None:
    async with (
        SipPeer(host="127.0.0.4") as stranger,
        echo_worker(
            worker_id="w-closed",
            rtp_timeout_s=5.0,
            config=_routes_file(tmp_path, 5, 6),
            trunk_unmatched_calls="reject",
        ) as worker,
    ):
        call = stranger.invite(f"sip:+15550199@127.0.0.1:{worker.settings.sip.sip_port}")
        failed = await stranger.wait_for(OutboundCallFailed, call=call.handle)
        assert isinstance(failed, OutboundCallFailed) and failed.status == 403


async def test_each_inbound_call_is_named_by_the_trunk_its_source_address_picked(tmp_path: Path) -> None:
    async with (
        SipPeer(host="127.0.0.2") as from_a,
        SipPeer(host="127.0.0.3") as from_b,
        SipPeer(host="127.0.0.4") as stranger,
        echo_worker(worker_id="w-named", rtp_timeout_s=30.0, config=_routes_file(tmp_path, 5, 6)) as worker,
    ):
        target = f"sip:+15550199@127.0.0.1:{worker.settings.sip.sip_port}"
        callers = {
            "+15550102": (from_a, DigestClientCredentials(username="carrier-a", password="in-a"), "PCMU"),
            "+15550103": (from_b, DigestClientCredentials(username="carrier-b", password="in-b"), "PCMA"),
            "+15550104": (stranger, None, "PCMU"),  # from no trunk's sources: allowed (the default), not challenged
        }
        calls = {}
        for number, (peer, credentials, codec) in callers.items():
            call = peer.invite(target, from_user=number, credentials=credentials, codecs=(codec,))
            answered = await peer.wait_for(OutboundCallAnswered, call=call.handle, within=10.0)
            assert isinstance(answered, OutboundCallAnswered)
            calls[number] = (peer, call)
        snapshots = [await leg.snapshot() for leg in worker.legs.values()]
        assert sorted((s.from_, s.direction, s.trunk) for s in snapshots) == [
            ("+15550102", "inbound", "a"),
            ("+15550103", "inbound", "b"),
            ("+15550104", "inbound", None),
        ]
        for peer, call in calls.values():
            peer.hang_up(call)
