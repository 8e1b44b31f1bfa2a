"""Built-in output guardrails over the agent's text, sans-I/O: blocked phrases and patterns, a PII check, and the
debounce that decides when the accumulating transcript is checked.

Checks are pure: text in, a :class:`Verdict` (or None) out. They see the whole text of the agent's item so far, so
a phrase split across transcript deltas is still found. The PII check reads digits as the agent would say them
("four one one one ..." as well as "4111"): a payment card number is 13 to 19 digits that pass the Luhn check, a
US social security number is 9 digits that can have been issued (python-stdnum validates both). Digits count
as one number while only spaces, hyphens, dots, commas and the word "dash" separate them; "double"/"triple"
repeat the next digit as a caller would hear it. Reading spoken digits is hand-rolled (no library reads them):
docs/adr/0032-guardrail-spoken-digits.md says why.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from stdnum import luhn
from stdnum.us import ssn

from gateway.session.errors import SessionConfigError

PiiKind = Literal["card", "us_ssn"]
PII_KINDS: tuple[PiiKind, ...] = ("card", "us_ssn")

_SENTENCE_END = re.compile(r"[.!?;:\n]")
_DIGIT_WORDS = {
    "zero": "0",
    "oh": "0",
    "o": "0",
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
}
_REPEAT_WORDS = {"double": 2, "triple": 3}
_JOINERS = frozenset({"dash", "hyphen"})
# A digit, a word, or one character of anything else (whitespace is skipped by the tokenizer).
_TOKEN = re.compile(r"\d|[a-z]+|[^\sa-z\d]")
_SEPARATORS = frozenset("-.,")


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """A check found something: ``reason`` says what (never the matched text itself, which may be PII);
    ``start`` is where in the checked text it begins."""

    reason: str
    start: int


class BlockedTerms:
    """Phrases (case-insensitive, whole words, any whitespace between words) and regular expressions
    (case-insensitive) the agent must not say. Bad patterns raise SessionConfigError when built."""

    def __init__(self, *, phrases: Iterable[str] = (), patterns: Iterable[str] = ()) -> None:
        self._phrases: dict[str, str] = {}  # the phrase's words, lower-cased and single-spaced -> its label
        for phrase in phrases:
            words = phrase.split()
            if not words:
                raise SessionConfigError("a blocked phrase must not be empty")
            self._phrases[" ".join(words).lower()] = f"blocked phrase {' '.join(words)!r}"
        # All phrases in one alternation: one pass over the text whatever their number.
        alternatives = sorted(
            (r"\s+".join(re.escape(w) for w in key.split()) for key in self._phrases), key=len, reverse=True
        )
        self._phrase_regex = (
            re.compile(r"(?<!\w)(?:" + "|".join(alternatives) + r")(?!\w)", re.IGNORECASE) if alternatives else None
        )
        self._patterns: list[tuple[str, re.Pattern[str]]] = []
        for number, pattern in enumerate(patterns, start=1):
            try:
                compiled = re.compile(pattern, re.IGNORECASE)
            except re.error as exc:
                raise SessionConfigError(
                    f"blocked pattern {pattern!r} is not a valid regular expression: {exc}"
                ) from exc
            if compiled.fullmatch(""):
                raise SessionConfigError(f"blocked pattern {pattern!r} matches the empty text")
            self._patterns.append((f"blocked pattern #{number}", compiled))
        if not self._phrases and not self._patterns:
            raise SessionConfigError("a blocked guardrail needs at least one phrase or pattern")

    def check(self, text: str) -> Verdict | None:
        found: Verdict | None = None
        if self._phrase_regex is not None:
            match = self._phrase_regex.search(text)
            if match is not None:
                found = Verdict(reason=self._phrases[" ".join(match.group().split()).lower()], start=match.start())
        for label, regex in self._patterns:
            match = regex.search(text)
            if match is not None and (found is None or match.start() < found.start):
                found = Verdict(reason=label, start=match.start())
        return found


def luhn_valid(digits: str) -> bool:
    return bool(luhn.is_valid(digits))


def ssn_valid(digits: str) -> bool:
    """An SSN that can have been issued (python-stdnum's rules: area, group, serial and known-public ones)."""
    return bool(ssn.is_valid(digits))


def digit_runs(text: str) -> list[tuple[str, int]]:
    """The numbers in ``text`` as digit strings, written or spoken, with where each starts."""
    runs: list[tuple[str, int]] = []
    digits: list[str] = []
    start = 0
    repeat = 1

    def close() -> None:
        nonlocal repeat
        if digits:
            runs.append(("".join(digits), start))
            digits.clear()
        repeat = 1

    for match in _TOKEN.finditer(text.lower()):
        token = match.group()
        digit = token if token.isdigit() else _DIGIT_WORDS.get(token)
        if digit is not None:
            if not digits and repeat == 1:
                start = match.start()
            digits.append(digit * repeat)
            repeat = 1
        elif token in _REPEAT_WORDS:
            if not digits:
                start = match.start()
            repeat = _REPEAT_WORDS[token]
        elif token in _SEPARATORS or token in _JOINERS:
            continue
        else:
            close()
    close()
    return runs


class PiiCheck:
    """Payment card numbers (Luhn) and US social security numbers, written or spoken."""

    def __init__(self, kinds: Iterable[PiiKind] = PII_KINDS) -> None:
        self._kinds = frozenset(kinds)
        unknown = self._kinds - set(PII_KINDS)
        if unknown or not self._kinds:
            raise SessionConfigError(f"pii checks must be some of {', '.join(PII_KINDS)}, got {sorted(self._kinds)}")

    def check(self, text: str) -> Verdict | None:
        for digits, start in digit_runs(text):
            if "card" in self._kinds and _has_card_number(digits):
                return Verdict(reason="payment card number", start=start)
            if "us_ssn" in self._kinds and len(digits) == 9 and ssn_valid(digits):
                return Verdict(reason="national ID number (US SSN)", start=start)
        return None


def _has_card_number(digits: str) -> bool:
    # The whole number only: one in ten digit strings passes Luhn, so stretches inside longer runs would trip
    # on order and reference numbers.
    return 13 <= len(digits) <= 19 and luhn_valid(digits)


class Debounce:
    """When to check the accumulating text: once ``every_chars`` have arrived since the last check, at a
    sentence end, and when the item's text is final. Never per token."""

    def __init__(self, every_chars: int) -> None:
        if every_chars < 1:
            raise SessionConfigError(f"guardrail every_chars must be >= 1, got {every_chars}")
        self._every = every_chars
        self._since = 0

    def due(self, delta: str, *, final: bool) -> bool:
        self._since += len(delta)
        if final or self._since >= self._every or _SENTENCE_END.search(delta):
            self._since = 0
            return True
        return False
