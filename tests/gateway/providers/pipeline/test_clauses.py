"""Clause splitting of streamed text and the words the caller heard of an item."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.providers.pipeline.clauses import ClauseSplitter
from gateway.providers.pipeline.ports import Word
from gateway.providers.pipeline.words import ItemSpeech, estimate_words, heard_prefix


def test_sentences_go_out_as_they_end_and_numbers_and_initials_do_not_break() -> None:
    splitter = ClauseSplitter()
    out: list[str] = []
    for token in ["Your", " total", " is", " 3.5", " dollars.", " J.", " Smith", " will", " call!", " Ok"]:
        out += splitter.feed(token)
    assert out == ["Your total is 3.5 dollars.", " J. Smith will call!"]
    assert splitter.flush() == " Ok"


def test_a_long_comma_clause_breaks_but_a_short_one_waits() -> None:
    splitter = ClauseSplitter(min_comma_chars=20)
    assert splitter.feed("Okay, sure") == []
    assert splitter.feed(" thing, and then a long clause follows, right") == [
        "Okay, sure thing, and then a long clause follows, "
    ]


@given(st.lists(st.text(alphabet="ab .,?!3\n", max_size=12), max_size=30))
def test_the_clauses_concatenate_to_exactly_the_text_fed(tokens: list[str]) -> None:
    splitter = ClauseSplitter(max_chars=40)
    out = [clause for token in tokens for clause in splitter.feed(token)]
    assert "".join(out) + splitter.flush() == "".join(tokens)


def test_a_word_counts_once_its_start_played() -> None:
    text = "One two three"
    words = [
        Word(text="One", start_ms=0, end_ms=200, char_start=0, char_end=3),
        Word(text="two", start_ms=250, end_ms=450, char_start=4, char_end=7),
        Word(text="three", start_ms=500, end_ms=800, char_start=8, char_end=13),
    ]
    assert heard_prefix(text, words, 0) == ""
    assert heard_prefix(text, words, 1) == "One"
    assert heard_prefix(text, words, 250) == "One"
    assert heard_prefix(text, words, 251) == "One two"
    assert heard_prefix(text, words, 10_000) == "One two three"


def test_a_reply_heard_to_its_last_word_keeps_its_closing_punctuation() -> None:
    text = "I heard four, five. Goodbye!"
    words = estimate_words(text, char_offset=0, start_ms=0, duration_ms=1000)
    assert heard_prefix(text, words, 10_000) == text
    assert heard_prefix(text, words, words[1].start_ms + 1) == "I heard"
    assert heard_prefix(text, words, words[-1].start_ms) == "I heard four, five."


def test_words_are_placed_after_the_audio_of_earlier_streams_never_reset_per_sentence() -> None:
    speech = ItemSpeech(item_id="i")
    speech.begin_segment(char_base=0, timestamps=True)
    speech.pushed("Hello there. ")
    speech.words_reported([Word(text="Hello", start_ms=0, end_ms=300, char_start=0, char_end=5)])
    speech.words_reported([Word(text="there.", start_ms=350, end_ms=700, char_start=6, char_end=12)])
    speech.audio(48 * 800)
    # The stream failed; a new one speaks the rest from the last word fully delivered, timed from 0 again.
    speech.begin_segment(char_base=speech.resume_point(), timestamps=True)
    speech.pushed("How are you?")
    speech.words_reported([Word(text="How", start_ms=0, end_ms=200, char_start=1, char_end=4)])
    speech.audio(48 * 400)
    # "are you?" has no timing yet: it is placed after "How" at a standard speaking rate, and flagged.
    assert [(w.text, w.start_ms) for w in speech.words()] == [
        ("Hello", 0),
        ("there.", 350),
        ("How", 800),
        ("are", 1000),
        ("you?", 1253),
    ]
    assert speech.heard(801) == "Hello there. How" and speech.estimated
    speech.words_reported([Word(text="are", start_ms=250, end_ms=400, char_start=5, char_end=8)])
    speech.words_reported([Word(text="you?", start_ms=450, end_ms=700, char_start=9, char_end=13)])
    assert not speech.estimated and speech.heard(1251) == "Hello there. How are you?"


def test_the_estimate_spreads_words_over_the_audio_by_characters() -> None:
    words = estimate_words("aa bbbb", char_offset=10, start_ms=1000, duration_ms=800)
    assert [(w.text, w.start_ms, w.end_ms, w.char_start) for w in words] == [
        ("aa", 1000, 1300, 10),
        ("bbbb", 1300, 1800, 13),
    ]
