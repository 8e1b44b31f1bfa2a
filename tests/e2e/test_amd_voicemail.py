"""``amd = detect_and_leave_message`` on a real outbound call: ``POST /v1/calls`` to a pjsua2 phone that answers
and plays a voicemail greeting (espeak-ng) and a beep, and records what it receives. The gateway waits for the
beep to end and the agent leaves the message: on the phone's own recording the message starts after the beep
ended and nothing of the agent overlaps the greeting; the call ends ``voicemail_left`` and says machine."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.e2e.ops_support import poll
from tests.e2e.provider_harness import start_fake_provider, start_gateway_on_fake
from tests.support.audio import read_wav, rms_dbfs, speech_wav, to_mono, tone, write_wav
from tests.support.peers import require_binary, require_module
from tests.support.pjsua import PjsuaPhone
from tests.support.procs import ProcessGroup

pytestmark = [pytest.mark.peer, pytest.mark.timeout(120)]

RATE = 8000
GREETING = "Hi, you have reached Alex. I can't take your call right now. Please leave a message after the tone."
MESSAGE = "This is the clinic: your appointment is tomorrow at nine."
BEEP_HZ, BEEP_S, PAUSE_S = 1000.0, 0.5, 0.4
REPLY_MS = 1500  # the fake provider's reply: a 440 Hz tone this long stands for the spoken message
WINDOW = RATE // 50


def _voicemail_wav(directory: Path) -> tuple[Path, float, float]:
    """The machine's side: greeting, a pause, the beep, then silence; (wav, beep start s, beep end s)."""
    speech = read_wav(speech_wav(GREETING, directory / "greeting-speech.wav", RATE)).samples[:, 0]
    pause = np.zeros(int(PAUSE_S * RATE), dtype=np.int16)
    beep = tone(BEEP_HZ, BEEP_S, RATE, amplitude=0.3)
    tail = np.zeros(12 * RATE, dtype=np.int16)
    beep_at = (speech.size + pause.size) / RATE
    path = write_wav(directory / "voicemail.wav", np.concatenate([speech, pause, beep.reshape(-1), tail]), RATE)
    return path, beep_at, beep_at + BEEP_S


def _loud_windows(path: Path, *, dbfs: float = -40.0) -> list[float]:
    """Start times (s) of the 20 ms windows of a recording louder than ``dbfs``."""
    samples = to_mono(read_wav(path).samples)
    return [i / RATE for i in range(0, samples.size - WINDOW + 1, WINDOW) if rms_dbfs(samples[i : i + WINDOW]) > dbfs]


async def _ended(api: Any, call_id: str) -> dict[str, Any] | None:
    call: dict[str, Any] = (await api.get(f"/v1/calls/{call_id}")).json()
    return call if call.get("state") == "ended" else None


async def test_the_message_is_left_after_the_beep(peer_procs: ProcessGroup, tmp_path: Path) -> None:
    require_binary("espeak-ng", package="espeak-ng")
    require_binary("sox", package="sox")
    require_module("pjsua2", package="pjsua2-python")
    wav, beep_at, beep_end = _voicemail_wav(tmp_path)
    fake = await start_fake_provider(peer_procs, "--mode", "tone", "--reply-ms", str(REPLY_MS))
    gateway = await start_gateway_on_fake(peer_procs, tmp_path, fake)
    phone = PjsuaPhone(peer_procs, tmp_path, mode="callee", name="voicemail", user="vm", play=wav, max_seconds=40)
    async with gateway.client() as api, phone:
        body = {"to": phone.sip_uri, "caller_id": "+15550199", "amd": "detect_and_leave_message"}
        response = await api.post("/v1/calls", json={**body, "voicemail_message": MESSAGE})
        assert response.status_code == 201, response.text
        call_id: str = response.json()["id"]
        await phone.wait_state("CONFIRMED", within=15)
        await phone.wait_state("DISCONNECTED", within=beep_end + 15)
        assert await phone.wait_done(within=15) == 0
        ended = await poll(lambda: _ended(api, call_id), within=10, what="the voicemail call ended")

    assert ended["end_reason"] == "voicemail_left", ended
    amd = ended["amd"]
    assert amd["result"] == "machine" and amd["at_s"] < beep_end, amd
    # The gateway's clock starts at its first callee frame, the phone's at its media start: a few frames apart.
    assert amd["beep_at_s"] == pytest.approx(beep_at, abs=0.15), (amd, beep_at)

    (conn,) = [s["id"] for s in await fake.wait_for(lambda s: len(s) >= 1, within=5, what="the connection")]
    creates = [
        (e.get("response") or {}).get("instructions", "")
        for e in (await fake.record(conn))["event_list"]
        if e["type"] == "response.create"
    ]
    assert creates == [f"Say exactly this, then stop: {MESSAGE}"], creates
    # After the beep the callee's frames flow again (the silence after it); the greeting and the beep never did.
    heard = np.frombuffer(await fake.audio(conn), dtype="<i2")
    assert heard.size == 0 or rms_dbfs(heard) < -50, "the machine's greeting never reached the provider"

    # What the phone received: silence through the greeting and the beep, then the whole message.
    assert phone.recording is not None
    loud = _loud_windows(phone.recording)
    assert loud, "the phone heard no message"
    message_start, message_end = loud[0], loud[-1] + WINDOW / RATE
    assert message_start >= beep_end, (
        f"the message began at {message_start:.2f} s, before the beep ended {beep_end:.2f}"
    )
    assert message_start <= beep_end + 1.5, f"the message began {message_start - beep_end:.2f} s after the beep"
    assert message_end - message_start == pytest.approx(REPLY_MS / 1000, abs=0.25), "the whole message, once"


def _local_pipeline_config(path: Path) -> Path:
    lines = [
        "[[routes]]",
        'name = "all"',
        'did = "*"',
        'profile = "local"',
        "",
        "[profiles.local]",
        'provider = "pipeline"',
        'instructions = "You are the local test agent."',
        "",
        "[profiles.local.pipeline]",
        'stt = { name = "whisper" }',
        'llm = { name = "rules" }',
        'tts = { name = "espeak" }',
        'vad = { name = "silero" }',
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


# Whisper loads when the gateway starts: on a busy machine a load on the first call outlasts the words' hold.
PRELOAD = {"GATEWAY_PIPELINE_WHISPER_PRELOAD": "1"}


def _short_machine_wav(directory: Path) -> Path:
    """A greeting as short as a person's: 0.5 s of silence, "Please leave a message.", then silence."""
    speech = read_wav(speech_wav("Please leave a message.", directory / "short.wav", RATE)).samples[:, 0]
    return write_wav(
        directory / "short-machine.wav",
        np.concatenate([np.zeros(RATE // 2, dtype=np.int16), speech, np.zeros(15 * RATE, dtype=np.int16)]),
        RATE,
    )


async def _words_hang_up_on(procs: ProcessGroup, tmp_path: Path, gateway: Any, wav: Path) -> None:
    """Once Whisper has loaded (not on the call's clock), an AMD call to a phone playing ``wav``: hung up
    ``machine_detected`` on the greeting's words."""
    await gateway.process.wait_for_output("whisper loaded", within=60)
    phone = PjsuaPhone(procs, tmp_path, mode="callee", name="short", user="short", play=wav, max_seconds=40)
    async with gateway.client() as api, phone:
        body = {"to": phone.sip_uri, "caller_id": "+15550199", "amd": "detect"}
        response = await api.post("/v1/calls", json=body)
        assert response.status_code == 201, response.text
        call_id: str = response.json()["id"]
        await phone.wait_state("CONFIRMED", within=20)
        await phone.wait_state("DISCONNECTED", within=20)
        ended = await poll(lambda: _ended(api, call_id), within=10, what="the short machine call ended")
    assert ended["end_reason"] == "machine_detected", ended
    assert (ended["amd"]["result"], ended["amd"]["reason"]) == ("machine", "words_machine"), ended


async def test_the_local_whisper_words_catch_a_short_machine_greeting(peer_procs: ProcessGroup, tmp_path: Path) -> None:
    """A greeting as short as a person's ("Please leave a message.", then silence): the timing rules alone say human;
    the local pipeline's side recogniser hears the phrase and the gateway hangs up ``machine_detected``."""
    from tests.e2e.gateway_proc import start_gateway
    from tests.gateway.providers.pipeline.local.conftest import require_local_extra

    require_local_extra()
    require_binary("espeak-ng", package="espeak-ng")
    require_binary("sox", package="sox")
    require_module("pjsua2", package="pjsua2-python")
    wav = _short_machine_wav(tmp_path)
    config = _local_pipeline_config(tmp_path / "gateway.toml")
    env = {"GATEWAY_CONFIG": str(config), "HF_HUB_OFFLINE": "1", **PRELOAD}
    gateway = await start_gateway(peer_procs, env=env)
    await _words_hang_up_on(peer_procs, tmp_path, gateway, wav)


async def test_a_realtime_profiles_amd_stt_catches_a_short_machine_greeting(
    peer_procs: ProcessGroup, tmp_path: Path
) -> None:
    """The same short greeting on an ``openai`` profile (the fake Realtime provider) whose ``amd_stt`` names the
    local Whisper: the side recogniser's words hang up ``machine_detected`` where the timing rules say human, and
    the provider never heard the greeting nor was asked to speak."""
    from tests.gateway.providers.pipeline.local.conftest import require_local_extra

    require_local_extra()
    require_binary("espeak-ng", package="espeak-ng")
    require_binary("sox", package="sox")
    require_module("pjsua2", package="pjsua2-python")
    wav = _short_machine_wav(tmp_path)
    fake = await start_fake_provider(peer_procs, "--mode", "tone")
    gateway = await start_gateway_on_fake(
        peer_procs,
        tmp_path,
        fake,
        profile_lines=('amd_stt = { name = "whisper" }',),
        env={"HF_HUB_OFFLINE": "1", **PRELOAD},
    )
    await _words_hang_up_on(peer_procs, tmp_path, gateway, wav)
    words = r"AMD machine \(words_machine\) at [0-9.]+ s; words heard: '[^']*message"
    assert await gateway.process.wait_for_output(re.compile(words, re.IGNORECASE), within=5)

    (conn,) = [s["id"] for s in await fake.wait_for(lambda s: len(s) >= 1, within=5, what="the connection")]
    record = await fake.record(conn)
    assert [e for e in record["event_list"] if e["type"] == "response.create"] == [], "the agent never spoke"
    heard = np.frombuffer(await fake.audio(conn), dtype="<i2")
    assert heard.size == 0 or rms_dbfs(heard) < -50, "the machine's greeting never reached the provider"
