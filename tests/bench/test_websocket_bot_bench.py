"""`gateway bench websocket-bot`: every kind of call really carries audio both ways, and the figures are per frame."""

from __future__ import annotations

import pytest

from bench.websocket_bot import KINDS, measure, run, table
from gateway.providers.media_stream.fake_bot import FakeBot


@pytest.mark.parametrize("kind", KINDS)
async def test_each_kind_echoes_every_tick(kind: str) -> None:
    async with FakeBot(echo=True) as bot:
        result = await measure(kind, calls=3, seconds=0.6, warmup_s=0.3, bot_url=bot.url, bot_pid=0)
    assert result.ticks == 30 and result.calls == 3
    assert result.frames_back >= 0.9, "the caller hears the agent on (nearly) every tick"
    assert 0 < result.us_per_call_frame < 20_000


def test_run_starts_its_own_bot_process_and_reports_every_kind() -> None:
    summary = run(calls=2, seconds=0.4, warmup_s=0.2, repeats=1)
    assert list(summary["kinds"]) == list(KINDS)
    for figures in summary["kinds"].values():
        assert figures["frames_back"] >= 0.8 and figures["us_per_call_frame"] > 0
    assert summary["kinds"]["websocket pcmu"]["bot_us_per_call_frame"] > 0, "the bot's CPU is measured apart"
    assert "websocket pcmu" in table(summary)
