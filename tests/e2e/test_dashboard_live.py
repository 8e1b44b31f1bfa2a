"""The dashboard of a real ``gateway run`` in headless Chromium, with a real baresip call on the line.

The page is used as an operator uses it: the token is typed into the login form, the call's row appears
from the REST snapshot and the event stream (cookie-authenticated EventSource), its figures move with the
worker's heartbeats, and two clicks on "Hang up" end the call: the phone receives the BYE.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.gateway_proc import start_gateway
from tests.e2e.ops_support import poll
from tests.support.baresip import BaresipPhone
from tests.support.chromium import launch_chromium
from tests.support.peers import require_binary, require_module
from tests.support.procs import ProcessGroup

pytestmark = [pytest.mark.peer, pytest.mark.timeout(90)]

WORKER = "dash-w1"
RECEIVED = re.compile(r"(\d+) lost of (\d+) received")


@pytest.fixture(autouse=True)
def _peers() -> None:
    require_binary("baresip", package="baresip baresip-core")
    require_binary("chromium", package="chromium chromium-driver")
    require_module("playwright")


async def _row(page: Any, call_id: str) -> dict[str, Any] | None:
    """What the call's row shows: its state, the packets-received figure, the level label, the buttons."""
    row = page.locator(f'#calls-body tr[data-call-id="{call_id}"]')
    if await row.count() != 1:
        return None
    loss_title = await row.locator("td").nth(7).get_attribute("title") or ""
    received = RECEIVED.search(loss_title)
    return {
        "state": await row.get_attribute("data-state"),
        "received": int(received.group(2)) if received else None,
        "level": await row.locator("canvas.spark").get_attribute("aria-label"),
        "buttons": await row.locator("button").all_text_contents(),
        "text": await row.inner_text(),
    }


async def test_dashboard_shows_a_live_call_and_hangs_it_up(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    gateway = await start_gateway(peer_procs, env={"GATEWAY_WORKER_ID": WORKER})
    phone = BaresipPhone(peer_procs, tmp_path, source_wav=speech_8k, user="dash", tail_silence=30, codecs=("pcma",))
    shots = tmp_path / "screenshots"
    shots.mkdir()
    async with phone, gateway.client() as api, launch_chromium(tmp_path) as browser:
        page = await browser.new_page()
        await page.goto(gateway.http + "/dashboard")
        await page.locator("#login").wait_for(state="visible", timeout=10_000)
        await page.fill("#token", gateway.token)
        await page.click("#login-form button[type=submit]")
        await page.locator("#main").wait_for(state="visible", timeout=10_000)
        await poll(lambda: _live(page), within=10, what="the event stream connected")
        assert await page.locator(f'.worker[data-worker-id="{WORKER}"]').count() == 1

        # A call placed after the page loaded arrives through the event stream.
        await phone.dial(gateway.sip_uri)
        await phone.wait_established(within=10)
        call_id = (await poll(lambda: _one_live(api), within=10, what="the call in /v1/calls"))["id"]
        first = await poll(lambda: _active_row(page, call_id), within=10, what="the call's row, active")
        assert "dash → agent" in first["text"] and WORKER in first["text"] and "PCMA" in first["text"]
        assert first["buttons"] == ["Hang up"]
        assert await page.locator("#live-count").text_content() == "1"

        # Its figures move with the heartbeats: two seconds more of received packets, and a caller level.
        before = first["received"] or 0
        later = await poll(lambda: _moved(page, call_id, before + 100), within=10, what=f"received above {before}")
        assert later["level"] is not None and later["level"].startswith("level ")
        await page.screenshot(path=str(shots / "dashboard-live-call.png"), full_page=True)
        # The row, its hang-up button included, fits a 1280 px wide window without scrolling sideways.
        assert await page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        box = await page.locator(f'#calls-body tr[data-call-id="{call_id}"] button').bounding_box()
        assert box is not None and box["x"] + box["width"] <= 1280

        # Two clicks: the first arms the button, the second hangs up. The phone gets the BYE.
        hang_up = page.locator(f'#calls-body tr[data-call-id="{call_id}"] button[data-action="hangup"]')
        await hang_up.click()
        assert await hang_up.text_content() == "Confirm"
        assert phone.events[-1].type != "CALL_CLOSED"
        await hang_up.click()
        await phone.wait_closed(within=10)
        ended = await poll(lambda: _ended_row(page, call_id), within=10, what="the call's row, ended")
        assert "dashboard" in ended["text"] and ended["buttons"] == []
        assert await page.locator("#live-count").text_content() == "0"
        call = (await api.get(f"/v1/calls/{call_id}")).json()
        assert call["state"] == "ended" and call["end_reason"] == "dashboard"
        worker_card = page.locator(f'.worker[data-worker-id="{WORKER}"] .worker-foot span')
        await poll(lambda: _text(worker_card, "0 / "), within=5, what="the worker card back to 0 calls")
        await page.screenshot(path=str(shots / "dashboard-after-hangup.png"), full_page=True)
        errors = [line for line in browser.console if line.startswith("error")]
        assert not errors, errors
    print(f"screenshots: {shots}")


async def _live(page: Any) -> bool:
    classes = await page.locator("#conn").get_attribute("class") or ""
    return "pill-live" in classes.split()


async def _text(locator: Any, prefix: str) -> bool:
    return bool((await locator.text_content() or "").startswith(prefix))


async def _one_live(api: Any) -> dict[str, Any] | None:
    items: list[dict[str, Any]] = (await api.get("/v1/calls", params={"live": "true"})).json()["items"]
    return items[0] if len(items) == 1 else None


async def _active_row(page: Any, call_id: str) -> dict[str, Any] | None:
    row = await _row(page, call_id)
    return row if row is not None and row["state"] == "active" else None


async def _ended_row(page: Any, call_id: str) -> dict[str, Any] | None:
    row = await _row(page, call_id)
    return row if row is not None and row["state"] == "ended" else None


async def _moved(page: Any, call_id: str, before: int) -> dict[str, Any] | None:
    row = await _row(page, call_id)
    if row is None or row["received"] is None or row["received"] <= before:
        return None
    return row
