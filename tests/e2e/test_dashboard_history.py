"""The dashboard's call view and history of a real ``gateway run`` in headless Chromium, with a real baresip
call to the echo agent.

While the call is up, its view's controls act on it: "Say" makes the agent respond with the text (the echo agent
writes a response's instructions to the transcript), "Inject" adds a user message the echo agent answers ("DTMF 5"
reads as a key press: "You pressed 5"), a handoff to a profile the routes file lacks shows the API's refusal,
and one to a profile it has is done and shows on the timeline.
After the phone hangs up, the history page finds the call by its number and its view shows the transcript and
timeline from the database of calls, and plays the call's recording (the route records both sides) from
``GET /v1/calls/{id}/recording``, authorised by the session's media cookie: its duration is the record's, its
playhead advances, and clicking a transcript item seeks to it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.gateway_proc import GatewayProcess, start_gateway
from tests.e2e.ops_support import poll
from tests.support.baresip import BaresipPhone
from tests.support.chromium import launch_chromium
from tests.support.peers import require_binary, require_module
from tests.support.procs import ProcessGroup

pytestmark = [pytest.mark.peer, pytest.mark.timeout(120)]

USER = "histcaller"
SAID = "Hello from the dashboard"
CONFIG = """
[[routes]]
name = "recorded"
did = "*"
profile = "echo"
record = "both"

[profiles.echo]
provider = "default"

[profiles.billing]
provider = "default"
instructions = "You handle invoices."
"""


@pytest.fixture(autouse=True)
def _peers() -> None:
    require_binary("baresip", package="baresip baresip-core")
    require_binary("chromium", package="chromium chromium-driver")
    require_module("playwright")


async def _until(page: Any, predicate: str, *, within: float = 10.0) -> None:
    """Wait for a JS predicate (a function of no arguments); page.wait_for_function would eval a string, which
    the dashboard's CSP forbids."""
    await poll(lambda: page.evaluate(predicate), within=within, what=predicate, every=0.05)


async def _recorded(gateway: GatewayProcess, call_id: str) -> dict[str, Any] | None:
    record: dict[str, Any] = await gateway.api("GET", f"/v1/calls/{call_id}")
    recording = record.get("recording")
    return record if record["state"] == "ended" and recording and recording["bytes"] else None


async def _said(gateway: GatewayProcess, call_id: str, text: str) -> dict[str, Any] | None:
    call: dict[str, Any] = await gateway.api("GET", f"/v1/calls/{call_id}")
    lines = [line for line in call["transcript"] if text in line["text"]]
    return lines[0] if lines else None


async def test_call_view_controls_a_live_call_and_history_finds_it(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    from playwright.async_api import expect

    config = tmp_path / "routes.toml"
    config.write_text(CONFIG)
    gateway = await start_gateway(peer_procs, env={"GATEWAY_CONFIG": str(config)})
    phone = BaresipPhone(peer_procs, tmp_path, source_wav=speech_8k, user=USER, tail_silence=30, codecs=("pcmu",))
    shots = tmp_path / "screenshots"
    shots.mkdir()
    async with phone, launch_chromium(tmp_path) as browser:
        page = await browser.new_page()
        await page.goto(gateway.http + "/dashboard")
        await page.fill("#token", gateway.token)
        await page.click("#login-form button[type=submit]")
        await expect(page.locator("#conn")).to_have_text("live", timeout=10_000)

        await phone.dial(gateway.sip_uri)
        await phone.wait_established(within=10)
        row = page.locator("#calls-body tr[data-state=active]")
        await expect(row).to_have_count(1, timeout=10_000)
        call_id = await row.get_attribute("data-call-id")
        assert call_id
        await row.locator("a").click()
        await expect(page.locator("#call-state")).to_have_text("active", timeout=10_000)

        # Say: the agent's response carries the text; it reaches the worker and shows in the view's transcript.
        await page.fill("#control-text", SAID)
        await page.click("#control-form button[data-action=say]")
        await expect(page.locator("#control-status")).to_have_text("The agent will say it.")
        said = await poll(lambda: _said(gateway, call_id, SAID), within=10, what="the said text in the transcript")
        assert said["role"] == "assistant"
        await expect(page.locator("#transcript")).to_contain_text(SAID, timeout=10_000)

        # Inject a user message asking for a response: the echo agent answers it.
        await page.fill("#control-text", "DTMF 5")
        await page.select_option("#control-role", "user")
        await page.click("#control-form button[data-action=inject]")
        await expect(page.locator("#control-status")).to_have_text("Injected as a user message.")
        answer = await poll(lambda: _said(gateway, call_id, "You pressed 5"), within=10, what="the echo's answer")
        assert answer["role"] == "assistant"
        await expect(page.locator("#transcript")).to_contain_text("You pressed 5", timeout=10_000)

        # The picker offers the configured profiles; a profile it does not know is refused with a reason.
        profiles = await page.locator("#profile-names option").evaluate_all("nodes => nodes.map(n => n.value)")
        assert profiles == ["billing", "echo"], profiles
        await page.fill("#handoff-profile", "no-such-profile")
        await page.click("#handoff-form button[type=submit]")
        await expect(page.locator("#control-error")).to_contain_text("handoff refused: 409")
        await expect(page.locator("#control-error")).to_contain_text("no profile 'no-such-profile'")
        # A configured one: the call goes to the billing agent (another echo agent) and the record keeps it.
        await page.fill("#handoff-profile", "billing")
        await page.click("#handoff-form button[type=submit]")
        await expect(page.locator("#control-status")).to_have_text("Handing off to billing.")
        await expect(page.locator("#timeline li[data-kind=handoff]")).to_contain_text("echo → billing", timeout=10_000)
        await page.screenshot(path=str(shots / "call-view-live.png"), full_page=True)

        await phone.hangup()
        await phone.wait_closed(within=10)
        record = await poll(lambda: _recorded(gateway, call_id), within=15, what="the call's finished recording")
        await expect(page.locator("#call-state")).to_have_text("ended", timeout=10_000)
        await expect(page.locator("#call-controls")).to_be_hidden()

        # The history: search by the caller's number, open the call, read its record.
        await page.click("#nav a[data-view=history]")
        await page.fill("#history-form [name=number]", USER)
        await page.click("#history-form button[type=submit]")
        await expect(page.locator("#history-status")).to_have_text("1 call match; showing 1–1", timeout=10_000)
        found = page.locator(f'#history-body tr[data-call-id="{call_id}"]')
        await expect(found).to_contain_text("caller_hangup")
        await found.locator("a").click()
        await expect(page.locator("#call-state")).to_have_text("ended", timeout=10_000)
        await expect(page.locator("#transcript")).to_contain_text(SAID)
        await expect(page.locator("#transcript")).to_contain_text("You pressed 5")
        kinds = await page.locator("#timeline li").evaluate_all("nodes => nodes.map(n => n.dataset.kind)")
        assert kinds[:2] == ["setup", "answer"] and kinds[-1] == "end", kinds
        assert "turn-assistant" in kinds and "turn-user" in kinds and "handoff" in kinds, kinds
        mos = await page.locator('#call-quality [data-figure="mos"] dd').text_content()
        assert mos and float(mos) > 3.5, mos

        # The recording plays in the page, from the API's endpoint (the <audio> element has only the cookie).
        recording = record["recording"]
        player = page.locator("#player")
        await expect(player).to_be_visible()
        await _until(page, "() => document.getElementById('player').readyState >= 1")
        duration = await player.evaluate("a => a.duration")
        assert abs(duration - recording["duration_s"]) < 0.1, (duration, recording)
        said_item = page.locator("#transcript li", has_text="You pressed 5")
        start_s = await said_item.locator("button").get_attribute("data-at")
        assert start_s is not None and 0 < float(start_s) < duration, start_s
        await page.locator("#transcript li").first.locator("button").click()
        first_at = await page.locator("#transcript li").first.locator("button").get_attribute("data-at")
        await _until(page, f"() => document.getElementById('player').currentTime > {float(first_at or 0) + 0.5}")
        await expect(page.locator("#transcript li").first).to_have_attribute("aria-current", "true")
        await said_item.locator("button").click()
        await _until(page, f"() => document.getElementById('player').currentTime >= {float(start_s)}")
        await expect(said_item).to_have_attribute("aria-current", "true")
        assert await player.evaluate("a => !a.error"), "the player reports an error"
        await page.screenshot(path=str(shots / "call-view-history.png"), full_page=True)
        errors = [
            line for line in browser.console if line.startswith("error") and "Failed to load resource" not in line
        ]
        assert not errors, errors
    print(f"screenshots: {shots}")
