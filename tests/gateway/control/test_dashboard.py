"""The dashboard in headless Chromium against a live loopback control plane with a fake worker.

A call appears, its statistics update live over SSE, and pressing hang-up (twice: arm, confirm) reaches
the worker and ends the call. A screenshot is written to the test's temp dir (GATEWAY_DASHBOARD_SHOT
overrides the path, to look at it).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.control.app import create_app
from gateway.control.plane import ControlPlane
from gateway.control.settings import ControlSettings
from gateway.fleet import InProcessControlLink, TrunkRegistration
from tests.gateway.control.conftest import TOKEN, make_config
from tests.gateway.fleet.fake_worker import FakeWorker
from tests.gateway.fleet.servers import serve
from tests.support.peers import require_binary, require_module

pytestmark = [pytest.mark.peer]

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]


@pytest.fixture
async def live() -> AsyncIterator[tuple[str, ControlPlane, FakeWorker, FakeWorker]]:
    app = create_app(ControlSettings(api_token=TOKEN), config=make_config(), sweeper=False)
    plane: ControlPlane = app.state.plane
    first = FakeWorker("media-1", capacity=40)
    second = FakeWorker("media-2", capacity=40)
    first.registration = TrunkRegistration(
        state="registered",
        registrar="sip:sip.carrier.example",
        aor="sip:+15550100@carrier.example",
        contact="<sip:gateway@10.0.0.5:5060>",
        expires_s=3600,
        expires_at=time.time() + 3000,
        last_status=200,
    )
    second.registration = TrunkRegistration(
        state="failed",
        registrar="sip:sip.carrier.example",
        aor="sip:+15550100@carrier.example",
        next_attempt_at=time.time() + 40,
        last_status=401,
        last_error="sip:sip.carrier.example refused the credentials of user 'gw' for realm 'carrier.example'",
        attempts=3,
    )
    second.registrations = [
        second.registration,
        TrunkRegistration(
            trunk="carrier_b",
            state="registered",
            registrar="sip:reg.carrier-b.example",
            aor="sip:+15550200@carrier-b.example",
            expires_at=time.time() + 600,
        ),
    ]
    await first.connect(InProcessControlLink(plane, first))
    await second.connect(InProcessControlLink(plane, second))
    async with serve(app) as url:
        yield url, plane, first, second


def _levels(base: float, count: int) -> list[float]:
    return [round(base + 12 * ((i * 7919) % 13) / 13 - 6 * (i % 3), 1) for i in range(count)]


async def test_dashboard_shows_live_calls_and_hangs_up(
    live: tuple[str, ControlPlane, FakeWorker, FakeWorker], tmp_path: Path
) -> None:
    chromium = require_binary("chromium")
    require_module("playwright")
    from playwright.async_api import async_playwright, expect

    url, _plane, worker, other = live
    decision = await worker.place_call("+15550199", caller="+15550123", codec="PCMU")
    await worker.update_call(
        decision.call_id,
        stats={
            "mos": 4.32,
            "loss_pct": 0.4,
            "jitter_ms": 6.2,
            "provider_latency_p50_ms": 610,
            "provider_latency_last_ms": 540,
            "level_dbfs": -24.0,
            "level_history": _levels(-30, 60),
            "rtp_packets_in": 2400,
        },
        context={
            "caller_name": "Alice <b>Smith</b>",
            "identity_source": "p-asserted-identity",
            "headers": {"X-Account": "A-42"},
            "source": "10.0.0.5:5060",
        },
    )
    background = await other.place_call("+15550201", caller="+442071838750", codec="OPUS")
    await other.update_call(
        background.call_id,
        stats={"mos": 3.7, "loss_pct": 2.1, "jitter_ms": 41.0, "level_history": _levels(-40, 40), "level_dbfs": -38},
    )

    problems: list[str] = []
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        try:
            page = await browser.new_page(viewport={"width": 1440, "height": 760})
            page.on("pageerror", lambda exc: problems.append(f"pageerror: {exc}"))
            page.on("console", lambda m: problems.append(f"console: {m.text}") if m.type == "error" else None)
            await page.goto(url + "/dashboard")
            await page.fill("#token", TOKEN)
            await page.click("#login-form button[type=submit]")

            row = page.locator(f'tr[data-call-id="{decision.call_id}"]')
            await expect(row).to_be_visible(timeout=10_000)
            await expect(row).to_contain_text("+15550123 → +15550199")
            await expect(row).to_contain_text("4.32")
            # The caller's context, as text (a name with markup stays text).
            context_line = row.locator(".call-context")
            await expect(context_line).to_have_text("Alice <b>Smith</b> · X-Account: A-42")
            assert await context_line.get_attribute("title") == "caller from p-asserted-identity via 10.0.0.5:5060"
            await expect(page.locator("#conn")).to_have_text("live", timeout=10_000)
            await expect(page.locator("#workers-up")).to_have_text("2")
            # Each worker card says how its trunk registration stands, and why it failed.
            trunk_ok = page.locator('[data-worker-id="media-1"] .worker-trunk')
            await expect(trunk_ok).to_contain_text("trunk registered · expires in 50 min")
            assert "AOR sip:+15550100@carrier.example" in (await trunk_ok.get_attribute("title") or "")
            trunk_bad = page.locator('[data-worker-id="media-2"] .worker-trunk[data-trunk="default"]')
            await expect(trunk_bad).to_contain_text("trunk failed · 401 · attempt 3 · retry in")
            await expect(trunk_bad.locator(".worker-trunk-error")).to_contain_text("refused the credentials of user")
            # A worker with several trunks has a line for each.
            trunk_b = page.locator('[data-worker-id="media-2"] .worker-trunk[data-trunk="carrier_b"]')
            await expect(trunk_b).to_contain_text("trunk carrier_b registered · expires in 10 min")
            await expect(page.locator("#live-count")).to_have_text("2")

            # Live statistics arrive over SSE.
            await worker.update_call(decision.call_id, stats={"jitter_ms": 23.4, "mos": 3.95, "level_dbfs": -18.0})
            await expect(row).to_contain_text("23.4 ms", timeout=10_000)
            await expect(row).to_contain_text("3.95")

            # A third call shows up without a reload; then the worker panel reflects a drain.
            third = await worker.place_call("+15550209", caller="+15550777")
            await worker.heartbeat()
            await other.heartbeat()
            await expect(page.locator('[data-worker-id="media-1"]')).to_contain_text("2 / 40 calls", timeout=10_000)
            await expect(page.locator(f'tr[data-call-id="{third.call_id}"]')).to_be_visible(timeout=10_000)

            shot = Path(os.environ.get("GATEWAY_DASHBOARD_SHOT", tmp_path / "dashboard.png"))
            await page.screenshot(path=str(shot), full_page=True)
            assert (await asyncio.to_thread(shot.stat)).st_size > 10_000

            # Hang-up: arm, confirm; the fake worker records it and the row turns "ended".
            button = row.locator("button[data-action=hangup]")
            await button.click()
            await expect(button).to_have_text("Confirm")
            assert worker.hangups == []
            await button.click()
            await asyncio.wait_for(worker.hung_up.wait(), timeout=10)
            assert worker.hangups == [(decision.call_id, "dashboard")]
            await expect(row).to_have_attribute("data-state", "ended", timeout=10_000)
            await expect(row).to_contain_text("hangup:dashboard")
            await expect(page.locator("#live-count")).to_have_text("2")

            drain = page.locator('[data-worker-id="media-2"] button[data-action=drain]')
            await drain.click()
            await drain.click()
            await expect(page.locator('[data-worker-id="media-2"] .badge')).to_have_text("draining", timeout=10_000)
            assert other.drains == [False]
        finally:
            await browser.close()
    assert problems == []
