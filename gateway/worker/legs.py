"""Call legs, SIP and browser alike: one state table, one way to begin the end, one registry.

Rules (one table, checked on every change; anything else is a bug and raises :class:`LegStateError`)::

    ADMITTED -> RINGING    outbound: our INVITE is out; browser: the offer is answered, ICE and DTLS to come
    ADMITTED -> ACTIVE     inbound SIP: the 200 OK is out (the session was made before it)
    ADMITTED -> ENDING     refused (488, 503, admission), cancelled or hung up while admission ran
    RINGING  -> ACTIVE     outbound: the callee answered; browser: the connection is up
    RINGING  -> ENDING     no answer, failure, cancelled
    ACTIVE   -> HELD       a re-INVITE or UPDATE put the call on hold (a=sendonly or inactive)
    HELD     -> ACTIVE     a later one took it off hold
    ACTIVE   -> ENDING     either side hung up, the session ended, RTP stopped, a drain deadline, transfer
    HELD     -> ENDING     as from ACTIVE
    ENDING   -> ENDED      the session is closed, media and ports released, the control plane told

A leg is *live* until ENDED. The end begins once (:func:`begin_end`): the first reason wins and the state
moves to ENDING exactly once, so the kind's ``end`` (``SipCalls.end``, ``WebRtcCalls.end``) says goodbye on
the wire in one place. The control plane's commands reach a leg through the :class:`LegRegistry`, whatever
its kind: ``legs.find(call_id).hang_up(reason)``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Literal, Protocol

from gateway.fleet.errors import CallNotFoundError

if TYPE_CHECKING:
    from gateway.fleet.models import CallSnapshot
    from gateway.session.session import CallSession
    from gateway.sip.caller_context import CallContext

LegKind = Literal["sip", "webrtc"]


class LegState(StrEnum):
    """A leg's state; its value is the fleet's name for it (a StrEnum: ``leg.state == "active"`` reads as it says)."""

    ADMITTED = "admitted"
    RINGING = "ringing"
    ACTIVE = "active"
    HELD = "held"
    ENDING = "ending"
    ENDED = "ended"


TRANSITIONS: dict[LegState, frozenset[LegState]] = {
    LegState.ADMITTED: frozenset({LegState.RINGING, LegState.ACTIVE, LegState.ENDING}),
    LegState.RINGING: frozenset({LegState.ACTIVE, LegState.ENDING}),
    LegState.ACTIVE: frozenset({LegState.HELD, LegState.ENDING}),
    LegState.HELD: frozenset({LegState.ACTIVE, LegState.ENDING}),
    LegState.ENDING: frozenset({LegState.ENDED}),
    LegState.ENDED: frozenset(),
}

#: What the fleet's snapshots call each state (held included: GET /v1/calls/{id} shows a held call as such).
SNAPSHOT_STATE: dict[LegState, str] = {state: state.value for state in LegState}


class LegStateError(RuntimeError):
    """A leg was moved along a transition the table does not have: a bug in the worker, never the peer's."""


class Leg(Protocol):
    """A call as the worker's commands and reports see it, SIP or browser."""

    id: str
    kind: LegKind
    state: LegState
    end_reason: str
    cost: float  # of the worker's capacity, in G.711 calls (gateway/worker/settings.py, CapacitySettings)
    context: CallContext | None  # the caller's, once admitted

    @property
    def session(self) -> CallSession | None: ...

    @property
    def live(self) -> bool: ...

    async def snapshot(self) -> CallSnapshot: ...

    def hang_up(self, reason: str) -> None:
        """End the call from our side (the first reason given is the one recorded)."""
        ...

    def send_dtmf(self, digits: str) -> None:
        """Play digits to the caller; CommandRejectedError or LocalMediaError when the call cannot."""
        ...

    def hold(self, held: bool) -> None:
        """Put the caller on hold (hold audio) or take them off it; CommandRejectedError when this call cannot be
        (not answered, held already or by the caller, a hold pending, a browser call)."""
        ...

    def transfer(self, target: str) -> None:
        """Start a blind transfer (the call ends here once the far end takes it); CommandRejectedError when this
        kind of call cannot be transferred."""
        ...


class _Stateful(Protocol):
    id: str
    state: LegState
    end_reason: str


def move(leg: _Stateful, to: LegState) -> None:
    """Move ``leg`` to ``to``; LegStateError unless the table has that transition."""
    if to not in TRANSITIONS[leg.state]:
        raise LegStateError(f"call {leg.id}: {leg.state.value} -> {to.value} is not allowed")
    leg.state = to


def begin_end(leg: _Stateful, reason: str) -> bool:
    """Record ``reason`` unless one was recorded before (the first wins) and move the leg to ENDING; True only the
    first time, when the caller says goodbye on the wire and wakes the call's task."""
    if not leg.end_reason:
        leg.end_reason = reason
    if leg.state in (LegState.ENDING, LegState.ENDED):
        return False
    move(leg, LegState.ENDING)
    return True


class LegRegistry(Mapping[str, "Leg"]):
    """Every leg of one worker by call id, SIP and browser: what the commands, heartbeats and drains walk."""

    def __init__(self) -> None:
        self._legs: dict[str, Leg] = {}

    def __getitem__(self, call_id: str) -> Leg:
        return self._legs[call_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._legs)

    def __len__(self) -> int:
        return len(self._legs)

    def add(self, leg: Leg) -> None:
        self._legs[leg.id] = leg

    def remove(self, leg: Leg) -> None:
        if self._legs.get(leg.id) is leg:
            del self._legs[leg.id]

    def find(self, call_id: str) -> Leg:
        """The live leg ``call_id``; CallNotFoundError when there is none (unknown, or ended)."""
        leg = self._legs.get(call_id)
        if leg is None or not leg.live:
            raise CallNotFoundError(call_id)
        return leg

    def live(self, kind: LegKind | None = None) -> list[Leg]:
        return [leg for leg in self._legs.values() if leg.live and (kind is None or leg.kind == kind)]

    def live_count(self, kind: LegKind | None = None) -> int:
        return sum(1 for leg in self._legs.values() if leg.live and (kind is None or leg.kind == kind))

    def capacity_used(self) -> float:
        """What the live legs take of the worker's capacity."""
        return sum(leg.cost for leg in self._legs.values() if leg.live)
