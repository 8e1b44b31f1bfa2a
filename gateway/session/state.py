"""The call session's state machine.

Rules (one table, checked on every change; anything else is a bug and raises InvalidTransitionError)::

    CONNECTING -> ACTIVE      the provider session is configured; caller frames held so far are flushed
    CONNECTING -> ENDING      entry failed or the call was closed while connecting
    ACTIVE     -> RESUMING    provider dropped / fatal error / connection expiring / rotation / profile switch
    ACTIVE     -> ENDING      hang-up (either side), transfer, max duration, unrecoverable error
    RESUMING   -> ACTIVE      a new connection carries the call; held frames are flushed in order
    RESUMING   -> ENDING      reconnect attempts exhausted, or the call was closed meanwhile
    ENDING     -> ENDED       every task cancelled and awaited, provider closed, waiters woken

While CONNECTING or RESUMING, caller frames are held (bounded) and the caller hears silence or a comfort tone.
"""

from __future__ import annotations

from enum import Enum

from gateway.session.errors import InvalidTransitionError


class CallState(Enum):
    CONNECTING = "connecting"
    ACTIVE = "active"
    RESUMING = "resuming"
    ENDING = "ending"
    ENDED = "ended"


TRANSITIONS: dict[CallState, frozenset[CallState]] = {
    CallState.CONNECTING: frozenset({CallState.ACTIVE, CallState.ENDING}),
    CallState.ACTIVE: frozenset({CallState.RESUMING, CallState.ENDING}),
    CallState.RESUMING: frozenset({CallState.ACTIVE, CallState.ENDING}),
    CallState.ENDING: frozenset({CallState.ENDED}),
    CallState.ENDED: frozenset(),
}


def check_transition(old: CallState, new: CallState) -> None:
    """Raise InvalidTransitionError unless ``old -> new`` is in the table."""
    if new not in TRANSITIONS[old]:
        raise InvalidTransitionError(f"call state {old.value} -> {new.value} is not allowed")
