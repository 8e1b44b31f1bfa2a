"""Output guardrails end to end: a baresip phone calls ``gateway run`` whose agent (the fake OpenAI provider)
streams a reply whose transcript says a blocked phrase part-way through.

What must hold: the media tick that stops the agent's audio comes within 40 ms (two ticks) of the offending
transcript delta reaching the gateway; the provider is told to cancel and to truncate the item at exactly the
milliseconds the gateway sent (the phone's recording hears that much of the reply, within a frame); one
``guardrail.tripped``; and one follow-up (a system item naming the guardrail, then ``response.create``), after
which the agent speaks again and the call goes on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.provider_harness import (
    bursts,
    caller_wav,
    only_call,
    session_counters,
    start_fake_provider,
    start_gateway_on_fake,
    trip_lines,
)
from tests.gateway.providers.helpers import check_client_event
from tests.support.audio import read_wav
from tests.support.baresip import BaresipPhone
from tests.support.fixtures import require_speech_tools
from tests.support.peers import require_binary
from tests.support.procs import ProcessGroup

pytestmark = [pytest.mark.peer, pytest.mark.timeout(90)]

TURN = "Wait, one more thing please."  # 2.4 s
TONE_HZ = 440.0
HEARD_TOLERANCE_MS = 25  # one frame the phone's jitter buffer may conceal, plus the 5 ms envelope window
# Forty words, one per 100 ms audio delta; the sentence with the blocked phrase ends at word 16 (1.6 s of audio).
WORDS = [f"w{i}" for i in range(40)]
WORDS[14:17] = ["ask", "Acme", "Corp."]
GUARDRAILS = """
[[profiles.agent.guardrails]]
name = "no-competitors"
kind = "blocked"
phrases = ["acme corp"]

[[profiles.agent.guardrails]]
name = "pii"
kind = "pii"
"""


async def test_a_blocked_phrase_stops_the_agent_within_two_ticks_and_truncates_at_what_was_sent(
    peer_procs: ProcessGroup, tmp_path: Path
) -> None:
    require_binary("baresip", package="baresip baresip-core")
    require_speech_tools()
    # 4 s of tone at twice real time: the provider is far ahead of the caller when the phrase arrives, so a
    # truncate at what was received (or at a wall-clock estimate) would be caught. Each response starts 0.5 s
    # after it is asked for, so the phone hears the cut reply and the follow-up as two bursts.
    fake = await start_fake_provider(
        peer_procs,
        *("--mode", "tone", "--reply-ms", "4000", "--paced", "--pace", "2", "--chunk-ms", "100"),
        *("--reply-delay-s", "0.5", "--reply-transcript", " ".join(WORDS)),
    )
    gateway = await start_gateway_on_fake(peer_procs, tmp_path, fake, extra_toml=GUARDRAILS)
    source = caller_wav(tmp_path / "caller.wav", [TURN, 7.0])
    phone = BaresipPhone(peer_procs, tmp_path, source_wav=source, codecs=("pcmu",))
    async with phone:
        await phone.dial(gateway.sip_uri)
        await phone.wait_established(within=15)
        await phone.wait_closed(within=40)
    counters = await session_counters(gateway)
    assert counters["resumes"] == 0 and counters["barge_ins"] == 0, counters

    (trip,) = trip_lines(gateway)
    assert trip.guardrail == "no-competitors"
    ((item_id, (sent_ms, received_ms)),) = trip.items.items()
    assert sent_ms > 0 and received_ms > sent_ms + 300, "the provider was not ahead of the caller: nothing proven"
    # The stopping tick: the first after the delta with "Corp." was handled (the session clock, both ends).
    assert trip.stopped_at is not None and trip.stopped_frame is not None
    assert 0 <= trip.stopped_at - trip.received_at <= 0.040, trip

    records = [await fake.record(summary["id"]) for summary in await fake.records()]
    assert len(records) == 1
    detail = records[0]
    for event in detail["event_list"]:
        check_client_event(event)
    kinds = [event["type"] for event in detail["event_list"]]
    assert kinds.count("response.cancel") == 1 and kinds.count("conversation.item.truncate") == 1
    truncate = detail["event_list"][kinds.index("conversation.item.truncate")]
    assert truncate == {
        "type": "conversation.item.truncate",
        "item_id": item_id,
        "content_index": 0,
        "audio_end_ms": sent_ms,
    }
    assert detail["truncations"] == [{"item_id": item_id, "audio_end_ms": sent_ms}]
    # One follow-up: a system item naming the guardrail, then the one response.create the gateway sent.
    systems: list[dict[str, Any]] = [
        e["item"]
        for e in detail["event_list"]
        if e["type"] == "conversation.item.create" and e["item"]["role"] == "system"
    ]
    assert len(systems) == 1 and "no-competitors" in json.dumps(systems[0])
    assert kinds.count("response.create") == 1
    assert kinds.index("conversation.item.truncate") < kinds.index("response.create")

    # The call's record (ops API): the trip, with what the caller heard of the cut reply.
    call = await only_call(gateway)
    (line,) = call["stats"]["guardrail_trips"]
    assert (line["guardrail"], line["heard_ms"], line["followed_up"]) == ("no-competitors", sent_ms, True)

    # Independently, the phone: the cut reply lasted what the gateway sent (within a frame), then the follow-up.
    heard = bursts(read_wav(phone.last_recording().decoded))
    assert len(heard) >= 2, heard
    first = heard[0]
    assert abs(first.frequency_hz - TONE_HZ) < 10
    assert abs(first.duration_ms - sent_ms) <= HEARD_TOLERANCE_MS, (first, sent_ms)
