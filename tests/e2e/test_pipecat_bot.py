"""Bring your own bot: a real Pipecat bot written for Twilio answers a baresip call through the gateway.

baresip (PCMU) -> SIP/RTP -> gateway -> websocket provider -> ws://127.0.0.1 -> Pipecat (FastAPIWebsocketTransport +
TwilioFrameSerializer, auto_hang_up=False, no keys; tests/e2e/pipecat_bot.py). The caller hears the bot's greeting
(correlated with the WAV the bot played); the bot's mark comes back only once its audio was played; a 6 s tone sent
in one message is paced by the gateway and cut by the bot's ``clear`` at once (the recording's tone ends where the
clear came, and the pending mark is answered then); the bot's 1000 close hangs the call up.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.e2e.gateway_proc import start_gateway
from tests.support.audio import align_and_correlate, read_wav, silence, speech_wav, write_wav
from tests.support.baresip import BaresipPhone
from tests.support.fixtures import require_speech_tools
from tests.support.peers import require_binary, require_module
from tests.support.procs import ProcessGroup, free_ports

pytestmark = [pytest.mark.peer, pytest.mark.timeout(150)]

GREETING = "Thank you for calling. You are talking to a bot built with Pipecat."
BOT = Path(__file__).with_name("pipecat_bot.py")
ROOT = Path(__file__).resolve().parents[2]
TONE_HZ = 440.0


def _routes(tmp_path: Path, bot_url: str) -> Path:
    path = tmp_path / "routes.toml"
    path.write_text(
        f"""
[[routes]]
name = "bot"
did = "*"
profile = "pipecat"

[profiles.pipecat]
provider = "websocket"
audio_format = "pcmu"

[profiles.pipecat.bot]
url = "{bot_url}"
parameters = {{ tenant = "test" }}
"""
    )
    return path


def _log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _one(log: list[dict[str, Any]], event: str, **fields: Any) -> dict[str, Any]:
    found = [e for e in log if e["event"] == event and all(e.get(k) == v for k, v in fields.items())]
    assert len(found) == 1, f"expected one {event} {fields} in the bot's log, got {found}"
    return found[0]


def _tone_windows(samples: np.ndarray, rate: int, *, window_s: float = 0.02) -> np.ndarray:
    """Per 20 ms window: the share of its energy at TONE_HZ (Goertzel), 0..1."""
    n = int(rate * window_s)
    count = len(samples) // n
    frames = samples[: count * n].reshape(count, n).astype(np.float64)
    t = np.arange(n) / rate
    ref = np.exp(-2j * np.pi * TONE_HZ * t)
    power = np.abs(frames @ ref) ** 2 * 2 / n
    energy = np.sum(frames**2, axis=1) + 1e-9
    return power / energy


async def test_pipecat_bot_answers_a_sip_call(peer_procs: ProcessGroup, tmp_path: Path) -> None:
    require_binary("baresip", package="baresip baresip-core")
    require_module("pipecat", package="pipecat-ai[websocket]")
    require_speech_tools()
    greeting = speech_wav(GREETING, tmp_path / "greeting.wav", rate=8000)
    (port,) = free_ports(1)
    log_path = tmp_path / "bot.jsonl"
    bot = await peer_procs.start(
        "pipecat-bot",
        [sys.executable, str(BOT), "--port", str(port), "--greeting", str(greeting), "--log", str(log_path)],
        env={"PYTHONPATH": str(ROOT)},
        lifetime=140.0,
    )
    await bot.wait_for_port(port, within=90)  # Pipecat's imports take a while on a busy machine
    gateway = await start_gateway(
        peer_procs, env={"GATEWAY_CONFIG": str(_routes(tmp_path, f"ws://127.0.0.1:{port}/ws"))}
    )
    quiet = write_wav(tmp_path / "quiet.wav", silence(30.0, 8000), 8000)
    phone = BaresipPhone(peer_procs, tmp_path, source_wav=quiet, codecs=("pcmu",), lifetime=120.0)
    async with phone:
        await phone.dial(gateway.sip_uri)
        await phone.wait_established(within=20)
        await phone.send_dtmf("7")
        await phone.wait_closed(within=60)  # the bot ends the call

    log = _log(log_path)
    heard = read_wav(phone.last_recording().decoded)
    spoken = read_wav(greeting)

    # The call context reached the bot the way Twilio's does.
    call = _one(log, "call")
    assert call["body"]["from_number"] == "phone" and call["body"]["to_number"] == "agent"
    assert call["body"]["tenant"] == "test"
    assert _one(log, "dtmf")["digit"] == "7"

    # The caller heard the greeting the bot played.
    correlation, _ = align_and_correlate(spoken.samples, heard.samples, 8000, max_slip_seconds=0.06)
    assert correlation >= 0.9, f"greeting correlation {correlation:.3f}"

    # The greeting's mark came back once its audio had been played, not when it arrived.
    greeting_s = len(spoken.samples) / spoken.rate
    first_media = next(e["t"] for e in log if e["event"] == "sent_media")
    echo = _one(log, "mark_echo", name="greeting-done")["t"]
    assert greeting_s - 0.1 <= echo - first_media <= greeting_s + 1.0, (echo - first_media, greeting_s)

    # The tone: 6 s sent at once, paced by the gateway, cut where the clear came; its mark answered at the clear.
    tone_sent = _one(log, "tone")["t"]
    cleared = _one(log, "sent_clear")["t"]
    tone_echo = _one(log, "mark_echo", name="tone-done")["t"]
    assert 0.0 <= tone_echo - cleared <= 0.25, "the pending mark is answered when the clear empties the playout"
    assert tone_echo - tone_sent >= 1.4, "... and not when its audio arrived"
    share = _tone_windows(heard.mono(), heard.rate)
    tone_windows = np.flatnonzero(share > 0.9)
    assert tone_windows.size, "the caller heard no tone"
    heard_s = (tone_windows[-1] - tone_windows[0] + 1) * 0.02
    expected_s = cleared - tone_sent
    print(
        f"greeting correlation {correlation:.4f}; mark after {echo - first_media:.3f} s of a {greeting_s:.3f} s "
        f"greeting; tone heard {heard_s:.3f} s, clear after {expected_s:.3f} s; tone mark answered "
        f"{tone_echo - cleared:.3f} s after the clear"
    )
    assert abs(heard_s - expected_s) <= 0.1, f"tone heard {heard_s:.3f} s, clear came after {expected_s:.3f} s"
    assert tone_windows.size * 0.02 >= heard_s - 0.06, "the tone played without gaps until the cut"

    snapshot = await gateway.api("GET", "/v1/calls", params={"state": "ended"})
    items = snapshot["items"] if isinstance(snapshot, dict) else snapshot
    ended = await gateway.api("GET", f"/v1/calls/{items[0]['id']}")
    assert ended["provider"] == "websocket"
    assert ended["end_reason"] == "agent_hang_up", ended["end_reason"]
    assert ended["stats"].get("barge_ins") == 1, ended["stats"]
