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


WarmInput = Literal[
    "answered", "unanswered", "briefed", "connected", "declined", "human_gone", "caller_gone", "handed_off"
]
Handoff = Literal["bridge", "refer"]
Briefing = Literal["spoken", "conversation"]

#: (state, what happened) -> the next state. Anything else is a bug in this module (WarmTransferError).
TRANSITIONS: dict[tuple[WarmState, WarmInput], WarmState] = {
    (WarmState.DIALLING, "answered"): WarmState.BRIEFING,
    (WarmState.DIALLING, "unanswered"): WarmState.FAILED,  # no answer, busy, declined, unreachable
    (WarmState.DIALLING, "caller_gone"): WarmState.ENDED,  # the human's leg is cancelled
    (WarmState.BRIEFING, "briefed"): WarmState.BRIDGED,  # played out, or the briefing timed out or failed
    (WarmState.BRIEFING, "connected"): WarmState.BRIDGED,  # conversation: the briefing agent or the ops API joined
    (WarmState.BRIEFING, "declined"): WarmState.FAILED,  # conversation: the human won't take the call
    (WarmState.BRIEFING, "human_gone"): WarmState.FAILED,  # the human hung up before the join
    (WarmState.BRIEFING, "caller_gone"): WarmState.ENDED,  # the human's leg is hung up
    (WarmState.BRIDGED, "human_gone"): WarmState.ENDED,  # the caller gets a BYE
    (WarmState.BRIDGED, "caller_gone"): WarmState.ENDED,  # the human gets a BYE
    (WarmState.BRIDGED, "handed_off"): WarmState.ENDED,  # the caller's REFER reached the human: both legs end
}
LIVE_STATES = frozenset({WarmState.DIALLING, WarmState.BRIEFING, WarmState.BRIDGED})


class WarmTransferError(RuntimeError):
    """A transition the table does not have: a bug here, never the peer's."""


def wants_refer(requested: Handoff | None, setting: Literal["off", "auto"], *, caller_offers: bool) -> bool:
    """Whether a joined transfer is handed off with a REFER: the request's ``handoff`` if it gave one, else the
    worker's setting (auto: when the caller's INVITE offered REFER and Replaces, ``CallLeg.refer_replaces``)."""
    if requested is not None:
        return requested == "refer"
    return setting == "auto" and caller_offers


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
    briefing: Briefing = "spoken"  # conversation: the human talks with the briefing agent before the join
    handoff: Handoff = "bridge"  # "refer" once the caller's REFER reached the human
    handoff_detail: str = ""  # why a REFER handoff was not tried, or failed
    refer: bool = False  # a REFER handoff is to be tried once joined
    started: float = field(default_factory=time.time)
    answered: float | None = None
    bridged: float | None = None
    ended: float | None = None
    caller_gone: asyncio.Event = field(default_factory=asyncio.Event)
    human_gone: asyncio.Event = field(default_factory=asyncio.Event)
    over: asyncio.Event = field(default_factory=asyncio.Event)  # the transfer's task decided how the bridge ended
    asked: asyncio.Event = field(default_factory=asyncio.Event)  # conversation: connect or decline was asked
    join_by: str = ""  # who asked for the join: "agent" (connect_caller) or "api" (POST .../warm_transfer/join)
    declined_reason: str | None = None  # decline_transfer's reason
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

    def ask_join(self, by: str) -> None:
        """Join the caller and the human now (the briefing agent's ``connect_caller``, the ops API's forced join);
        the transfer's task does it. WarmTransferError when the transfer is not briefing or was asked already."""
        self._ask(by)
        self.join_by = by

    def decline(self, reason: str) -> None:
        """The human won't take the call (``decline_transfer``): the transfer's task ends their leg and gives the
        caller back to their agent, who is told ``reason``."""
        self._ask("agent")
        self.declined_reason = reason.strip()[:200] or "no reason given"

    def _ask(self, by: str) -> None:
        if self.state is not WarmState.BRIEFING:
            raise WarmTransferError(f"warm transfer {self.id} is {self.state.value}, not briefing")
        if self.asked.is_set():
            raise WarmTransferError(f"warm transfer {self.id}: the join or decline was asked already")
        self.asked.set()

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    async def bridged_until_over(self, call_id: str) -> None:
        """While bridged, until this leg ends or the transfer's task has dealt with the other one ending (the legs'
        tasks wait here instead of ending the call; a REFER handoff may outlive the human's BYE of its dialog)."""
        if self.state is not WarmState.BRIDGED:
            return
        gone = self.caller_gone if call_id == self.caller_id else self.human_gone
        waits = [asyncio.ensure_future(gone.wait()), asyncio.ensure_future(self.over.wait())]
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
            briefing=self.briefing,
            declined_reason=self.declined_reason or "",
            handoff=self.handoff,
            handoff_detail=self.handoff_detail,
            started=self.started,
            answered=self.answered,
            bridged=self.bridged,
            ended=self.ended,
        )
