"""The call legs' state table, the one way an end begins, and the registry the commands go through."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.fleet.errors import CallNotFoundError
from gateway.worker.legs import (
    SNAPSHOT_STATE,
    TRANSITIONS,
    LegRegistry,
    LegState,
    LegStateError,
    begin_end,
    move,
)


@dataclass(eq=False)
class StubLeg:
    """One fake of the Leg protocol: what the table and the registry read."""

    id: str
    kind: str = "sip"
    state: LegState = LegState.ADMITTED
    end_reason: str = ""
    cost: float = 1.0
    hung_up: str = ""

    @property
    def live(self) -> bool:
        return self.state is not LegState.ENDED

    def hang_up(self, reason: str) -> None:
        self.hung_up = reason


def test_the_table_is_the_one_drawn_in_the_module_docstring() -> None:
    import gateway.worker.legs as legs

    doc = legs.__doc__ or ""
    drawn = {
        (LegState[old], LegState[new])
        for line in doc.splitlines()
        if "->" in line and line.strip().split()[0].isupper()
        for old, _, new in [line.split()[:3]]
    }
    table = {(old, new) for old, targets in TRANSITIONS.items() for new in targets}
    assert drawn == table


def test_a_call_goes_up_is_held_and_ends_once() -> None:
    leg = StubLeg("c-1")
    for state in (LegState.RINGING, LegState.ACTIVE, LegState.HELD, LegState.ACTIVE):
        move(leg, state)
    assert begin_end(leg, "caller_hangup") is True
    assert (leg.state, leg.end_reason) == (LegState.ENDING, "caller_hangup")
    assert begin_end(leg, "api") is False  # the first reason wins, the state moves once
    assert leg.end_reason == "caller_hangup"
    move(leg, LegState.ENDED)
    assert begin_end(leg, "api") is False and leg.state is LegState.ENDED


def test_a_reason_recorded_before_the_end_began_is_the_one_kept() -> None:
    leg = StubLeg("c-2", end_reason="no_common_codec")  # set before the 488 went out
    assert begin_end(leg, "caller_cancelled") is True
    assert leg.end_reason == "no_common_codec"


@pytest.mark.parametrize(
    ("path", "bad"),
    [
        ((), LegState.HELD),  # an unanswered call cannot be held
        ((LegState.ENDING,), LegState.ACTIVE),  # nothing comes back from ending
        ((LegState.ENDING, LegState.ENDED), LegState.ENDING),
        ((LegState.RINGING,), LegState.ADMITTED),
    ],
)
def test_a_move_the_table_does_not_have_is_a_bug_that_raises(path: tuple[LegState, ...], bad: LegState) -> None:
    leg = StubLeg("c-3")
    for state in path:
        move(leg, state)
    with pytest.raises(LegStateError, match=f"-> {bad.value}"):
        move(leg, bad)


@given(st.lists(st.sampled_from(list(LegState)), max_size=12))
def test_any_sequence_of_moves_stays_in_the_table_and_ends_at_most_once(wanted: list[LegState]) -> None:
    leg = StubLeg("c-4")
    endings = 0
    for state in wanted:
        before = leg.state
        if state is LegState.ENDING:
            endings += begin_end(leg, "x")
            continue
        try:
            move(leg, state)
        except LegStateError:
            assert state not in TRANSITIONS[before] and leg.state is before
        else:
            assert state in TRANSITIONS[before]
    assert endings <= 1
    assert SNAPSHOT_STATE[leg.state] in ("admitted", "ringing", "active", "held", "ending", "ended")


def test_the_registry_finds_live_legs_of_both_kinds_and_counts_what_they_take() -> None:
    legs = LegRegistry()
    sip, browser = StubLeg("c-5", cost=2.0), StubLeg("w-1", kind="webrtc", cost=18.0)
    legs.add(sip)  # type: ignore[arg-type]
    legs.add(browser)  # type: ignore[arg-type]
    legs.find("w-1").hang_up("api")
    assert browser.hung_up == "api"
    assert (legs.live_count(), legs.live_count("webrtc"), legs.capacity_used()) == (2, 1, 20.0)
    with pytest.raises(CallNotFoundError):
        legs.find("c-unknown")
    sip.state = LegState.ENDED
    with pytest.raises(CallNotFoundError):
        legs.find("c-5")  # an ended leg takes no command
    assert legs.capacity_used() == 18.0 and set(legs) == {"c-5", "w-1"}
    legs.remove(sip)  # type: ignore[arg-type]
    assert dict(legs) == {"w-1": browser}
