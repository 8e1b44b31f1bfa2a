"""Real phones and ``gateway run`` over SIP over TLS with SDES SRTP media (RFC 3261 §26, RFC 5630, RFC 4568).

- baresip (its TLS transport, ``mediaenc=srtp-mand``) calls the gateway over TLS (``;transport=tls``: baresip 1.0
  cannot dial ``sips:``) and hears its own speech through the echo agent (correlation >= 0.9); the call record says
  tls and names the SRTP suite, and the transport metrics count the call and no failure.
- pjsua2 (PJSIP's TLS transport) dials ``sips:``, verifies the gateway's self-signed certificate (chain and name) and
  sends its SDES keys only over a TLS hop (secure signalling); the same echo check. With a CA that did not sign it,
  pjsua2 refuses the gateway, and the gateway counts the refused handshake.
- The gateway calls through ``POST /v1/calls`` an auto-answering baresip listening on TLS (``;transport=tls``) and a
  pjsua2 callee at a ``sips:`` target, verifying each against the CA it was given; the media flows both ways.
  Without that CA the call ends at once as tls_failed.
- Plaintext SIP and a stalled handshake on the gateway's TLS port are counted and closed, the worker unharmed.

baresip 1.0 never verifies a server's certificate (tests/support/baresip.py); the verifying client here is pjsua2.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from gateway.transport.self_signed import ensure_self_signed
from tests.e2e.gateway_proc import GatewayProcess, start_gateway
from tests.e2e.ops_support import metric_value, poll
from tests.e2e.test_sip_echo import _echo_heard, _ended_call
from tests.support.audio import align_and_correlate, read_wav
from tests.support.baresip import BaresipPhone
from tests.support.peers import require_binary, require_module
from tests.support.pjsua import PjsuaPhone
from tests.support.procs import ProcessGroup

pytestmark = [pytest.mark.peer, pytest.mark.timeout(150)]
SUITES = ("AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32")
TRANSPORT_FAILURES = ("not_tls", "handshake_failed", "handshake_timeout", "verify_failed", "closed_unframeable")


async def _tls_gateway(procs: ProcessGroup, tmp_path: Path, **env: str) -> GatewayProcess:
    return await start_gateway(
        procs,
        env={
            "GATEWAY_SIP_TRANSPORTS": "udp,tcp,tls",
            "GATEWAY_SIP_TLS_SELF_SIGNED": "true",
            "GATEWAY_STATE_DIR": str(tmp_path / "gateway-state"),
            "GATEWAY_SRTP": "required",
            **env,
        },
    )


def _gateway_cert(gateway: GatewayProcess) -> Path:
    return Path(gateway.env["GATEWAY_STATE_DIR"]) / "sip-tls" / "cert.pem"


async def _metrics(gateway: GatewayProcess) -> str:
    async with gateway.client() as client:
        return (await client.get("/metrics")).text


async def _live_call(gateway: GatewayProcess) -> dict:
    async def live() -> dict | None:
        calls = await gateway.api("GET", "/v1/calls", params={"state": "active"})
        items = calls["items"] if isinstance(calls, dict) else calls
        return items[0] if items else None

    return await poll(live, within=10, what="the live call")


async def test_baresip_over_tls_with_srtp_hears_itself(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    require_binary("baresip", package="baresip baresip-core")
    gateway = await _tls_gateway(peer_procs, tmp_path)
    assert await gateway.process.wait_for_output(r"SELF-SIGNED certificate for localhost, 127\.0\.0\.1", within=5)
    phone = BaresipPhone(
        peer_procs, tmp_path, source_wav=speech_8k, codecs=("pcmu",), tail_silence=1.5, mediaenc="srtp-mand"
    )
    async with phone:
        await phone.dial(gateway.tls_uri)  # baresip 1.0 cannot dial sips: (tests/support/baresip.py); pjsua2 does
        await phone.wait_established(within=15)
        live = await _live_call(gateway)
        await phone.wait_closed(within=40)
    sent = read_wav(speech_8k)
    heard = read_wav(phone.last_recording().decoded)
    correlation, lag = align_and_correlate(sent.samples, heard.samples, 8000, max_slip_seconds=0.25)
    call = await _ended_call(gateway)
    assert correlation >= 0.9, _echo_heard(correlation, lag, call)
    assert live["transport"] == "tls" and live["srtp"] in SUITES, live
    assert call["transport"] == "tls" and call["end_reason"] == "caller_hangup"

    async def exported() -> str | None:  # the counters are exported once a second
        text = await _metrics(gateway)
        return (
            text
            if (metric_value(text, "gateway_sip_transport_messages_total", {"transport": "tls"}) or 0) >= 3
            else None
        )

    text = await poll(exported, within=5, what="INVITE, ACK and BYE counted as TLS messages")
    assert metric_value(text, "gateway_sip_calls_total", {"transport": "tls", "direction": "inbound"}) == 1.0
    assert (metric_value(text, "gateway_sip_transport_messages_total", {"transport": "udp"}) or 0) == 0
    for reason in TRANSPORT_FAILURES:
        assert not metric_value(text, "gateway_sip_transport_errors_total", {"transport": "tls", "reason": reason})


async def test_pjsua_verifies_the_gateway_and_sends_its_keys_only_over_tls(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    require_module("pjsua2", package="pjsua2-python")
    gateway = await _tls_gateway(peer_procs, tmp_path)
    phone = PjsuaPhone(
        peer_procs,
        tmp_path,
        mode="caller",
        uri=gateway.sips_uri,
        play=speech_8k,
        hangup_on_eof=True,
        srtp="mandatory",
        srtp_secure_signaling=1,
        tls=True,
        tls_ca=_gateway_cert(gateway),
        tls_verify_server=True,
    )
    async with phone:
        await phone.wait_state("CONFIRMED", within=15)
        live = await _live_call(gateway)
        await phone.wait_done(within=40)
    assert phone.recording is not None
    heard = read_wav(phone.recording)
    correlation, lag = align_and_correlate(read_wav(speech_8k).samples, heard.samples, 8000, max_slip_seconds=0.25)
    assert correlation >= 0.9, _echo_heard(correlation, lag, await _ended_call(gateway))
    assert live["transport"] == "tls" and live["srtp"] in SUITES, live
    assert "TLS" in phone.pjsip_log.read_text(errors="replace")


async def test_certificates_refused_either_way_with_pjsua_and_mutual_tls(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    require_module("pjsua2", package="pjsua2-python")
    phone_pair = ensure_self_signed(tmp_path / "phone-tls", ("phone.example",))
    gateway = await _tls_gateway(
        peer_procs,
        tmp_path,
        GATEWAY_SRTP="optional",
        GATEWAY_SIP_TLS_CLIENT_CERTS="required",
        GATEWAY_SIP_TLS_CA=str(phone_pair.cert_file),
    )

    def phone(name: str, **tls: object) -> PjsuaPhone:
        return PjsuaPhone(
            peer_procs,
            tmp_path,
            name=name,
            mode="caller",
            uri=gateway.tls_uri,
            play=speech_8k,
            hangup_after=1.0,
            tls=True,
            max_seconds=15,
            **tls,  # type: ignore[arg-type]
        )

    # 1. The phone (with the client certificate the gateway trusts) verifies the gateway against a CA that did not
    # sign the gateway's certificate: it refuses the gateway.
    other_ca = ensure_self_signed(tmp_path / "other-ca", ("ca.example",))
    doubter = phone(
        "doubter",
        tls_cert=phone_pair.cert_file,
        tls_key=phone_pair.key_file,
        tls_ca=other_ca.cert_file,
        tls_verify_server=True,
    )
    async with doubter:
        refused = await doubter.wait_state("DISCONNECTED", within=15)
    assert refused.get("code") == 503 and "certificate" in str(refused.get("reason")).lower(), refused.fields
    # 2. The gateway asks for a client certificate and the phone has none: the gateway refuses it, and counts it.
    async with phone("anonymous") as anonymous:
        refused = await anonymous.wait_state("DISCONNECTED", within=15)
    assert refused.get("code") == 503, refused.fields

    async def counted() -> float | None:
        text = await _metrics(gateway)
        value = metric_value(
            text, "gateway_sip_transport_errors_total", {"transport": "tls", "reason": "verify_failed"}
        )
        return value or None

    assert await poll(counted, within=10, what="the refused client counted") == 1.0
    calls = await gateway.api("GET", "/v1/calls")
    assert not (calls["items"] if isinstance(calls, dict) else calls)  # neither got as far as a call
    # 3. Mutual TLS: the phone presents the certificate the gateway trusts, and verifies the gateway's.
    mutual = phone(
        "mutual",
        tls_cert=phone_pair.cert_file,
        tls_key=phone_pair.key_file,
        tls_ca=_gateway_cert(gateway),
        tls_verify_server=True,
    )
    async with mutual:
        await mutual.wait_state("CONFIRMED", within=15)
        live = await _live_call(gateway)
        await mutual.wait_done(within=20)
    assert live["transport"] == "tls"


async def _outbound_call_heard(gateway: GatewayProcess, to: str, *, established: object, closed: object) -> dict:
    """POST /v1/calls to ``to``; the call must go over TLS with SRTP and end by the callee's hang-up. The ended
    call's record. ``established``/``closed``: awaitables of the callee reaching those states."""
    async with gateway.client() as api:
        response = await api.post("/v1/calls", json={"to": to, "caller_id": "+15550199"})
        assert response.status_code == 201, response.text
        call_id = response.json()["id"]
        await established  # type: ignore[misc]

        async def state(wanted: str) -> dict | None:
            call: dict = (await api.get(f"/v1/calls/{call_id}")).json()
            return call if call["state"] == wanted else None

        active = await poll(lambda: state("active"), within=10, what="the outbound TLS call active")
        assert active["transport"] == "tls" and active["srtp"] in SUITES, active
        await closed  # type: ignore[misc]
        ended = await poll(lambda: state("ended"), within=10, what="the outbound TLS call ended")
    assert ended["end_reason"] == "caller_hangup", ended
    text = await _metrics(gateway)
    assert metric_value(text, "gateway_sip_calls_total", {"transport": "tls", "direction": "outbound"}) == 1.0
    return ended


async def test_the_gateway_calls_baresip_over_tls_and_the_media_flows(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    require_binary("baresip", package="baresip baresip-core")
    callee_pair = ensure_self_signed(tmp_path / "alice-tls", ("127.0.0.1",))
    gateway = await _tls_gateway(peer_procs, tmp_path, GATEWAY_SIP_TLS_CA=str(callee_pair.cert_file))
    alice = BaresipPhone(
        peer_procs,
        tmp_path,
        source_wav=speech_8k,
        name="alice",
        user="alice",
        codecs=("pcmu",),
        auto_answer=True,
        tail_silence=4,
        mediaenc="srtp-mand",
        tls_cert=callee_pair.cert_file,
        tls_key=callee_pair.key_file,
    )
    async with alice:
        ended = await _outbound_call_heard(
            gateway,
            alice.tls_uri,
            established=alice.wait_established(within=10),
            closed=alice.wait_closed(within=40),  # alice hangs up once her WAV (and its tail) ended
        )
    speech = read_wav(speech_8k)
    heard = read_wav(alice.last_recording().decoded)
    correlation, lag = align_and_correlate(speech.samples, heard.samples, speech.rate, max_slip_seconds=0.25)
    assert correlation >= 0.9, _echo_heard(correlation, lag, ended)


async def test_the_gateway_calls_a_sips_target_and_the_media_flows(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    require_module("pjsua2", package="pjsua2-python")
    callee_pair = ensure_self_signed(tmp_path / "bob-tls", ("127.0.0.1",))
    gateway = await _tls_gateway(peer_procs, tmp_path, GATEWAY_SIP_TLS_CA=str(callee_pair.cert_file))
    bob = PjsuaPhone(
        peer_procs,
        tmp_path,
        mode="callee",
        user="bob",
        play=speech_8k,
        hangup_on_eof=True,
        srtp="mandatory",
        srtp_secure_signaling=1,
        tls=True,
        tls_cert=callee_pair.cert_file,
        tls_key=callee_pair.key_file,
    )
    async with bob:
        assert bob.tls_port is not None
        ended = await _outbound_call_heard(
            gateway,
            f"sips:bob@127.0.0.1:{bob.tls_port}",
            established=bob.wait_state("CONFIRMED", within=10),
            closed=bob.wait_done(within=40),
        )
    assert bob.recording is not None
    correlation, lag = align_and_correlate(
        read_wav(speech_8k).samples, read_wav(bob.recording).samples, 8000, max_slip_seconds=0.25
    )
    assert correlation >= 0.9, _echo_heard(correlation, lag, ended)
    assert "sips:gateway@127.0.0.1" in bob.pjsip_log.read_text(errors="replace")  # our Contact in a sips dialog


async def test_a_tls_target_the_gateway_cannot_verify_fails_at_once(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    require_binary("baresip", package="baresip baresip-core")
    callee_pair = ensure_self_signed(tmp_path / "alice-tls", ("127.0.0.1",))
    gateway = await _tls_gateway(peer_procs, tmp_path)  # trusts the system store only
    alice = BaresipPhone(
        peer_procs,
        tmp_path,
        source_wav=speech_8k,
        name="alice",
        user="alice",
        auto_answer=True,
        tail_silence=4,
        tls_cert=callee_pair.cert_file,
        tls_key=callee_pair.key_file,
    )
    async with gateway.client() as api, alice:
        started = time.monotonic()
        response = await api.post("/v1/calls", json={"to": alice.tls_uri})
        assert response.status_code == 201, response.text
        call_id = response.json()["id"]

        async def ended() -> dict | None:
            call: dict = (await api.get(f"/v1/calls/{call_id}")).json()
            return call if call["state"] == "ended" else None

        call = await poll(ended, within=10, what="the unverifiable call ended")
        assert time.monotonic() - started < 5.0
        assert (call["end_reason"], call["transport"]) == ("tls_failed", "tls"), call
        assert not [e for e in alice.events if e.type.startswith("CALL_")]  # alice never saw an INVITE

    async def exported() -> str | None:  # the counters are exported once a second
        text = await _metrics(gateway)
        labels = {"transport": "tls", "reason": "verify_failed"}
        return text if metric_value(text, "gateway_sip_transport_errors_total", labels) == 1.0 else None

    text = await poll(exported, within=5, what="the refused certificate counted")
    assert metric_value(text, "gateway_calls_total", {"end_reason": "tls_failed"}) == 1.0


async def test_plaintext_and_a_stalled_handshake_on_the_tls_port_are_counted_and_closed(
    peer_procs: ProcessGroup, tmp_path: Path
) -> None:
    gateway = await _tls_gateway(peer_procs, tmp_path, GATEWAY_SIP_TLS_HANDSHAKE_TIMEOUT_S="1")
    options = (
        b"OPTIONS sip:agent@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/TCP 127.0.0.1:9;branch=z9hG4bKplain\r\n"
        b"Max-Forwards: 70\r\nFrom: <sip:a@127.0.0.1>;tag=1\r\nTo: <sip:agent@127.0.0.1>\r\n"
        b"Call-ID: plain-1\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n"
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.tls_port)
    writer.write(options)
    assert await asyncio.wait_for(reader.read(), timeout=5) == b""  # closed, no answer in plaintext
    writer.close()
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.tls_port)
    assert await asyncio.wait_for(reader.read(), timeout=5) == b""
    assert 0.8 < time.monotonic() - started < 4.0
    writer.close()

    async def counted() -> str | None:
        text = await _metrics(gateway)
        done = all(
            metric_value(text, "gateway_sip_transport_errors_total", {"transport": "tls", "reason": r}) == 1.0
            for r in ("not_tls", "handshake_timeout")
        )
        return text if done else None

    await poll(counted, within=10, what="both counted")
    # The same OPTIONS on the TCP port is still answered: nothing else was touched.
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.sip_port)
    writer.write(options)
    assert await asyncio.wait_for(reader.readline(), timeout=5) == b"SIP/2.0 200 OK\r\n"
    writer.close()
