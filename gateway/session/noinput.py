"""Caller no-input: after ``prompt_s`` of caller silence while the agent waits, the agent checks on the caller;
after ``hangup_s`` more, it says goodbye and the call ends with reason ``no_input``.

Sans-I/O: the session feeds :meth:`NoInputTimer.tick` once per media tick with its clock and whether the agent is
*waiting* (nobody speaks, no response runs or is about to, no tool runs, the call is not on hold), and
:meth:`NoInputTimer.caller_spoke` when the caller speaks or presses a key; the timer answers with the action due.

The silence clock runs only while the agent waits: the agent speaking (its prompt included), a tool running or a
hold stops it, and it starts from zero the next time the agent waits, so only silence the caller owes counts.

Rules (one table, keyed on (state, input); anything else keeps the state)::

    LISTENING + silence_elapsed -> PROMPTED   action "prompt"   (after prompt_s)
    PROMPTED  + silence_elapsed -> DONE       action "goodbye"  (after hangup_s)
    LISTENING + caller_spoke    -> LISTENING
    PROMPTED  + caller_spoke    -> LISTENING  (the caller answered: a fresh start)
    DONE      + anything        -> DONE       (the call is ending)

With ``prompt_s`` 0 there is no prompt: LISTENING's silence leads to "goodbye" after ``hangup_s``; with
``hangup_s`` 0 the call is never ended for silence (PROMPTED waits for the caller). Both 0: off.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal

NoInputAction = Literal["prompt", "goodbye"]


class NoInputError(ValueError):
    """A no-input policy that cannot work (a negative time)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NoInputPolicy:
    prompt_s: float = 0.0
    hangup_s: float = 0.0

    def __post_init__(self) -> None:
        if self.prompt_s < 0 or self.hangup_s < 0:
            raise NoInputError(f"no-input times must be >= 0, got prompt {self.prompt_s}, hangup {self.hangup_s}")

    @property
    def enabled(self) -> bool:
        return self.prompt_s > 0 or self.hangup_s > 0


class NoInputState(Enum):
    LISTENING = "listening"
    PROMPTED = "prompted"
    DONE = "done"


Input = Literal["silence_elapsed", "caller_spoke"]

TABLE: dict[tuple[NoInputState, Input], tuple[NoInputState, NoInputAction | None]] = {
    (NoInputState.LISTENING, "silence_elapsed"): (NoInputState.PROMPTED, "prompt"),
    (NoInputState.PROMPTED, "silence_elapsed"): (NoInputState.DONE, "goodbye"),
    (NoInputState.LISTENING, "caller_spoke"): (NoInputState.LISTENING, None),
    (NoInputState.PROMPTED, "caller_spoke"): (NoInputState.LISTENING, None),
}


class NoInputTimer:
    """One call's no-input clock. Synchronous and O(1) a tick."""

    def __init__(self, policy: NoInputPolicy) -> None:
        self.policy = policy
        # Without a prompt the first silence leads to the goodbye: start as if prompted already.
        self.state = NoInputState.LISTENING if policy.prompt_s > 0 else NoInputState.PROMPTED
        self._first = self.state
        self.waiting_since: float | None = None

    def _limit(self) -> float:
        """The silence the current state allows; 0: none ends it (no hang-up configured)."""
        if self.state is NoInputState.LISTENING:
            return self.policy.prompt_s
        if self.state is NoInputState.PROMPTED:
            return self.policy.hangup_s
        return 0.0

    def next_deadline(self) -> float | None:
        limit = self._limit()
        if self.waiting_since is None or limit <= 0:
            return None
        return self.waiting_since + limit

    def tick(self, now: float, *, waiting: bool) -> NoInputAction | None:
        """The action due now, if any. ``waiting``: the agent waits for the caller (see the module docstring)."""
        if not waiting or self.state is NoInputState.DONE:
            self.waiting_since = None
            return None
        if self.waiting_since is None:
            self.waiting_since = now
        deadline = self.next_deadline()
        if deadline is None or now < deadline:
            return None
        return self._feed("silence_elapsed")

    def caller_spoke(self) -> None:
        self._feed("caller_spoke")

    def _feed(self, event: Input) -> NoInputAction | None:
        entry = TABLE.get((self.state, event))
        if entry is None:
            return None
        state, action = entry
        if event == "caller_spoke":
            state = self._first
        self.state = state
        self.waiting_since = None
        return action
