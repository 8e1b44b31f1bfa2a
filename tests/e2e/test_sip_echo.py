"""A real SIP phone calls ``gateway run`` and hears itself through the whole media path.

caller (baresip / pjsua2) -> SIP + RTP -> jitter buffer -> batched decode/resample -> CallSession ->
echo provider -> playout -> batched resample/encode -> RTP -> caller's recording, correlated with what it sent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.gateway_proc import GatewayProcess, start_gateway
from tests.e2e.ops_support import metric_value, poll
from tests.support.audio import align_and_correlate, read_wav, with_silence, write_wav
from tests.support.baresip import BaresipPhone
from tests.support.peers import require_binary, require_module
from tests.support.pjsua import PjsuaPhone
from tests.support.procs import ProcessGroup

pytestmark = [pytest.mark.peer, pytest.mark.timeout(120)]


async def _ended_call(gateway: GatewayProcess) -> dict:
    calls = await gateway.api("GET", "/v1/calls", params={"state": "ended"})
    items = calls["items"] if isinstance(calls, dict) else calls
    assert items, "the gateway lists no ended call"
    return await gateway.api("GET", f"/v1/calls/{items[0]['id']}")


_LEG_FIGURES = (
    "rtp_packets_in",
    "rtp_lost",
    "late",
    "jitter_ms",
    "concealed",
    "underruns",
    "discarded",
    "inserted",
    "rtp_packets_out",
    "agent_audio_gaps",
)


def _echo_heard(correlation: float, lag: int, call: dict) -> str:
    """A failed echo check's message: the figure, and what the gateway's side of the call saw, so that a phone's
    own playout trouble can be told from the gateway's."""
    stats = call.get("stats") or {}
    seen = ", ".join(f"{name} {stats.get(name)}" for name in _LEG_FIGURES)
    return f"echo correlation {correlation:.3f} (lag {lag}); the gateway's side of the call: {seen}"


@pytest.mark.parametrize("codec", ["pcmu", "pcma", "opus"])
async def test_baresip_hears_its_own_speech(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path, speech_48k_stereo: Path, codec: str
) -> None:
    require_binary("baresip", package="baresip baresip-core")
    gateway = await start_gateway(peer_procs)
    source = speech_48k_stereo if codec == "opus" else speech_8k
    rate = 48000 if codec == "opus" else 8000
    phone = BaresipPhone(peer_procs, tmp_path, source_wav=source, codecs=(codec,), tail_silence=1.5)
    async with phone:
        await phone.dial(gateway.sip_uri)
        await phone.wait_established(within=15)
        if codec == "pcmu":
            await phone.send_dtmf("123#")
        await phone.wait_closed(within=40)
    sent = read_wav(source)
    heard = read_wav(phone.last_recording().decoded)
    # Each 250 ms window is looked for up to 250 ms from the one before: a phone descheduled for a moment
    # sends late or skips its source and its playout slips by as much, and everything after moves with it.
    correlation, lag = align_and_correlate(sent.samples, heard.samples, rate, max_slip_seconds=0.25)
    call = await _ended_call(gateway)
    assert correlation >= 0.9, _echo_heard(correlation, lag, call)

    assert call["codec"].lower() == codec
    assert call["end_reason"] == "caller_hangup"
    assert call["stats"]["rtp_packets_in"] > 100
    if codec == "pcmu":
        pressed = [line["text"] for line in call["transcript"] if line["role"] == "user" and "pressed" in line["text"]]
        assert [text.split("pressed ")[1][0] for text in pressed] == ["1", "2", "3", "#"]


async def test_baresip_hears_its_own_speech_encoded_a_tick_ahead(
    peer_procs: ProcessGroup, tmp_path: Path, speech_48k_stereo: Path
) -> None:
    """A budget of 0 (GATEWAY_OPUS_ENCODE_AHEAD_MS) moves every Opus call ahead at its first settled pause: here
    the second of silence before the phone speaks. The phone then hears its speech through the packets encoded a
    tick early and sent at the start of the next tick, and it must come back as it went."""
    require_binary("baresip", package="baresip baresip-core")
    gateway = await start_gateway(peer_procs, env={"GATEWAY_OPUS_ENCODE_AHEAD_MS": "0"})
    speech = read_wav(speech_48k_stereo)
    source = write_wav(tmp_path / "pause_then_speech.wav", with_silence(speech, lead=1.5).samples, speech.rate)
    phone = BaresipPhone(peer_procs, tmp_path, source_wav=source, codecs=("opus",), tail_silence=1.5)

    async def calls_ahead() -> float | None:
        async with gateway.client() as client:
            value = metric_value((await client.get("/metrics")).text, "gateway_opus_calls_encoded_ahead")
        return value if value else None

    async with phone:
        await phone.dial(gateway.sip_uri)
        await phone.wait_established(within=15)
        # The exporter publishes once a second; the move itself needs the agent's echo of the silence to settle.
        assert await poll(calls_ahead, within=10, what="the call encoded ahead") == 1
        await phone.wait_closed(within=40)
    heard = read_wav(phone.last_recording().decoded)
    correlation, lag = align_and_correlate(read_wav(source).samples, heard.samples, 48000, max_slip_seconds=0.25)
    assert correlation >= 0.9, _echo_heard(correlation, lag, await _ended_call(gateway))

    async with gateway.client() as client:
        metrics = (await client.get("/metrics")).text
    moved = {to: metric_value(metrics, "gateway_opus_encode_moves_total", {"to": to}) for to in ("ahead", "inline")}
    assert moved["ahead"] == 1 and not moved["inline"], moved  # a budget of 0 never brings a call back
    call = await _ended_call(gateway)
    assert call["codec"].lower() == "opus" and call["end_reason"] == "caller_hangup"


async def test_pjsua_echo_with_rfc4733_dtmf(peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path) -> None:
    require_module("pjsua2", package="pjsua2-python")
    gateway = await start_gateway(peer_procs)
    speech = read_wav(speech_8k)
    spoken_s = len(speech.samples) / speech.rate
    # RFC 4733 events replace audio while a key is down: press the keys after the speech, over silence
    played = write_wav(tmp_path / "speech_then_keys.wav", with_silence(speech, tail=2.5).samples, speech.rate)
    phone = PjsuaPhone(
        peer_procs,
        tmp_path,
        mode="caller",
        uri=gateway.sip_uri,
        play=played,
        dtmf=[(spoken_s + 0.4, "9"), (spoken_s + 0.9, "8"), (spoken_s + 1.4, "*")],
        hangup_on_eof=True,
    )
    async with phone:
        await phone.wait_state("CONFIRMED", within=15)
        await phone.wait_done(within=40)
    heard = read_wav(phone.recording)
    # pjsua2's adaptive jitter buffer (and ours, after an underrun) may move the delay by a few frames
    # mid-call without losing audio; allow that much slip between windows.
    correlation, lag = align_and_correlate(speech.samples, heard.samples, 8000, max_slip_seconds=0.15)
    call = await _ended_call(gateway)
    assert correlation >= 0.9, _echo_heard(correlation, lag, call)
    pressed = [line["text"] for line in call["transcript"] if line["role"] == "user" and "pressed" in line["text"]]
    assert [text.split("pressed ")[1][0] for text in pressed] == ["9", "8", "*"]


async def test_sigint_ends_active_calls_with_bye_and_exits_cleanly(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    import os
    import signal

    require_binary("baresip", package="baresip baresip-core")
    gateway = await start_gateway(peer_procs)
    phone = BaresipPhone(peer_procs, tmp_path, source_wav=speech_8k, codecs=("pcmu",), tail_silence=30)
    async with phone:
        await phone.dial(gateway.sip_uri)
        await phone.wait_established(within=15)
        os.kill(gateway.process.pid, signal.SIGINT)  # Ctrl-C: no drain
        await phone.wait_closed(within=10)  # the gateway hung up: BYE, not a silent disappearance
        assert await gateway.process.wait(within=20) == 0
    assert "SIGINT: ending calls and shutting down" in gateway.process.output


async def test_sigterm_drains_the_live_call_until_the_deadline_then_ends_it_and_exits_0(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    import asyncio
    import os
    import signal

    from tests.e2e.hostile_sip import SipProbe, options_ping

    require_binary("baresip", package="baresip baresip-core")
    deadline_s = 4.0
    gateway = await start_gateway(peer_procs, env={"GATEWAY_DRAIN_DEADLINE_S": str(deadline_s)})
    phone = BaresipPhone(peer_procs, tmp_path, source_wav=speech_8k, codecs=("pcmu",), tail_silence=30)
    probe = SipProbe("127.0.0.1")
    target = ("127.0.0.1", gateway.sip_port)
    try:
        async with phone:
            await phone.dial(gateway.sip_uri)
            established = await phone.wait_established(within=15)
            assert await asyncio.to_thread(options_ping, probe, target, 1, within=3) == 200
            loop = asyncio.get_running_loop()
            os.kill(gateway.process.pid, signal.SIGTERM)
            signalled = loop.time()
            # Draining (once the signal is handled): a balancer's probe hears 503, the plane is not ready, and
            # the call goes on.
            uids = iter(range(2, 1000))

            async def refused() -> bool | None:
                return await asyncio.to_thread(options_ping, probe, target, next(uids), within=3) == 503 or None

            await poll(refused, within=5, what="OPTIONS answered 503")
            async with gateway.client() as client:

                async def not_ready() -> bool:
                    return (await client.get("/readyz")).status_code == 503

                await poll(not_ready, within=5, what="/readyz answering 503")
                [live] = (await client.get("/v1/calls", params={"live": "true"})).json()["items"]
            assert live["state"] == "active"
            closed = await phone.wait_closed(within=deadline_s + 15)
            assert loop.time() - signalled >= deadline_s - 0.5  # the call ran until the deadline
            assert closed.at > established.at
            assert await gateway.process.wait(within=20) == 0
    finally:
        probe.close()
    output = gateway.process.output
    assert "SIGTERM: draining, then shutting down" in output
    assert "drain deadline reached, ending 1 calls with a goodbye" in output
