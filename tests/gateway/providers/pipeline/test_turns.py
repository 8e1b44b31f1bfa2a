"""The pipeline's turn table, driven synchronously with a fake clock (20 ms VAD windows)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.providers.pipeline.turns import TRANSITIONS, TurnAction, TurnOptions, TurnState, TurnTaker

S = TurnState
OPTIONS = TurnOptions(onset_ms=60, endpoint_ms=300, max_endpoint_ms=1500, min_interrupt_ms=400, false_interrupt_ms=1200)


class Clock:
    def __init__(self, turns: TurnTaker) -> None:
        self.turns = turns
        self.now = 0
        self.actions: list[TurnAction] = []

    def audio(self, ms: int, *, speech: bool) -> None:
        for _ in range(ms // 20):
            self.now += 20
            self.actions += self.turns.vad(speech, 20, self.now)

    def final(self, text: str) -> None:
        self.actions += self.turns.stt_final(text, self.now)

    def partial(self, text: str) -> None:
        self.actions += self.turns.stt_text(text, self.now)

    def kinds(self) -> list[str]:
        return [a.kind for a in self.actions]


def test_a_caller_turn_ends_at_vad_silence_plus_the_final_text() -> None:
    clock = Clock(TurnTaker(OPTIONS))
    clock.audio(400, speech=True)
    assert clock.kinds() == ["speech_started"] and clock.actions[0].at_ms == 0
    clock.audio(300, speech=False)
    assert clock.turns.state is S.ENDPOINTING and clock.kinds()[-1] == "finalize"
    clock.audio(100, speech=False)
    assert clock.turns.state is S.ENDPOINTING  # silence alone is not an endpoint: the final text is missing
    clock.final("what is my order status")
    assert clock.actions[-1] == TurnAction(kind="endpoint", at_ms=800, text="what is my order status")
    assert clock.turns.state is S.THINKING


def test_the_endpoint_cap_answers_with_the_text_so_far_or_discards_noise() -> None:
    clock = Clock(TurnTaker(OPTIONS))
    clock.audio(200, speech=True)
    clock.partial("cancel my")
    clock.audio(1600, speech=False)
    assert clock.actions[-1].kind == "endpoint" and clock.actions[-1].text == "cancel my"
    noise = Clock(TurnTaker(OPTIONS))
    noise.audio(200, speech=True)
    noise.audio(1600, speech=False)
    assert noise.kinds() == ["speech_started", "finalize", "discard"] and noise.turns.state is S.LISTENING


def test_speech_resuming_before_agent_audio_cancels_silently_and_keeps_the_turn_text() -> None:
    clock = Clock(TurnTaker(OPTIONS))
    clock.audio(300, speech=True)
    clock.audio(300, speech=False)
    clock.final("I want to")
    assert clock.turns.state is S.THINKING
    clock.audio(200, speech=True)
    assert clock.kinds()[-1] == "cancel_reply" and clock.turns.state is S.USER_SPEAKING
    clock.audio(300, speech=False)
    clock.final("change my address")
    assert clock.actions[-1].text == "I want to change my address"


def _speaking(clock: Clock) -> None:
    clock.audio(300, speech=True)
    clock.audio(300, speech=False)
    clock.final("hello")
    clock.turns.reply_audio(5000, clock.now)
    assert clock.turns.state is S.SPEAKING
    clock.actions.clear()


def test_a_barge_in_is_confirmed_by_min_interrupt_ms_of_speech() -> None:
    clock = Clock(TurnTaker(OPTIONS))
    _speaking(clock)
    clock.audio(380, speech=True)
    assert clock.turns.state is S.CONFIRMING and clock.kinds() == []
    clock.audio(100, speech=True)
    assert clock.kinds() == ["speech_started"] and clock.actions[0].barge_in
    assert clock.turns.state is S.USER_SPEAKING


def test_a_real_word_confirms_at_once_but_a_backchannel_never_does() -> None:
    clock = Clock(TurnTaker(OPTIONS))
    _speaking(clock)
    clock.audio(100, speech=True)
    clock.partial("uh-huh")
    clock.audio(100, speech=False)
    assert clock.turns.state is S.CONFIRMING
    clock.audio(1200, speech=False)
    assert clock.turns.state is S.SPEAKING and clock.kinds() == []  # ignored: the agent never stopped
    clock.audio(100, speech=True)
    clock.partial("wait")
    assert clock.kinds() == ["speech_started"] and clock.turns.state is S.USER_SPEAKING


def test_agent_playout_ends_on_the_clock() -> None:
    clock = Clock(TurnTaker(OPTIONS))
    clock.audio(300, speech=True)
    clock.audio(300, speech=False)
    clock.final("hi")
    clock.turns.reply_audio(1000, clock.now)
    assert clock.turns.reply_ended(clock.now, cancelled=False) == []
    assert clock.turns.next_deadline() == clock.now + 1000
    clock.audio(1000, speech=False)
    assert clock.turns.state is S.LISTENING


EVENTS = st.one_of(
    st.tuples(st.just("vad"), st.booleans(), st.integers(min_value=1, max_value=30)),
    st.tuples(st.just("final"), st.sampled_from(["", "yeah", "stop that", "hello there"])),
    st.tuples(st.just("partial"), st.sampled_from(["", "mhm", "wait"])),
    st.tuples(
        st.just("request"),
    ),
    st.tuples(st.just("audio"), st.integers(min_value=20, max_value=2000)),
    st.tuples(st.just("ended"), st.booleans()),
    st.tuples(st.just("tick"), st.integers(min_value=0, max_value=3000)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(EVENTS, max_size=60))
def test_any_sequence_of_inputs_stays_inside_the_table(events: list[tuple[object, ...]]) -> None:
    turns = TurnTaker(OPTIONS)
    now = 0
    for event in events:
        before = turns.state
        kind = event[0]
        if kind == "vad":
            for _ in range(int(event[2])):  # type: ignore[call-overload]
                now += 20
                turns.vad(bool(event[1]), 20, now)
        elif kind == "final":
            turns.stt_final(str(event[1]), now)
        elif kind == "partial":
            turns.stt_text(str(event[1]), now)
        elif kind == "request":
            turns.reply_requested(now)
        elif kind == "audio":
            turns.reply_audio(int(event[1]), now)  # type: ignore[call-overload]
        elif kind == "ended":
            turns.reply_ended(now, cancelled=bool(event[1]))
        else:
            now += int(event[1])  # type: ignore[call-overload]
            turns.tick(now)
        assert turns.state is before or turns.state in TRANSITIONS[before] or turns.changes > 0
        turns.tick(now)
        deadline = turns.next_deadline()
        # Never a deadline already passed: the session's timer would spin on it.
        assert deadline is None or deadline > now
        if turns.state is S.LISTENING:
            assert turns.next_deadline() is None
