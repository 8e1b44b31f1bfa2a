"""The built-in guardrail checks and the debounce: pure, over text."""

from __future__ import annotations

import pytest

from gateway.session.errors import SessionConfigError
from gateway.session.guardrail_checks import BlockedTerms, Debounce, PiiCheck, digit_runs, luhn_valid, ssn_valid


def test_blocked_phrases_match_whole_words_case_and_spacing_insensitively() -> None:
    blocked = BlockedTerms(phrases=["free money", "acme"])
    verdict = blocked.check("Well, you get FREE\n  money today.")
    assert verdict is not None and verdict.reason == "blocked phrase 'free money'" and verdict.start == 14
    assert blocked.check("acmeology is a word; freemoney is not a match") is None
    hit = blocked.check("Call Acme now")
    assert hit is not None and hit.start == 5


def test_blocked_patterns_and_the_earliest_match_wins() -> None:
    blocked = BlockedTerms(phrases=["later"], patterns=[r"\bguarantee(d)?\b"])
    verdict = blocked.check("It is guaranteed, more later")
    assert verdict is not None and verdict.reason == "blocked pattern #1" and verdict.start == 6


@pytest.mark.parametrize(
    ("phrases", "patterns", "message"),
    [
        ([], [], "at least one phrase or pattern"),
        (["  "], [], "must not be empty"),
        ([], ["(unclosed"], "not a valid regular expression"),
        ([], ["x*"], "matches the empty text"),
    ],
)
def test_bad_blocked_terms_are_refused_when_built(phrases: list[str], patterns: list[str], message: str) -> None:
    with pytest.raises(SessionConfigError, match=message):
        BlockedTerms(phrases=phrases, patterns=patterns)


def test_luhn_and_ssn_rules() -> None:
    assert luhn_valid("4111111111111111") and not luhn_valid("4111111111111112")
    assert ssn_valid("123456789")
    assert not any(ssn_valid(s) for s in ("000456789", "666456789", "923456789", "123006789", "123450000"))


def test_digits_written_or_spoken_join_into_one_number() -> None:
    assert digit_runs("my card is 4111-1111 1111.1111 ok") == [("4111111111111111", 11)]
    assert digit_runs("four one one one, one one one one dash one") == [("411111111", 0)]
    assert digit_runs("double oh seven") == [("007", 0)]
    assert digit_runs("I have 3 apples and 4 pears") == [("3", 7), ("4", 20)]


@pytest.mark.parametrize(
    "text",
    [
        "Your card number is 4111 1111 1111 1111.",
        "That is four one one one one one one one one one one one one one one one.",
        "The number on file: 5500-0000-0000-0004, expiring soon",
        "It is 4111111111111111, the one ending in 1111",
    ],
)
def test_card_numbers_trip_the_pii_check(text: str) -> None:
    verdict = PiiCheck(["card"]).check(text)
    assert verdict is not None and verdict.reason == "payment card number"


@pytest.mark.parametrize(
    "text",
    [
        "Your SSN is 123-45-6789.",
        "It is one two three, four five, six seven eight nine.",
    ],
)
def test_social_security_numbers_trip_the_pii_check(text: str) -> None:
    verdict = PiiCheck().check(text)
    assert verdict is not None and verdict.reason == "national ID number (US SSN)"


@pytest.mark.parametrize(
    "text",
    [
        "Your order 4111 1111 1111 1112 ships Friday.",  # fails Luhn
        "Call 555 0100 tomorrow",  # too short for either
        "The code is 666-45-6789.",  # never issued
        "I counted one, two, three apples and four pears",
        "Reference 12 4111111111111111 34 is a 20-digit number",  # whole numbers only
    ],
)
def test_ordinary_numbers_do_not_trip(text: str) -> None:
    assert PiiCheck().check(text) is None


def test_the_pii_check_refuses_unknown_kinds() -> None:
    with pytest.raises(SessionConfigError, match="pii checks must be some of"):
        PiiCheck(["passport"])  # type: ignore[list-item]


def test_debounce_checks_every_n_characters_and_at_sentence_ends_never_per_token() -> None:
    debounce = Debounce(10)
    assert [debounce.due(t, final=False) for t in ("Hel", "lo ", "the", "re ")] == [False, False, False, True]
    assert debounce.due("Hi", final=False) is False
    assert debounce.due(".", final=False) is True
    assert debounce.due("", final=True) is True
    with pytest.raises(SessionConfigError):
        Debounce(0)
