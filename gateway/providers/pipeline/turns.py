"""Turn-taking of the cascaded pipeline: one table, synchronous, driven by VAD windows, STT results and a clock.

States and rules (PIPELINE.md §4.3; anything not in :data:`TRANSITIONS` raises InvalidTurnTransition)::

    LISTENING     -> USER_SPEAKING  VAD speech for onset_ms while the agent is quiet: SpeechStarted at once
    LISTENING     -> THINKING       the core asks for a response (greeting, after a tool result)
    USER_SPEAKING -> ENDPOINTING    VAD silence for endpoint_ms: ask the STT to finalize
    ENDPOINTING   -> USER_SPEAKING  speech resumes before the endpoint
    ENDPOINTING   -> THINKING       the STT's final text is in (or max_endpoint_ms of silence passed with some
                                    text): SpeechStopped, the user's transcript, start the reply
    ENDPOINTING   -> LISTENING      max_endpoint_ms of silence and no text at all: noise, no reply
    THINKING      -> SPEAKING       the reply's first audio
    THINKING      -> USER_SPEAKING  speech resumes before any agent audio: the reply is cancelled silently
                                    (nothing was heard) and the same user turn goes on
    THINKING      -> LISTENING      the reply ended without audio (a tool call, a failure, a cancel)
    THINKING      -> CONFIRMING     VAD speech while an earlier reply still plays (a reply after a tool result)
    SPEAKING      -> CONFIRMING     VAD speech while the agent speaks: maybe a barge-in, maybe echo or "uh-huh"
    SPEAKING      -> LISTENING      the reply's audio has played out (or it was cancelled)
    SPEAKING      -> THINKING       the core asks for the next reply (after a tool result) while audio plays
    CONFIRMING    -> THINKING       the same, while an onset is being confirmed
    CONFIRMING    -> USER_SPEAKING  min_interrupt_ms of speech, or one STT word that is not a backchannel:
                                    SpeechStarted (the core stops playout and truncates), cancel LLM and TTS
    CONFIRMING    -> SPEAKING       not confirmed within false_interrupt_ms: ignored, the agent never stopped
    CONFIRMING    -> LISTENING      the reply played out while confirming; the speech goes on as a user turn

Inputs are :meth:`TurnTaker.vad`, :meth:`stt_text`, :meth:`stt_final`, :meth:`tick` (timers) and the reply's
progress (:meth:`reply_requested`, :meth:`reply_audio`, :meth:`reply_ended`). Outputs are :class:`TurnAction`
values the session carries out. Times are milliseconds from one monotonic clock, passed in; nothing here reads a
clock or awaits.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal


class TurnState(Enum):
    LISTENING = "listening"
    USER_SPEAKING = "user_speaking"
    ENDPOINTING = "endpointing"
    THINKING = "thinking"
    SPEAKING = "speaking"
    CONFIRMING = "confirming"


S = TurnState
TRANSITIONS: dict[TurnState, frozenset[TurnState]] = {
    S.LISTENING: frozenset({S.USER_SPEAKING, S.THINKING}),
    S.USER_SPEAKING: frozenset({S.ENDPOINTING}),
    S.ENDPOINTING: frozenset({S.USER_SPEAKING, S.THINKING, S.LISTENING}),
    S.THINKING: frozenset({S.SPEAKING, S.USER_SPEAKING, S.LISTENING, S.CONFIRMING}),
    S.SPEAKING: frozenset({S.CONFIRMING, S.LISTENING, S.THINKING}),
    S.CONFIRMING: frozenset({S.USER_SPEAKING, S.SPEAKING, S.LISTENING, S.THINKING}),
}

# Short acknowledgements a caller says while listening; alone they never interrupt the agent.
BACKCHANNELS = frozenset(
    [
        "yeah",
        "yes",
        "yep",
        "ok",
        "okay",
        "uh-huh",
        "uhhuh",
        "mhm",
        "mm",
        "hmm",
        "mm-hmm",
        "right",
        "sure",
        "aha",
        "ah",
        "oh",
        "uh",
        "um",
        "huh",
        "alright",
    ]
)


class InvalidTurnTransition(RuntimeError):
    """The pipeline tried a turn change the table does not allow: a bug, never the caller's doing."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnOptions:
    """Turn-taking knobs (LiveKit's names where they exist). All in milliseconds."""

    onset_ms: int = 60  # VAD speech before a caller turn starts
    endpoint_ms: int = 500  # VAD silence that ends a caller turn (with the STT's final text)
    max_endpoint_ms: int = 3000  # the longest an endpoint waits for the STT after the caller went quiet
    min_interrupt_ms: int = 400  # caller speech over the agent that counts as a barge-in
    false_interrupt_ms: int = 1500  # an unconfirmed onset over the agent is ignored after this

    def __post_init__(self) -> None:
        if not 0 < self.endpoint_ms <= self.max_endpoint_ms:
            raise ValueError("0 < endpoint_ms <= max_endpoint_ms is required")
        if self.onset_ms < 0 or self.min_interrupt_ms < 0 or self.false_interrupt_ms <= 0:
            raise ValueError("onset_ms, min_interrupt_ms >= 0 and false_interrupt_ms > 0 are required")


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnAction:
    """What the session must do. ``kind``:

    * ``speech_started``: emit SpeechStarted for a new user item (``barge_in`` True: cancel the reply first);
    * ``finalize``: ask the STT to decide the current utterance now;
    * ``endpoint``: emit SpeechStopped and the user's final ``text``, then start a reply;
    * ``cancel_reply``: stop the reply silently (caller resumed before any agent audio);
    * ``discard``: the turn had no words: emit SpeechStopped only.
    """

    kind: Literal["speech_started", "finalize", "endpoint", "cancel_reply", "discard"]
    at_ms: int
    text: str = ""
    barge_in: bool = False


class TurnTaker:
    def __init__(self, options: TurnOptions | None = None) -> None:
        self.options = options or TurnOptions()
        self.state = TurnState.LISTENING
        self._speech_ms = 0  # consecutive VAD speech
        self._silence_ms = 0  # consecutive VAD silence
        self._speaking = False  # the VAD's current verdict after onset
        self._onset_at = 0
        self._silence_since: int | None = None
        self._finalized = False
        self._final_text: list[str] = []  # finals of the current caller turn
        self._partial = ""
        self._final_pending = False  # a finalize was asked and its final not yet seen
        self._playout_ends_at: int | None = None
        self._answered = ""  # the text of the turn being answered, until the answer is heard
        self.changes = 0

    # ------------------------------------------------------------------------------------ inputs

    def vad(self, speech: bool, window_ms: int, now_ms: int) -> list[TurnAction]:
        """One VAD window of caller audio, ending at ``now_ms``."""
        if speech:
            self._speech_ms += window_ms
            self._silence_ms = 0
        else:
            self._silence_ms += window_ms
            self._speech_ms = 0
        actions: list[TurnAction] = []
        state = self.state
        onset = speech and self._speech_ms >= self.options.onset_ms
        if onset and not self._speaking:
            self._speaking = True
            self._onset_at = now_ms - self._speech_ms
            self._silence_since = None
            if state is S.LISTENING:
                self._start_user_turn(now_ms, actions, barge_in=False)
            elif state is S.ENDPOINTING:
                self._go(S.USER_SPEAKING)
            elif state is S.THINKING and self._playout_ends_at is not None and now_ms < self._playout_ends_at:
                self._go(S.CONFIRMING)  # the previous reply is still playing: as over any agent speech
                self._reset_text()
            elif state is S.THINKING:
                self._go(S.USER_SPEAKING)
                self._finalized = False
                self._final_text = [self._answered] if self._answered else []  # the same turn goes on
                actions.append(TurnAction(kind="cancel_reply", at_ms=now_ms))
            elif state is S.SPEAKING:
                self._go(S.CONFIRMING)
                self._reset_text()
        elif not speech and self._speaking and self._silence_ms >= min(self.options.endpoint_ms, 200):
            self._speaking = False
            self._silence_since = now_ms - self._silence_ms
        confirming = state is S.CONFIRMING and self.state is S.CONFIRMING and self._speaking
        if confirming and now_ms - self._onset_at >= self.options.min_interrupt_ms:
            self._confirm(now_ms, actions)
        actions += self.tick(now_ms)
        return actions

    def stt_text(self, text: str, now_ms: int) -> list[TurnAction]:
        """Interim text of the caller's current utterance."""
        self._partial = text
        actions: list[TurnAction] = []
        if self.state is S.CONFIRMING and _real_words(text):
            self._confirm(now_ms, actions)
        return actions

    def stt_final(self, text: str, now_ms: int) -> list[TurnAction]:
        """Final text of a stretch of the caller's speech."""
        self._partial = ""
        if text.strip():
            self._final_text.append(text.strip())
        self._final_pending = False
        actions: list[TurnAction] = []
        if self.state is S.CONFIRMING and _real_words(text):
            self._confirm(now_ms, actions)
        actions += self.tick(now_ms)
        return actions

    def tick(self, now_ms: int) -> list[TurnAction]:
        """Timers: endpointing, its cap, the confirmation window, the end of agent playout."""
        actions: list[TurnAction] = []
        state = self.state
        if state is S.USER_SPEAKING and not self._speaking and self._silence_since is not None:
            self._go(S.ENDPOINTING)
            state = self.state
        if state is S.ENDPOINTING and self._silence_since is not None:
            silent = now_ms - self._silence_since
            if silent >= self.options.endpoint_ms and not self._finalized:
                self._finalized = True
                self._final_pending = True
                actions.append(TurnAction(kind="finalize", at_ms=now_ms))
            text = self.user_text
            if silent >= self.options.endpoint_ms and self._finalized and not self._final_pending and text:
                self._end_user_turn(now_ms, text, actions)
            elif silent >= self.options.max_endpoint_ms:
                if text:
                    self._end_user_turn(now_ms, text, actions)
                else:
                    self._go(S.LISTENING)
                    self._reset_text()
                    actions.append(TurnAction(kind="discard", at_ms=now_ms))
        elif state is S.CONFIRMING and now_ms - self._onset_at >= self.options.false_interrupt_ms:
            self._go(S.SPEAKING)
            self._reset_text()
        ends = self._playout_ends_at
        if self.state in (S.SPEAKING, S.CONFIRMING) and ends is not None and now_ms >= ends:
            self._reply_over(now_ms, actions)
        return actions

    def next_deadline(self) -> int | None:
        """When :meth:`tick` next has something to decide (None: only new input can change anything)."""
        deadlines: list[int] = []
        if self.state in (S.USER_SPEAKING, S.ENDPOINTING) and self._silence_since is not None:
            if not self._finalized:  # once finalized, only the final text or the cap can end the turn
                deadlines.append(self._silence_since + self.options.endpoint_ms)
            deadlines.append(self._silence_since + self.options.max_endpoint_ms)
        if self.state is S.CONFIRMING:
            deadlines.append(self._onset_at + self.options.false_interrupt_ms)
        if self.state in (S.SPEAKING, S.CONFIRMING) and self._playout_ends_at is not None:
            deadlines.append(self._playout_ends_at)
        return min(deadlines) if deadlines else None

    # ----------------------------------------------------------------------------- the reply side

    def reply_requested(self, now_ms: int) -> bool:
        """The core asked for a reply (greeting, after a tool result, DTMF); True when it may start now. While the
        caller holds the floor it waits: the endpoint starts a reply with everything in the history."""
        if self.state in (S.USER_SPEAKING, S.ENDPOINTING):
            return False
        if self.state is not S.THINKING:
            self._go(S.THINKING)
        return True

    def reply_audio(self, chunk_ms: int, now_ms: int) -> None:
        """``chunk_ms`` of reply audio went to the core. Its playout is modelled as starting at once and running
        in real time, pausing when starved: it ends at max(previous end, now) + chunk_ms."""
        if self.state is S.THINKING:
            self._go(S.SPEAKING)
            self._answered = ""
        if self.state in (S.SPEAKING, S.CONFIRMING):
            self._playout_ends_at = max(self._playout_ends_at or now_ms, now_ms) + chunk_ms

    def reply_ended(self, now_ms: int, *, cancelled: bool) -> list[TurnAction]:
        """The reply produced all its audio (its playout may go on) or it was cancelled."""
        actions: list[TurnAction] = []
        if self.state is S.THINKING:
            self._go(S.LISTENING)
        elif self.state in (S.SPEAKING, S.CONFIRMING) and (cancelled or self._playout_ends_at is None):
            self._reply_over(now_ms, actions)
        return actions

    @property
    def user_text(self) -> str:
        parts = [*self._final_text, self._partial.strip()]
        return " ".join(p for p in parts if p)

    @property
    def agent_turn(self) -> bool:
        return self.state in (S.THINKING, S.SPEAKING, S.CONFIRMING)

    # ------------------------------------------------------------------------------- internals

    def _start_user_turn(self, now_ms: int, actions: list[TurnAction], *, barge_in: bool) -> None:
        self._go(S.USER_SPEAKING)
        self._finalized = False
        if not barge_in:
            self._reset_text()
        actions.append(TurnAction(kind="speech_started", at_ms=self._onset_at, barge_in=barge_in))

    def _confirm(self, now_ms: int, actions: list[TurnAction]) -> None:
        self._playout_ends_at = None
        self._start_user_turn(now_ms, actions, barge_in=True)
        if not self._speaking:  # confirmed by words after the VAD already went quiet
            self._silence_since = now_ms

    def _end_user_turn(self, now_ms: int, text: str, actions: list[TurnAction]) -> None:
        self._go(S.THINKING)
        self._reset_text()
        self._answered = text
        self._finalized = False
        self._silence_since = None
        actions.append(TurnAction(kind="endpoint", at_ms=now_ms, text=text))

    def _reply_over(self, now_ms: int, actions: list[TurnAction]) -> None:
        self._playout_ends_at = None
        if self.state is S.CONFIRMING:
            # The agent finished while the caller was talking over it: that speech is now the caller's turn.
            self._start_user_turn(now_ms, actions, barge_in=False)
            if not self._speaking:
                self._silence_since = now_ms
            return
        self._go(S.LISTENING)

    def _reset_text(self) -> None:
        self._final_text = []
        self._partial = ""
        self._final_pending = False

    def _go(self, new: TurnState) -> None:
        if new not in TRANSITIONS[self.state]:
            raise InvalidTurnTransition(f"turn state {self.state.value} -> {new.value} is not allowed")
        self.state = new
        self.changes += 1


def _real_words(text: str) -> bool:
    """At least one word that is not a backchannel."""
    words = [w.strip(".,!?;:").lower() for w in text.split()]
    return any(w and w not in BACKCHANNELS for w in words)
