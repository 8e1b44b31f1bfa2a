"""The greeting's words in answering-machine detection (gateway/media/amd_words.py): what a text says on its own,
and how the combiner turns a timing verdict and the words into the final verdict, within its hold."""

from __future__ import annotations

import pytest

from gateway.media.amd import AmdDecided, AmdResult
from gateway.media.amd_words import AmdCombiner, WordsConfig, judge_words, normalise

DT = 0.02


def timing(result: AmdResult, reason: str, at_s: float = 2.0) -> AmdDecided:
    return AmdDecided(result=result, reason=reason, at_s=at_s, words=4, speech_s=1.0)


@pytest.mark.parametrize(
    ("text", "result", "phrase"),
    [
        ("Hi, you've reached Alex. Please leave a message after the tone.", AmdResult.MACHINE, "leave a message"),
        ("The person you are calling is NOT available.", AmdResult.MACHINE, "not available"),
        ("Sorry, I can't take your call right now", AmdResult.MACHINE, "cant take your call"),
        ("Welcome to the voicemail of extension 241", AmdResult.MACHINE, "voicemail"),
        ("Bitte hinterlassen Sie eine Nachricht nach dem Signalton", AmdResult.MACHINE, "hinterlassen sie"),
        ("Laissez un message après le bip", AmdResult.MACHINE, "laissez un message"),
        ("Hello?", AmdResult.HUMAN, "hello"),
        ("Yes, speaking.", AmdResult.HUMAN, "yes speaking"),
        ("Yeah, hello, who is this?", AmdResult.HUMAN, "yeah hello who is this"),
    ],
)
def test_judged_words(text: str, result: AmdResult, phrase: str) -> None:
    judged = judge_words(text)
    assert (judged.result, judged.phrase) == (result, phrase)


@pytest.mark.parametrize(
    "text", ["", "Thank you for calling Riverside Dental, our hours are nine to five", "Good grief this is a long one"]
)
def test_words_that_say_nothing(text: str) -> None:
    assert judge_words(text).result is None


def test_phrases_match_whole_words_only() -> None:
    assert normalise("Don’t LEAVE—a message!") == "dont leave a message"
    assert judge_words("the mailboxes are full").result is None  # "mailbox" is a word, not a prefix
    assert judge_words("mailbox").result is AmdResult.MACHINE


def test_a_beep_or_a_fax_tone_is_final_at_once() -> None:
    for decided in (timing(AmdResult.MACHINE, "beep"), timing(AmdResult.FAX, "fax_tone")):
        combiner = AmdCombiner()
        verdict = combiner.timing(decided)
        assert verdict is not None and (verdict.result, verdict.reason) == (decided.result, decided.reason)
        assert combiner.words("hello?", at_s=2.1) is None, "nothing changes a final verdict"


def test_a_machine_phrase_decides_before_the_timing_rules() -> None:
    combiner = AmdCombiner()
    verdict = combiner.words("You have reached the voicemail of Sam", at_s=1.4)
    assert verdict is not None and (verdict.result, verdict.reason, verdict.at_s) == (
        AmdResult.MACHINE,
        "words_machine",
        1.4,
    )
    assert verdict.timing is None and verdict.words == "You have reached the voicemail of Sam"
    assert combiner.timing(timing(AmdResult.HUMAN, "short_greeting")) is None


def test_a_short_hello_overturns_the_many_words_rule() -> None:
    combiner = AmdCombiner()
    assert combiner.timing(timing(AmdResult.MACHINE, "many_words", at_s=1.0)) is None, "held for the words"
    assert combiner.audio(voiced=False, dt=DT) is None
    verdict = combiner.words("Yeah, hello?", at_s=1.3)
    assert verdict is not None and (verdict.result, verdict.reason) == (AmdResult.HUMAN, "words_human")


def test_human_words_heard_first_then_a_machine_timing_verdict() -> None:
    combiner = AmdCombiner()
    assert combiner.words("Hello?", at_s=0.9) is None
    verdict = combiner.timing(timing(AmdResult.MACHINE, "many_words", at_s=1.0))
    assert verdict is not None and verdict.result is AmdResult.HUMAN


def test_hi_a_pause_then_a_recording_is_a_machine() -> None:
    """The timing rules' blind spot: "Hi!" then a pause reads as a person waiting; the recording goes on."""
    combiner = AmdCombiner(WordsConfig(human_hold_s=0.8, resumed_speech_s=0.4))
    assert combiner.timing(timing(AmdResult.HUMAN, "short_greeting", at_s=1.5)) is None
    assert combiner.words("Hi!", at_s=1.6) is None, "a lone 'hi' does not end the hold"
    verdicts = [combiner.audio(voiced=True, dt=DT) for _ in range(25)]
    decided = [v for v in verdicts if v is not None]
    assert len(decided) == 1 and (decided[0].result, decided[0].reason) == (AmdResult.MACHINE, "speech_went_on")
    assert decided[0].at_s == pytest.approx(1.6 + 0.4, abs=DT)


def test_a_person_who_waits_is_greeted_when_the_hold_ends() -> None:
    combiner = AmdCombiner(WordsConfig(human_hold_s=0.8))
    assert combiner.timing(timing(AmdResult.HUMAN, "short_greeting", at_s=1.5)) is None
    assert combiner.words("Hello?", at_s=1.7) is None
    verdicts = [combiner.audio(voiced=False, dt=DT) for _ in range(50)]
    decided = [(i, v) for i, v in enumerate(verdicts) if v is not None]
    assert len(decided) == 1
    index, verdict = decided[0]
    assert (verdict.result, verdict.reason) == (AmdResult.HUMAN, "short_greeting")
    assert verdict.at_s == pytest.approx(2.3, abs=DT) and index < 40


@pytest.mark.parametrize(("result", "reason"), [(AmdResult.MACHINE, "long_greeting"), (AmdResult.UNKNOWN, "timeout")])
def test_words_that_never_come_cannot_stall_the_call(result: AmdResult, reason: str) -> None:
    combiner = AmdCombiner(WordsConfig(words_wait_s=1.5))
    assert combiner.timing(timing(result, reason, at_s=2.0)) is None
    frames = 0
    while combiner.verdict is None:
        combiner.audio(voiced=False, dt=DT)
        frames += 1
        assert frames <= 76, "the hold is bounded"
    assert (combiner.verdict.result, combiner.verdict.reason) == (result, reason)
    assert combiner.verdict.at_s == pytest.approx(3.5, abs=DT)
    assert combiner.words("please leave a message", at_s=4.0) is None, "late words change nothing"


def test_a_recording_that_keeps_talking_is_not_made_human_by_its_opening() -> None:
    combiner = AmdCombiner()
    assert combiner.timing(timing(AmdResult.MACHINE, "long_greeting", at_s=1.6)) is None
    for _ in range(25):  # half a second more of it
        combiner.audio(voiced=True, dt=DT)
    assert combiner.words("Hi, it's me", at_s=2.1) is None, "the greeting went on after its first words"
    assert combiner.words("Leave a message", at_s=2.4) is not None
    assert combiner.verdict is not None and combiner.verdict.result is AmdResult.MACHINE


def test_bad_configs_are_refused() -> None:
    with pytest.raises(ValueError):
        WordsConfig(words_wait_s=0)
    with pytest.raises(ValueError):
        WordsConfig(human_hold_s=11)


def test_hi_then_a_recording_before_the_timing_verdict_stays_a_machine() -> None:
    """ "Hi!" is recognised first, then the recording talks on and the timing rules say many_words: the "hi"
    was not the whole greeting, so it overturns nothing."""
    combiner = AmdCombiner()
    for _ in range(60):
        combiner.audio(voiced=False, dt=DT)
    assert combiner.words("Hi!", at_s=1.2) is None
    for _ in range(40):
        assert combiner.audio(voiced=True, dt=DT) is None
    assert combiner.timing(timing(AmdResult.MACHINE, "many_words", at_s=2.0)) is None
    while combiner.verdict is None:
        combiner.audio(voiced=True, dt=DT)
    assert (combiner.verdict.result, combiner.verdict.reason) == (AmdResult.MACHINE, "many_words")
