"""A warm transfer's state: the table of its steps and the record of one transfer (ADR 0041).

The orchestration is gateway/worker/warm.py; this is what the legs hold (``CallLeg.warm``) and the snapshot
shows (``transfer``), so it sits low in the worker: it knows no route, session or SIP.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from gateway.fleet.models import TransferLine
from gateway.worker.bridge import Bridge

Initiator = Literal["agent", "api"]


class WarmState(StrEnum):
    DIALLING = "dialling"
    BRIEFING = "briefing"
    BRIDGED = "bridged"
    FAILED = "failed"
    ENDED = "ended"


WarmInput = Literal["answered", "unanswered", "briefed", "human_gone", "caller_gone"]

#: (state, what happened) -> the next state. Anything else is a bug in this module (WarmTransferError).
TRANSITIONS: dict[tuple[WarmState, WarmInput], WarmState] = {
    (WarmState.DIALLING, "answered"): WarmState.BRIEFING,
    (WarmState.DIALLING, "unanswered"): WarmState.FAILED,  # no answer, busy, declined, unreachable
    (WarmState.DIALLING, "caller_gone"): WarmState.ENDED,  # the human's leg is cancelled
    (WarmState.BRIEFING, "briefed"): WarmState.BRIDGED,  # played out, or the briefing timed out or failed
    (WarmState.BRIEFING, "human_gone"): WarmState.FAILED,  # the human hung up before the join
    (WarmState.BRIEFING, "caller_gone"): WarmState.ENDED,  # the human's leg is hung up
    (WarmState.BRIDGED, "human_gone"): WarmState.ENDED,  # the caller gets a BYE
    (WarmState.BRIDGED, "caller_gone"): WarmState.ENDED,  # the human gets a BYE
}
LIVE_STATES = frozenset({WarmState.DIALLING, WarmState.BRIEFING, WarmState.BRIDGED})


class WarmTransferError(RuntimeError):
    """A transition the table does not have: a bug here, never the peer's."""


def step(state: WarmState, happened: WarmInput) -> WarmState:
    """The state after ``happened`` in ``state`` (:data:`TRANSITIONS`)."""
    after = TRANSITIONS.get((state, happened))
    if after is None:
        raise WarmTransferError(f"warm transfer: {happened!r} cannot happen while {state.value}")
    return after


@dataclass(eq=False)
class WarmTransfer:
    """One warm transfer: its legs, where it is, and the two signals of a leg ending (set by ``leg_ended``)."""

    id: str
    target: str
    caller_id: str
    human_id: str
    summary: str
    initiator: Initiator
    caller_hears: Literal["hold", "agent"]
    bridge: Bridge
    state: WarmState = WarmState.DIALLING
    outcome: str = ""
    briefed: bool = False
    started: float = field(default_factory=time.time)
    answered: float | None = None
    bridged: float | None = None
    ended: float | None = None
    caller_gone: asyncio.Event = field(default_factory=asyncio.Event)
    human_gone: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    def fire(self, happened: WarmInput) -> WarmState:
        self.state = step(self.state, happened)
        if self.state is WarmState.FAILED or self.state is WarmState.ENDED:
            self.ended = time.time()
        return self.state

    def leg_ended(self, call_id: str) -> None:
        """A leg of this transfer began to end (SipCalls.end): whoever waits on it is woken."""
        if call_id == self.caller_id:
            self.caller_gone.set()
        elif call_id == self.human_id:
            self.human_gone.set()

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    async def bridged_until_over(self) -> None:
        """While bridged, until one of the legs ends (the legs' tasks wait here instead of ending the call)."""
        if self.state is not WarmState.BRIDGED:
            return
        waits = [asyncio.ensure_future(self.caller_gone.wait()), asyncio.ensure_future(self.human_gone.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    def line(self) -> TransferLine:
        return TransferLine(
            id=self.id,
            target=self.target,
            caller_leg=self.caller_id,
            human_leg=self.human_id,
            state=self.state.value,
            initiator=self.initiator,
            outcome=self.outcome,
            briefed=self.briefed,
            started=self.started,
            answered=self.answered,
            bridged=self.bridged,
            ended=self.ended,
        )
