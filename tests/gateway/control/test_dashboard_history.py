"""The dashboard's history and call views in headless Chromium, against a loopback control plane with a fake
worker and its database of calls (SQLite in the test's directory).

Ended calls with transcripts, tool calls and figures are listed, filtered by number and transcript text and
paged by cursor; a call's view shows its timeline, transcript and figures; its recording (a WAV in the
recordings directory the record names, served by GET /v1/calls/{id}/recording) plays in an <audio> element
authorised by the session's media cookie,
the playhead marks the transcript item and clicking an item seeks. On a live call, say and inject reach the
worker as agent commands; a refused command shows the API's reason.
"""

from __future__ import annotations

import asyncio
import time
import wave
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.control.app import create_app
from gateway.control.history import CallHistory
from gateway.control.plane import ControlPlane
from gateway.control.settings import ControlSettings
from gateway.fleet import InProcessControlLink
from tests.gateway.control.conftest import TOKEN, make_config
from tests.gateway.control.test_dashboard import CHROMIUM_ARGS
from tests.gateway.fleet.fake_worker import FakeWorker
from tests.gateway.fleet.servers import serve
from tests.support.peers import require_binary, require_module

pytestmark = [pytest.mark.peer, pytest.mark.timeout(120)]

RECORDING_S = 6.0
RATE = 16_000


@dataclass
class Live:
    url: str
    plane: ControlPlane
    history: CallHistory
    worker: FakeWorker
    recordings: Path


@pytest.fixture
async def live(tmp_path: Path) -> AsyncIterator[Live]:
    settings = ControlSettings(api_token=TOKEN, state_dir=tmp_path / "state", recordings_dir=tmp_path / "recordings")
    app = create_app(settings, config=make_config(), sweeper=False)
    settings.recordings_path.mkdir()
    plane: ControlPlane = app.state.plane
    worker = FakeWorker("media-1", capacity=40)
    await worker.connect(InProcessControlLink(plane, worker))
    async with serve(app) as url:
        yield Live(url, plane, app.state.history, worker, settings.recordings_path)


def _write_wav(path: Path) -> None:
    """Stereo PCM16: a tone on the left (the caller), another on the right (the agent)."""
    t = np.arange(int(RECORDING_S * RATE)) / RATE
    left = 0.3 * np.sin(2 * np.pi * 440 * t)
    right = 0.3 * np.sin(2 * np.pi * 660 * t)
    pcm = (np.stack([left, right], axis=1) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(2)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes(pcm.tobytes())


async def _ended_call(
    worker: FakeWorker, caller: str, *, said: list[tuple[str, str, float, bool]], recording: Path | None = None
) -> str:
    decision = await worker.place_call("+15550199", caller=caller)
    if recording is not None:
        # The worker writes the file as the call runs (recorder.py); the record names it relative to the directory.
        relative = f"2026-12-07/{decision.call_id}.wav"
        (recording / "2026-12-07").mkdir(exist_ok=True)
        await asyncio.to_thread(_write_wav, recording / relative)
        size = (recording / relative).stat().st_size
        await worker.update_call(
            decision.call_id,
            recording={
                "path": relative,
                "format": "wav",
                "channels": 2,
                "sample_rate": RATE,
                "bytes": size,
                "duration_s": RECORDING_S,
            },
        )
    transcript = [{"role": r, "text": t, "start_s": s, "truncated": cut} for r, t, s, cut in said]
    await worker.update_call(
        decision.call_id,
        transcript=transcript,
        dtmf_events=[{"digit": "4", "direction": "received", "at_s": 2.0}] if said else [],
        trace_id="0af7651916cd43dd8448eb211c80319c" if said else "",
        trunk="carrier_a" if said else None,
        handoffs=[
            {
                "at_s": 3.0,
                "from_profile": "support",
                "to_profile": "sales",
                "reason": "asks about an invoice",
                "initiator": "agent",
                "ok": True,
            }
        ]
        if said
        else [],
        tools=[
            {
                "name": "lookup_order",
                "arguments": '{"order": "A-42"}',
                "result": '{"status": "shipped"}',
                "start_s": 2.4,
                "duration_ms": 180.0,
            }
        ]
        if said
        else [],
        stats={
            "mos": 4.21,
            "jitter_ms": 7.5,
            "loss_pct": 0.8,
            "concealed": 12,
            "rtp_packets_in": 300,
            "rtp_lost": 2,
            "barge_ins": 1,
            "resumes": 1,
            "tool_calls": 1 if said else 0,
        },
    )
    await worker.end_call(decision.call_id, reason="caller_hangup")
    return decision.call_id


async def _browser_page(pw: Any, problems: list[str]) -> tuple[Any, Any]:
    browser = await pw.chromium.launch(
        executable_path=require_binary("chromium"),
        args=[*CHROMIUM_ARGS, "--autoplay-policy=no-user-gesture-required"],
        headless=True,
    )
    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    page.on("pageerror", lambda exc: problems.append(f"pageerror: {exc}"))
    page.on("console", lambda m: problems.append(f"console: {m.text}") if m.type == "error" else None)
    return browser, page


async def _until(page: Any, predicate: str, *, within: float = 10.0) -> None:
    """Wait for a JS predicate (a function of no arguments) to hold; page.wait_for_function would eval a string,
    which the dashboard's CSP forbids."""
    deadline = time.monotonic() + within
    while not await page.evaluate(predicate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{predicate} still false after {within} s")
        await asyncio.sleep(0.05)


async def _login(page: Any, url: str, hash_: str) -> None:
    await page.goto(f"{url}/dashboard{hash_}")
    await page.fill("#token", TOKEN)
    await page.click("#login-form button[type=submit]")


SAID = [
    ("user", "Hello, where is my order?", 0.5, False),
    ("assistant", "Let me look that up for you, one moment please.", 1.5, True),
    ("user", "Order A-42.", 2.2, False),
    ("assistant", "Your order has shipped and arrives tomorrow.", 3.6, False),
]


async def test_history_lists_filters_pages_and_plays_a_call(live: Live) -> None:
    require_module("playwright")
    from playwright.async_api import async_playwright, expect

    began = time.time()
    wanted = await _ended_call(live.worker, "+15557770001", said=SAID, recording=live.recordings)
    for i in range(27):
        await _ended_call(live.worker, f"+1555888{i:04d}", said=[])

    problems: list[str] = []
    async with async_playwright() as pw:
        browser, page = await _browser_page(pw, problems)
        try:
            await _login(page, live.url, "#/history")
            await expect(page.locator("#view-history")).to_be_visible(timeout=10_000)
            await expect(page.locator("#history-status")).to_have_text("28 calls match; showing 1–25", timeout=10_000)
            await expect(page.locator("#history-body tr")).to_have_count(25)
            # The cursor's next page, and back.
            await page.click("#history-next")
            await expect(page.locator("#history-status")).to_have_text("28 calls match; showing 26–28")
            await expect(page.locator("#history-next")).to_be_disabled()
            await page.click("#history-prev")
            await expect(page.locator("#history-status")).to_have_text("28 calls match; showing 1–25")

            # Search by number, then by words said: the one call, from the URL's filters as well.
            await page.fill("#history-form [name=number]", "7770001")
            await page.press("#history-form [name=number]", "Enter")
            await expect(page.locator("#history-status")).to_have_text("1 call match; showing 1–1")
            assert "number=7770001" in page.url
            await page.fill("#history-form [name=number]", "")
            await page.fill("#history-form [name=text]", "ARRIVES TOMORROW")
            await page.click("#history-form button[type=submit]")
            await expect(page.locator("#history-body tr")).to_have_count(1)
            row = page.locator(f'#history-body tr[data-call-id="{wanted}"]')
            await expect(row).to_contain_text("+15557770001 → +15550199")
            await expect(row).to_contain_text("caller_hangup")
            await expect(row).to_contain_text("4.21")
            await page.fill("#history-form [name=text]", "no such words")
            await page.click("#history-form button[type=submit]")
            await expect(page.locator("#history-empty")).to_be_visible()
            await page.go_back()
            await expect(row).to_be_visible()
            # A time range: calls from tomorrow on are none; a range that ends before it starts is the API's 422.
            await page.fill("#history-form [name=text]", "")
            await page.fill("#history-form [name=since]", "2099-01-02T00:00")
            await page.click("#history-form button[type=submit]")
            await expect(page.locator("#history-status")).to_have_text("0 calls match")
            await page.fill("#history-form [name=until]", "2099-01-01T00:00")
            await page.click("#history-form button[type=submit]")
            await expect(page.locator("#history-status")).to_contain_text("Search failed: 422")
            await expect(page.locator("#history-status")).to_contain_text("must be after since")
            await page.go_back()
            await page.go_back()
            await expect(row).to_be_visible()

            # The call's view: figures, timeline, transcript.
            await row.locator("a").click()
            await expect(page.locator("#view-call")).to_be_visible()
            await expect(page.locator("#call-state")).to_have_text("ended", timeout=10_000)
            quality = page.locator("#call-quality")
            await expect(quality.locator('[data-figure="mos"] dd')).to_have_text("4.21")
            await expect(quality.locator('[data-figure="jitter"] dd')).to_have_text("7.5 ms")
            await expect(quality.locator('[data-figure="loss"] dd')).to_have_text("0.8 %")
            await expect(quality.locator('[data-figure="concealed"] dd')).to_have_text("12 frames")
            kinds = await page.locator("#timeline li").evaluate_all("nodes => nodes.map(n => n.dataset.kind)")
            assert kinds == [
                "setup",
                "answer",
                "turn-user",
                "turn-assistant",
                "barge-in",
                "dtmf",
                "turn-user",
                "tool",
                "handoff",
                "turn-assistant",
                "end",
            ], kinds
            await expect(page.locator("#timeline li[data-kind=tool]")).to_contain_text('{"status": "shipped"}')
            await expect(page.locator("#timeline li[data-kind=dtmf]")).to_contain_text("Caller pressed a key4")
            handoff = page.locator("#timeline li[data-kind=handoff]")
            await expect(handoff).to_contain_text("support → sales · by the agent · asks about an invoice")
            await expect(page.locator("#call-head")).to_contain_text("0af7651916cd43dd8448eb211c80319c")
            await expect(page.locator("#call-head")).to_contain_text("Trunkcarrier_a")
            transcript = page.locator("#transcript li")
            await expect(transcript).to_have_count(4)
            await expect(transcript.nth(1)).to_contain_text("cut off")
            await expect(page.locator("#call-controls")).to_be_hidden()

            # The recording plays; its playhead follows the transcript; a click on an item seeks there.
            player = page.locator("#player")
            await expect(player).to_be_visible()
            await _until(page, "() => document.getElementById('player').readyState >= 1")
            duration = await player.evaluate("a => a.duration")
            assert abs(duration - RECORDING_S) < 0.05, duration
            await transcript.nth(2).locator("button").click()
            await _until(page, "() => document.getElementById('player').currentTime > 2.5")
            await expect(transcript.nth(2)).to_have_attribute("aria-current", "true")
            await expect(page.locator("#timeline li.current")).to_have_attribute("data-kind", "tool")
            await _until(page, "() => document.getElementById('player').currentTime > 3.7")
            await expect(transcript.nth(3)).to_have_attribute("aria-current", "true")
            # Keyboard: focus an item and press Enter.
            await transcript.nth(0).locator("button").focus()
            await page.keyboard.press("Enter")
            await _until(
                page, "() => { const t = document.getElementById('player').currentTime; return t >= 0.5 && t < 2; }"
            )
            await expect(transcript.nth(0)).to_have_attribute("aria-current", "true")
            assert time.time() - began < 100
        finally:
            await browser.close()
    # The browser logs the refused search (the 422); nothing else went wrong.
    assert problems == [
        "console: Failed to load resource: the server responded with a status of 422 (Unprocessable Entity)"
    ]


async def test_live_call_controls_reach_the_worker_and_show_refusals(live: Live) -> None:
    require_module("playwright")
    from playwright.async_api import async_playwright, expect

    decision = await live.worker.place_call("+15550199", caller="+15550123")
    call_id = decision.call_id
    await live.worker.update_call(call_id, transcript=[{"role": "user", "text": "Hi there", "start_s": 0.4}])
    problems: list[str] = []
    async with async_playwright() as pw:
        browser, page = await _browser_page(pw, problems)
        try:
            await _login(page, live.url, "")
            link = page.locator(f'#calls-body tr[data-call-id="{call_id}"] a')
            await expect(link).to_be_visible(timeout=10_000)
            await link.click()
            await expect(page.locator("#call-state")).to_have_text("active", timeout=10_000)
            await expect(page.locator("#call-controls")).to_be_visible()
            await expect(page.locator("#recording-box")).to_contain_text("once the call has ended")
            # Nothing to play yet: the transcript is text, not buttons that would seek nothing.
            await expect(page.locator("#transcript li")).to_have_count(1)
            await expect(page.locator("#transcript button")).to_have_count(0)

            await page.fill("#control-text", "Your order has shipped.")
            await page.click("#control-form button[data-action=say]")
            await expect(page.locator("#control-status")).to_have_text("The agent will say it.")
            await page.fill("#control-text", "The caller is a premium customer.")
            await page.check("#control-respond")
            await page.click("#control-form button[data-action=inject]")
            await expect(page.locator("#control-status")).to_have_text("Injected as a system message.")
            sent = [(c, cmd.model_dump(exclude_none=True)) for c, cmd in live.worker.agent_commands]
            assert sent == [
                (call_id, {"say": {"text": "Your order has shipped.", "interrupt": False}}),
                (call_id, {"inject": {"text": "The caller is a premium customer.", "role": "system", "respond": True}}),
            ]

            # The profile picker offers the routes file's profiles; one it does not know gets the API's reason.
            options = await page.locator("#profile-names option").evaluate_all("nodes => nodes.map(n => n.value)")
            assert options == ["sales", "support"]
            await page.fill("#handoff-profile", "no-such-profile")
            await page.click("#handoff-form button[type=submit]")
            error = page.locator("#control-error")
            await expect(error).to_contain_text("handoff refused: 409 command_rejected")
            await expect(error).to_contain_text("no profile 'no-such-profile' to hand off to (known: sales, support)")
            # A profile it knows goes to the worker with the profile itself.
            await page.fill("#handoff-profile", "sales")
            await page.click("#handoff-form button[type=submit]")
            await expect(page.locator("#control-status")).to_have_text("Handing off to sales.")
            await expect(error).to_have_text("")
            last_call, last = live.worker.agent_commands[-1]
            assert last_call == call_id and last.handoff is not None and last.handoff.profile == "sales"
            assert last.target is not None and last.target.provider == "openai"

            # The transcript follows the call (read again on its events); when it ends the controls go away.
            await live.worker.update_call(
                call_id,
                transcript=[
                    {"role": "user", "text": "Hi there", "start_s": 0.4},
                    {"role": "assistant", "text": "Your order has shipped.", "start_s": 1.2},
                ],
            )
            await expect(page.locator("#transcript li")).to_have_count(2, timeout=10_000)
            await live.worker.update_call(call_id, state="ringing")
            await expect(page.locator("#call-state")).to_have_text("ringing", timeout=10_000)
            await page.fill("#control-text", "Hello?")
            await page.click("#control-form button[data-action=say]")
            await expect(error).to_contain_text("say refused: 409")
            await expect(error).to_contain_text("not active")
            await live.worker.end_call(call_id)
            await expect(page.locator("#call-controls")).to_be_hidden(timeout=10_000)
            await expect(page.locator("#recording-box")).to_contain_text("not recorded")
        finally:
            await browser.close()
    # The browser logs each refused request; those two were the point.
    refused = [p for p in problems if "Failed to load resource" in p]
    assert len(refused) == 2 and not set(problems) - set(refused), problems
