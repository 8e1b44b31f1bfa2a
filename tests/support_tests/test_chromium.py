"""Headless system Chromium: fake microphone from a WAV reaches WebAudio; names do not resolve."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import psutil
import pytest

from tests.support.audio import speech_wav, write_wav
from tests.support.chromium import CHROMIUM, LoopbackHttpServer, launch_chromium
from tests.support.fixtures import SPEECH, require_speech_tools
from tests.support.peers import require_binary, require_module

pytestmark = [pytest.mark.peer, pytest.mark.timeout(90)]

LEVEL_PAGE = """<!doctype html>
<html><body><script>
window.levels = [];
(async () => {
  const stream = await navigator.mediaDevices.getUserMedia({audio: true});
  const context = new AudioContext();
  const analyser = context.createAnalyser();
  analyser.fftSize = 2048;
  context.createMediaStreamSource(stream).connect(analyser);
  const buffer = new Float32Array(analyser.fftSize);
  setInterval(() => {
    analyser.getFloatTimeDomainData(buffer);
    let sum = 0;
    for (const v of buffer) sum += v * v;
    window.levels.push(Math.sqrt(sum / buffer.length));
  }, 50);
})().catch(error => { window.failure = String(error); });
</script></body></html>"""


@pytest.fixture(autouse=True)
def _chromium() -> None:
    require_binary("chromium", package="chromium chromium-driver")
    require_module("playwright")
    assert Path(CHROMIUM).exists()


async def _max_level(tmp_path: Path, wav: Path) -> float:
    async with LoopbackHttpServer({"/": LEVEL_PAGE}) as http, launch_chromium(tmp_path, fake_audio_wav=wav) as browser:
        assert "--use-file-for-fake-audio-capture=" + str(wav) in browser.command_line
        page = await browser.new_page()
        await page.goto(http.url + "/")
        await page.wait_for_function("window.failure !== undefined || window.levels.length >= 40", timeout=20_000)
        failure = await page.evaluate("window.failure")
        assert failure is None, f"getUserMedia failed: {failure}; console: {browser.console}"
        levels = await page.evaluate("window.levels")
        assert http.requests and http.requests[0].startswith("GET / ")
        return float(max(levels))


async def test_fake_microphone_speech_is_heard_by_an_analyser(tmp_path: Path) -> None:
    require_speech_tools()
    wav = speech_wav(SPEECH, tmp_path / "mic.wav", rate=48000, channels=1)
    level = await _max_level(tmp_path, wav)
    print(f"speech level {level:.4f}")
    assert level > 0.02


async def test_fake_microphone_silence_stays_silent(tmp_path: Path) -> None:
    wav = write_wav(tmp_path / "quiet.wav", np.zeros(48000, dtype=np.int16), 48000)
    level = await _max_level(tmp_path, wav)
    print(f"silence level {level:.5f}")
    assert level < 0.002


async def test_only_loopback_resolves_and_mdns_hiding_is_disabled(tmp_path: Path) -> None:
    async with launch_chromium(tmp_path) as browser:
        disable = [a for a in browser.command_line if a.startswith("--disable-features=")]
        assert "WebRtcHideLocalIpsWithMdns" in disable[-1].split(",")
        page = await browser.new_page()
        with pytest.raises(Exception, match="ERR_NAME_NOT_RESOLVED"):
            await page.goto("http://example.com/", timeout=10_000)
        assert any(a.startswith("--headless") for a in browser.command_line)
        pids = browser.pids
    assert not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
