"""A peer transfers a call to the gateway's agent elsewhere (incoming REFER), with real phones (pjsua2).

- Accepted: the route says ``refer = "accept"`` for the second phone's address. The caller's phone (pjsua2's
  ``Call.xfer``) sends REFER; the gateway answers 202 and NOTIFYs "100 Trying", calls the second phone, and once it
  answers NOTIFYs "200 OK" (pjsua2's transfer status callback sees 100, then the final 200) and the caller hangs
  up. The second phone hears the agent (the echo agent returns its own speech: correlated), the call keeps its id,
  the record lists the referral, and the event stream has ``call.refer_received`` then ``call.referred``.
- Refused: a target outside ``refer_allow`` gets 603 (pjsua2's final status); the call goes on with the agent.
- baresip as the referrer (its ``transfer`` command): the second phone hears the agent and baresip's call ends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.gateway_proc import GatewayProcess, start_gateway
from tests.e2e.ops_support import EventStream, poll
from tests.support.audio import Wav, align_and_correlate, read_wav, silence, with_silence, write_wav
from tests.support.baresip import BaresipPhone
from tests.support.peers import require_binary, require_module
from tests.support.pjsua import PjsuaPhone
from tests.support.procs import ProcessGroup

pytestmark = [pytest.mark.peer, pytest.mark.timeout(120)]


async def _gateway(procs: ProcessGroup, tmp_path: Path, allow: str) -> GatewayProcess:
    config = tmp_path / "gateway.toml"
    config.write_text(
        "\n".join(
            [
                "[[routes]]",
                'name = "all"',
                'did = "*"',
                'profile = "echo"',
                'refer = "accept"',
                f"refer_allow = [{allow!r}]",
                "",
                "[profiles.echo]",
                'provider = "default"',
                'greeting = ""',
            ]
        )
        + "\n"
    )
    return await start_gateway(procs, env={"GATEWAY_CONFIG": str(config)})


async def _ended(gateway: GatewayProcess) -> dict[str, Any]:
    async def one() -> dict[str, Any] | None:
        calls = await gateway.api("GET", "/v1/calls", params={"state": "ended"})
        items = calls["items"] if isinstance(calls, dict) else calls
        if not items:
            return None
        call: dict[str, Any] = await gateway.api("GET", f"/v1/calls/{items[0]['id']}")
        return call

    return await poll(one, within=15, what="the ended call")


def _statuses(phone: PjsuaPhone) -> list[tuple[int, str, bool]]:
    return [(e.get("code"), e.get("reason"), e.get("final")) for e in phone.events if e.name == "xfer_status"]


def _refer_data(event: Any) -> dict[str, Any]:
    inner = event.data.get("data")
    return inner if isinstance(inner, dict) else {}


def _target_phone(procs: ProcessGroup, tmp_path: Path, speech_8k: Path) -> tuple[Wav, PjsuaPhone]:
    """The transfer target: a pjsua2 callee that answers with the speech (after 0.5 s) and hangs up at its end."""
    require_module("pjsua2", package="pjsua2-python")
    speech = read_wav(speech_8k)
    played = write_wav(tmp_path / "target_speech.wav", with_silence(speech, lead=0.5, tail=1.5).samples, speech.rate)
    target = PjsuaPhone(procs, tmp_path, mode="callee", name="target", user="human", play=played, hangup_on_eof=True)
    return speech, target


async def test_an_accepted_refer_takes_the_agent_to_the_second_phone(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    speech, target = _target_phone(peer_procs, tmp_path, speech_8k)
    gateway = await _gateway(peer_procs, tmp_path, f"sip:*@127.0.0.1:{target.sip_port}")
    caller = PjsuaPhone(
        peer_procs,
        tmp_path,
        mode="caller",
        name="caller",
        uri=gateway.sip_uri,
        xfer_to=target.sip_uri,
        xfer_at=1.0,
        record=False,
        max_seconds=20,
    )
    async with EventStream(gateway.http, gateway.token, last_event_id=0, name="sse") as stream, target, caller:
        await caller.wait_state("CONFIRMED", within=15)
        await target.wait_event("incoming_call", within=15)
        final = await caller.wait_event("xfer_status", within=15, where=lambda e: bool(e.get("final")))
        assert final.get("code") == 200, caller.events
        assert await caller.wait_done(within=15) == 0
        referred = await stream.wait_for(lambda e: e.type == "call.referred", within=15)
        assert await target.wait_done(within=40) == 0
        received = await stream.wait_for(lambda e: e.type == "call.refer_received", within=5)

    codes = _statuses(caller)
    # pjsua2 reports our 202 as (100, "Accepted"), then each NOTIFY's sipfrag: 100 Trying, the final 200 OK.
    assert codes == [(100, "Accepted", False), (100, "Trying", False), (200, "OK", True)], codes
    assert _refer_data(received)["outcome"] == "accepted" and _refer_data(referred)["target"] == target.sip_uri
    # The target's INVITE named who referred it (RFC 3892).
    invite_log = target.pjsip_log.read_text(errors="replace")
    assert "Referred-By:" in invite_log, invite_log[-2000:]
    # The agent now talks to the second phone: the echo agent returned its speech to it.
    heard = read_wav(target.recording)  # type: ignore[arg-type]
    correlation, lag = align_and_correlate(speech.samples, heard.samples, 8000, max_slip_seconds=0.15)
    assert correlation >= 0.85, (correlation, lag)
    call = await _ended(gateway)
    assert _refer_data(referred)["call_id"] == call["id"]
    assert [(r["outcome"], r["status"]) for r in call["referrals"]] == [("referred", 200)]
    assert call["end_reason"] == "caller_hangup", call["end_reason"]  # the second phone hung up
    async with gateway.client() as client:
        metrics = (await client.get("/metrics")).text
    assert 'gateway_sip_refers_total{outcome="referred"' in metrics
    print(f"refer: the referrer saw {codes}; the target heard the agent at correlation {correlation:.3f}")


async def test_a_refer_outside_the_policy_gets_603_and_the_call_goes_on(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    require_module("pjsua2", package="pjsua2-python")
    speech = read_wav(speech_8k)
    played = write_wav(tmp_path / "caller_speech.wav", with_silence(speech, lead=1.0, tail=1.5).samples, speech.rate)
    gateway = await _gateway(peer_procs, tmp_path, "sip:*@pbx.example.com")
    caller = PjsuaPhone(
        peer_procs,
        tmp_path,
        mode="caller",
        uri=gateway.sip_uri,
        play=played,
        hangup_on_eof=True,
        xfer_to="sip:human@127.0.0.1:9",
        xfer_at=0.3,
    )
    async with caller:
        await caller.wait_state("CONFIRMED", within=15)
        refused = await caller.wait_event("xfer_status", within=10, where=lambda e: bool(e.get("final")))
        assert refused.get("code") == 603, caller.events
        assert await caller.wait_done(within=40) == 0
    heard = read_wav(caller.recording)  # type: ignore[arg-type]
    correlation, lag = align_and_correlate(speech.samples, heard.samples, 8000, max_slip_seconds=0.15)
    assert correlation >= 0.85, (correlation, lag)  # the agent stayed with the caller
    print(f"refer refused: 603; the caller heard the agent on at correlation {correlation:.3f}")
    call = await _ended(gateway)
    assert [(r["outcome"], r["status"]) for r in call["referrals"]] == [("declined", 603)]
    assert call["end_reason"] == "caller_hangup"


async def test_baresip_transfers_the_agent_to_a_pjsua2_phone(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    require_binary("baresip", package="baresip baresip-core")
    speech, target = _target_phone(peer_procs, tmp_path, speech_8k)
    gateway = await _gateway(peer_procs, tmp_path, f"sip:*@127.0.0.1:{target.sip_port}")
    quiet = write_wav(tmp_path / "quiet.wav", silence(20.0, 8000), 8000)
    referrer = BaresipPhone(peer_procs, tmp_path, source_wav=quiet, codecs=("pcmu",))
    async with EventStream(gateway.http, gateway.token, last_event_id=0, name="sse") as stream, target, referrer:
        await referrer.dial(gateway.sip_uri)
        await referrer.wait_established(within=15)
        await referrer.command("transfer", target.sip_uri)
        await target.wait_event("incoming_call", within=15)
        referred = await stream.wait_for(lambda e: e.type == "call.referred", within=15)
        await referrer.wait_closed(within=10)  # its own BYE after our 200 NOTIFY, or ours after the grace
        assert await target.wait_done(within=40) == 0
    heard = read_wav(target.recording)  # type: ignore[arg-type]
    correlation, lag = align_and_correlate(speech.samples, heard.samples, 8000, max_slip_seconds=0.15)
    assert correlation >= 0.85, (correlation, lag)
    call = await _ended(gateway)
    assert _refer_data(referred)["call_id"] == call["id"]
    assert [(r["outcome"], r["status"]) for r in call["referrals"]] == [("referred", 200)]
    print(f"refer by baresip: the target heard the agent at correlation {correlation:.3f}")
