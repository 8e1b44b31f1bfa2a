"""Caller no-input with a real phone that stays silent (pjsua2 playing silence): the agent is asked to check on
the caller after ``no_input_prompt_s``, says goodbye after ``no_input_hangup_s`` more, and the gateway hangs up
with end reason ``no_input``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.provider_harness import only_call, start_fake_provider, start_gateway_on_fake
from tests.support.audio import silence, write_wav
from tests.support.peers import require_module
from tests.support.pjsua import PjsuaPhone
from tests.support.procs import ProcessGroup

pytestmark = [pytest.mark.peer, pytest.mark.timeout(90)]

PROMPT = "Hello? Are you still on the line?"
GOODBYE = "I will hang up now. Goodbye."


def _response_creates(detail: dict[str, Any]) -> list[tuple[float, str]]:
    """(time, instructions) of each response.create the provider received."""
    times = iter(e["t"] for e in detail["timeline"] if e["dir"] == "in" and e["type"] == "response.create")
    return [
        (next(times), (e.get("response") or {}).get("instructions", ""))
        for e in detail["event_list"]
        if e["type"] == "response.create"
    ]


async def test_a_silent_caller_is_prompted_then_hung_up_no_input(peer_procs: ProcessGroup, tmp_path: Path) -> None:
    require_module("pjsua2", package="pjsua2 (the test extra)")
    fake = await start_fake_provider(peer_procs, "--mode", "tone", "--reply-ms", "600")
    gateway = await start_gateway_on_fake(
        peer_procs,
        tmp_path,
        fake,
        profile_lines=(
            "no_input_prompt_s = 2.0",
            "no_input_hangup_s = 2.0",
            f'no_input_prompt = "{PROMPT}"',
            f'no_input_goodbye = "{GOODBYE}"',
        ),
    )
    quiet = write_wav(tmp_path / "quiet.wav", silence(30.0, 8000), 8000)
    phone = PjsuaPhone(peer_procs, tmp_path, mode="caller", uri=gateway.sip_uri, play=quiet, max_seconds=30)
    async with phone:
        confirmed = await phone.wait_state("CONFIRMED", within=15)
        ended = await phone.wait_state("DISCONNECTED", within=20)
        assert await phone.wait_done(within=15) == 0
    # The gateway hung up (the phone never does here: no --hangup-after), about 2 + 0.6 + 2 s in plus the goodbye.
    assert 4.0 < ended.t - confirmed.t < 12.0, (confirmed, ended)
    call = await only_call(gateway)
    assert call["end_reason"] == "no_input", call

    (summary,) = await fake.records()
    creates = _response_creates(await fake.record(summary["id"]))
    assert [text for _, text in creates] == [
        f"Say exactly this, then stop: {PROMPT}",
        f"Say exactly this, then stop: {GOODBYE}",
    ], creates
    # The second silence is counted from when the prompt's reply had played (600 ms), not from its request.
    assert creates[1][0] - creates[0][0] >= 2.0 + 0.6 - 0.1, creates
