"""The warm transfer's table of steps, and what the agent and the human are told."""

from __future__ import annotations

import asyncio
from typing import Literal

import pytest

from gateway.fleet.models import ProfileModel, ToolModel
from gateway.session.transcript import TranscriptEntry
from gateway.worker.bridge import Bridge
from gateway.worker.transfer import (
    TRANSITIONS,
    Handoff,
    WarmInput,
    WarmState,
    WarmTransfer,
    WarmTransferError,
    step,
    wants_refer,
)
from gateway.worker.warm import briefing_profile, summary_of, why

D, B, J, F, E = WarmState.DIALLING, WarmState.BRIEFING, WarmState.BRIDGED, WarmState.FAILED, WarmState.ENDED

# (state, what happened, the state after; None: cannot happen)
TABLE: list[tuple[WarmState, WarmInput, WarmState | None]] = [
    (D, "answered", B),
    (D, "unanswered", F),
    (D, "caller_gone", E),
    (D, "briefed", None),
    (D, "human_gone", None),  # before the answer the human's end is "unanswered"
    (B, "briefed", J),
    (B, "human_gone", F),
    (B, "caller_gone", E),
    (B, "answered", None),
    (J, "human_gone", E),
    (J, "caller_gone", E),
    (J, "briefed", None),
    (J, "handed_off", E),
    (B, "handed_off", None),  # only a joined call is handed off
    (B, "connected", J),  # conversation: connect_caller, or the ops API's forced join
    (B, "declined", F),  # conversation: decline_transfer
    (D, "connected", None),
    (D, "declined", None),
    (J, "declined", None),  # too late: the caller is joined
    (F, "answered", None),
    (E, "caller_gone", None),
]


@pytest.mark.parametrize(("state", "happened", "after"), TABLE)
def test_the_table(state: WarmState, happened: WarmInput, after: WarmState | None) -> None:
    if after is None:
        with pytest.raises(WarmTransferError):
            step(state, happened)
    else:
        assert step(state, happened) is after


def test_failed_and_ended_are_final() -> None:
    assert not [key for key in TRANSITIONS if key[0] in (F, E)]


def _transfer() -> WarmTransfer:
    return WarmTransfer(
        id="wt-1",
        target="sip:human@127.0.0.1",
        caller_id="c-caller",
        human_id="c-human",
        summary="s",
        initiator="api",
        caller_hears="hold",
        bridge=Bridge("c-caller", "c-human"),
    )


def test_a_transfer_records_its_steps_and_its_legs() -> None:
    transfer = _transfer()
    assert transfer.live and transfer.line().state == "dialling"
    transfer.fire("answered")
    transfer.fire("briefed")
    transfer.leg_ended("c-human")
    assert transfer.human_gone.is_set() and not transfer.caller_gone.is_set()
    transfer.fire("human_gone")
    line = transfer.line()
    assert (line.caller_leg, line.human_leg, line.state) == ("c-caller", "c-human", "ended")
    assert line.ended is not None and not transfer.live


async def test_the_legs_wait_only_while_bridged() -> None:
    transfer = _transfer()
    await transfer.bridged_until_over("c-caller")  # not bridged: at once
    transfer.fire("answered")
    transfer.fire("briefed")
    transfer.leg_ended("c-caller")
    await transfer.bridged_until_over("c-caller")  # bridged, and its own leg has ended: at once
    waiting = asyncio.ensure_future(transfer.bridged_until_over("c-human"))
    await asyncio.sleep(0)
    assert not waiting.done(), "the other leg waits for the transfer's task to decide (a handoff may be pending)"
    transfer.over.set()
    await asyncio.wait_for(waiting, timeout=1.0)


def test_a_handoff_ends_the_transfer_and_the_line_says_refer() -> None:
    transfer = _transfer()
    transfer.fire("answered")
    transfer.fire("briefed")
    transfer.handoff, transfer.outcome = "refer", "transferred"
    assert transfer.fire("handed_off") is WarmState.ENDED
    line = transfer.line()
    assert (line.handoff, line.outcome, line.state) == ("refer", "transferred", "ended")
    assert _transfer().line().handoff == "bridge"


@pytest.mark.parametrize(
    ("requested", "setting", "offers", "refer"),
    [
        (None, "off", True, False),
        (None, "auto", True, True),
        (None, "auto", False, False),
        ("refer", "off", False, True),  # asked for: tried (a refusal keeps the bridge)
        ("bridge", "auto", True, False),
    ],
)
def test_the_handoff_is_the_requests_else_the_setting(
    requested: Handoff | None, setting: Literal["off", "auto"], offers: bool, refer: bool
) -> None:
    assert wants_refer(requested, setting, caller_offers=offers) is refer


def test_the_agent_is_told_why_in_words() -> None:
    assert why("sip_486") == "the line was busy"
    assert why("no_answer") == "nobody answered"
    assert why("sip_503") == "it failed: sip_503"


def test_a_summary_from_the_transcript() -> None:
    entries = [
        TranscriptEntry(kind="message", role="user", text="I want to cancel my plan."),
        TranscriptEntry(kind="message", role="assistant", text="Let me get someone for you."),
        TranscriptEntry(kind="message", role="system", text="a note"),
        TranscriptEntry(kind="function_call", name="warm_transfer"),
    ]
    summary = summary_of(entries)
    assert "The caller said: I want to cancel my plan." in summary and "a note" not in summary
    assert summary_of([]) == "A caller is waiting to be connected to you."


def test_the_briefing_agent_speaks_the_summary_and_nothing_else() -> None:
    profile = ProfileModel(
        name="support", provider="openai", greeting="Hi", record="both", tools=[ToolModel(name="hang_up")]
    )
    briefing = briefing_profile(profile, "The caller wants a refund.")
    assert briefing.provider == "openai" and briefing.record == "off" and briefing.tools == []
    assert "The caller wants a refund." in briefing.greeting


def test_the_conversational_briefing_agent_has_the_summary_and_the_two_tools() -> None:
    profile = ProfileModel(name="support", provider="openai", greeting="Hi", tools=[ToolModel(name="hang_up")])
    briefing = briefing_profile(profile, "The caller wants a refund.", "conversation")
    assert "The caller wants a refund." in briefing.instructions and "connect_caller" in briefing.instructions
    assert "The caller wants a refund." in briefing.greeting
    assert [tool.name for tool in briefing.tools] == ["connect_caller", "decline_transfer"]
    assert briefing.record == "off" and briefing.no_input_hangup_s == 0.0


def test_a_join_or_a_decline_is_asked_once_and_only_while_briefing() -> None:
    transfer = _transfer()
    with pytest.raises(WarmTransferError, match="is dialling, not briefing"):
        transfer.ask_join("api")
    transfer.fire("answered")
    transfer.decline("  ")
    assert transfer.asked.is_set() and transfer.declined_reason == "no reason given"
    with pytest.raises(WarmTransferError, match="asked already"):
        transfer.ask_join("agent")
    transfer.fire("declined")
    line = transfer.line()
    assert (line.state, line.declined_reason, line.briefing) == ("failed", "no reason given", "spoken")
    transfer = _transfer()
    transfer.fire("answered")
    transfer.decline("x" * 500)
    assert transfer.declined_reason == "x" * 200, "the line's field holds 200 characters"
