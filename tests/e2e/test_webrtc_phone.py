"""Headless Chromium opens /phone of a real ``gateway run``, calls the public route and hears the echo agent.

Chromium's fake microphone plays espeak-ng speech (or, for the negative control, silence); the page measures
the agent's audio with a WebAudio AnalyserNode (``window.phone.recentLevel``). The call must appear in
/v1/calls with kind "webrtc", carry keypad DTMF to the agent, and end when the page hangs up.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.e2e.gateway_proc import GatewayProcess, start_gateway
from tests.support.audio import speech_wav, write_wav
from tests.support.chromium import launch_chromium
from tests.support.fixtures import SPEECH, require_speech_tools
from tests.support.peers import require_binary, require_module
from tests.support.procs import ProcessGroup

pytestmark = [pytest.mark.peer, pytest.mark.timeout(180)]

CONFIG = """
[[routes]]
name = "browser"
did = "web"
profile = "echo"
webrtc_public = true

[[routes]]
name = "private"
did = "*"
profile = "echo"

[profiles.echo]
provider = "echo"
"""


@pytest.fixture(autouse=True)
def _peers() -> None:
    require_binary("chromium", package="chromium chromium-driver")
    require_module("playwright")


async def _gateway(procs: ProcessGroup, tmp_path: Path) -> GatewayProcess:
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG)
    return await start_gateway(procs, env={"GATEWAY_CONFIG": str(config)})


async def _call_state(gateway: GatewayProcess, call_id: str, state: str, *, within: float) -> dict[str, Any]:
    """The call as /v1/calls/{id} shows it, once it has reached `state` (checked every 100 ms)."""
    async with asyncio.timeout(within):
        while True:
            call: dict[str, Any] = await gateway.api("GET", f"/v1/calls/{call_id}")
            if call["state"] == state:
                return call
            await asyncio.sleep(0.1)


async def _page_condition(page: Any, expression: str, *, within: float) -> None:
    """Wait until `expression` is truthy in the page. (The page's CSP forbids eval, which Playwright's
    wait_for_function needs; page.evaluate runs outside the page's policy.)"""
    async with asyncio.timeout(within):
        while True:
            if await page.evaluate(expression):
                return
            await asyncio.sleep(0.1)


async def _start_call(page: Any, gateway: GatewayProcess, *, screenshot: Path | None = None) -> str:
    await page.goto(gateway.http + "/phone")
    assert await page.evaluate("window.phone.state") == "idle"
    if screenshot is not None:
        await page.screenshot(path=str(screenshot))
    await page.click("#call")
    await _page_condition(page, "['connected', 'error', 'ended'].includes(window.phone.state)", within=20)
    state, error = await page.evaluate("[window.phone.state, window.phone.error]")
    assert state == "connected", f"the page did not connect: {state} {error}"
    return str(await page.evaluate("window.phone.callId"))


def _screenshot_path(tmp_path: Path, name: str) -> Path:
    folder = Path(os.environ.get("GATEWAY_TEST_SCREENSHOTS", tmp_path))
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


async def test_browser_phone_hears_the_echo_agent(peer_procs: ProcessGroup, tmp_path: Path) -> None:
    require_speech_tools()
    mic = speech_wav(SPEECH, tmp_path / "speech_48k.wav", rate=48000, channels=1)
    gateway = await _gateway(peer_procs, tmp_path)
    async with launch_chromium(tmp_path / "speech", fake_audio_wav=mic) as browser:
        page = await browser.new_page()
        call_id = await _start_call(page, gateway, screenshot=_screenshot_path(tmp_path, "phone-idle.png"))
        assert call_id.startswith("w-")

        # The agent echoes the caller's speech: the page's analyser hears it clearly above silence.
        heard = "window.phone.recentLevel(3000).samples >= 40 && window.phone.recentLevel(1500).max > -40"
        await _page_condition(page, heard, within=15)
        level = await page.evaluate("window.phone.recentLevel(3000)")
        assert level["max"] > -40 and level["samples"] >= 40, level

        listed = await gateway.api("GET", "/v1/calls", params={"state": "active"})
        [call] = [c for c in listed["items"] if c["id"] == call_id]
        assert (call["kind"], call["route"], call["codec"], call["provider"]) == ("webrtc", "browser", "opus", "echo")

        await page.click('.keypad button[data-digit="5"]')
        await page.click('.keypad button[data-digit="#"]')
        async with asyncio.timeout(10):
            while True:
                call = await gateway.api("GET", f"/v1/calls/{call_id}")
                if sum("pressed" in line["text"] for line in call["transcript"] if line["role"] == "user") >= 2:
                    break
                await asyncio.sleep(0.1)
        pressed = [line["text"] for line in call["transcript"] if line["role"] == "user" and "pressed" in line["text"]]
        assert [text.split("pressed ")[1][0] for text in pressed] == ["5", "#"]
        assert call["stats"]["rtp_packets_in"] > 100 and call["stats"]["rtp_packets_out"] > 100

        await page.screenshot(path=str(_screenshot_path(tmp_path, "phone-in-call.png")))
        await page.click("#hangup")
        await _page_condition(page, "window.phone.state === 'ended'", within=5)
        ended = await _call_state(gateway, call_id, "ended", within=10)
        assert ended["end_reason"] == "caller_hangup"
        assert ended["kind"] == "webrtc"
        await page.screenshot(path=str(_screenshot_path(tmp_path, "phone-ended.png")))


async def test_silent_microphone_measures_silence(peer_procs: ProcessGroup, tmp_path: Path) -> None:
    """Negative control: the echo of a silent microphone is silence on the page's meter."""
    mic = write_wav(tmp_path / "silence_48k.wav", np.zeros(48000 * 5, dtype=np.int16), 48000)
    gateway = await _gateway(peer_procs, tmp_path)
    async with launch_chromium(tmp_path / "silence", fake_audio_wav=mic) as browser:
        page = await browser.new_page()
        call_id = await _start_call(page, gateway)
        # Media is flowing both ways (the server counts packets), and what comes back is silent.
        async with asyncio.timeout(15):
            while True:
                call = await gateway.api("GET", f"/v1/calls/{call_id}")
                if call["stats"]["rtp_packets_in"] > 150 and call["stats"]["rtp_packets_out"] > 150:
                    break
                await asyncio.sleep(0.2)
        level = await page.evaluate("window.phone.recentLevel(2500)")
        assert level["samples"] >= 20 and level["max"] < -70, level
        assert call["kind"] == "webrtc"
        await page.click("#hangup")
        ended = await _call_state(gateway, call_id, "ended", within=10)
        assert ended["end_reason"] == "caller_hangup"
