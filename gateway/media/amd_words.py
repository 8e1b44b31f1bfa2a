"""The greeting's words in answering-machine detection: the timing verdict and the STT's text, combined (sans-I/O).

Owns: the phrase lists (:data:`MACHINE_PHRASES`, :data:`HUMAN_OPENERS`), :func:`judge_words` (what a piece of
recognised text says on its own) and :class:`AmdCombiner`, which turns the timing verdict of
:mod:`gateway.media.amd` plus the words into the final verdict with its reason.

The combiner is driven on the audio clock (seconds after the answer), so it is deterministic and testable
frame by frame. Rules, first match wins::

    timing fax or beep                          -> final at once (words cannot change a tone)
    words with a machine phrase, at any time    -> machine  "words_machine"   (even before timing decides)
    after a timing verdict, hold <= words_wait_s:
      speech going on >= resumed_speech_s       -> machine  "speech_went_on"  (a "Hi!", a pause, then a recording)
      short human words ("hello?", "yes")
        and no speech after the verdict         -> human    "words_human"     (overturns many_words / long_greeting)
      the deadline                              -> the timing verdict stands, reason unchanged

The hold bounds how long words may come late: a stalled or absent STT delays the decision by at most
``words_wait_s``; with no words source at all the combiner is not used and nothing waits.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from gateway.media.amd import AmdDecided, AmdResult

__all__ = [
    "HUMAN_OPENERS",
    "MACHINE_PHRASES",
    "AmdCombiner",
    "AmdVerdict",
    "WordsConfig",
    "WordsJudgement",
    "judge_words",
    "normalise",
]

# Phrases a recorded greeting says and a person answering does not, per language (normalised: lower case, no
# punctuation, apostrophes dropped). A phrase matches on whole words anywhere in the text.
MACHINE_PHRASES: Final[Mapping[str, tuple[str, ...]]] = {
    "en": (
        "leave a message",
        "leave your message",
        "leave me a message",
        "leave my message",  # a small STT's usual hearing of "leave a message" (Whisper tiny.en, 8 kHz)
        "leave your name",
        "leave a brief message",
        "leave a detailed message",
        "record your message",
        "not available",
        "unavailable",
        "cant take your call",
        "cannot take your call",
        "cant come to the phone",
        "missed your call",
        "sorry i missed you",
        "after the tone",
        "after the beep",
        "at the tone",
        "at the beep",
        "voicemail",
        "voice mail",
        "mailbox",
        "mail box",
        "you have reached",
        "youve reached",
        "get back to you",
        "call you back",
        "return your call",
        "office is closed",
        "currently closed",
        "opening hours",
        "business hours",
        "the person you are calling",
        "the number you have dialed",
        "press one",
    ),
    "es": ("deje su mensaje", "deje un mensaje", "despues del tono", "buzon de voz", "no esta disponible"),
    "fr": ("laissez un message", "laissez votre message", "apres le bip", "messagerie", "pas disponible"),
    "de": ("hinterlassen sie", "nach dem signalton", "nach dem piepton", "mailbox", "nicht erreichbar"),
}
# Words a person answering the phone opens with; a short text made of an opener and few words is a person.
HUMAN_OPENERS: Final[frozenset[str]] = frozenset(
    {
        "hello",
        "hallo",
        "hullo",
        "hi",
        "hey",
        "yes",
        "yeah",
        "yep",
        "yup",
        "speaking",
        "good",
        "who",
        "whos",
        "this",
        "its",
        "ja",
        "oui",
        "allo",
        "bonjour",
        "si",
        "diga",
        "hola",
        "bueno",
    }
)
_HUMAN_MAX_WORDS: Final = 5

_WORD = re.compile(r"[a-z0-9]+")
_NOT_WORD = re.compile(r"[\W_]+")


def normalise(text: str) -> str:
    """Lower case, accents and apostrophes dropped, every other non-alphanumeric run one space."""
    spaced = _NOT_WORD.sub(" ", text.lower().replace("'", "").replace("\u2019", ""))
    plain = unicodedata.normalize("NFKD", spaced).encode("ascii", "ignore").decode("ascii")
    return " ".join(_WORD.findall(plain))


@dataclass(frozen=True, slots=True, kw_only=True)
class WordsJudgement:
    result: AmdResult | None  # MACHINE, HUMAN, or None: the words say nothing either way
    phrase: str = ""  # the machine phrase found, or the human text


def judge_words(text: str, *, phrases: Mapping[str, tuple[str, ...]] = MACHINE_PHRASES) -> WordsJudgement:
    """What recognised text says on its own: a machine phrase anywhere, or a short greeting opening with a
    person's word ("hello?", "yes, speaking"), or nothing."""
    plain = f" {normalise(text)} "
    for language in phrases.values():
        for phrase in language:
            if f" {phrase} " in plain:
                return WordsJudgement(result=AmdResult.MACHINE, phrase=phrase)
    words = plain.split()
    if words and len(words) <= _HUMAN_MAX_WORDS and words[0] in HUMAN_OPENERS:
        return WordsJudgement(result=AmdResult.HUMAN, phrase=" ".join(words))
    return WordsJudgement(result=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class WordsConfig:
    words_wait_s: float = 1.5  # after a machine/unknown timing verdict, how long words may still change it
    human_hold_s: float = 0.8  # after a human timing verdict, how long a recording may still show itself
    resumed_speech_s: float = 0.4  # speech after a human/unknown verdict that makes it a recording

    def __post_init__(self) -> None:
        if not (0.0 < self.words_wait_s <= 10.0 and 0.0 < self.human_hold_s <= 10.0) or self.resumed_speech_s <= 0:
            raise ValueError("AMD words: words_wait_s and human_hold_s within (0, 10] s, resumed_speech_s > 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class AmdVerdict:
    """The final decision: the timing rule's, or the one the words changed it to."""

    result: AmdResult
    reason: str  # the timing rule's reason, or words_machine, words_human, speech_went_on
    at_s: float
    timing: AmdDecided | None  # what the timing rules had said (None: the words decided first)
    words: str = ""  # the recognised text heard until the verdict


class AmdCombiner:
    """One call's combination. Feed it in audio-clock order: :meth:`audio` for every frame from the answer on,
    :meth:`timing` once, :meth:`words` whenever text comes; each returns the verdict once it is final (and None
    before and after)."""

    def __init__(self, config: WordsConfig | None = None) -> None:
        self.config = config or WordsConfig()
        self.verdict: AmdVerdict | None = None
        self._timing: AmdDecided | None = None
        self._texts: list[str] = []
        self._now = 0.0
        self._speech_after = 0.0  # voiced seconds after the timing verdict
        self._human_words = False
        self._speech_since_words = 0.0  # voiced seconds after the person's words came

    @property
    def heard(self) -> str:
        return " ".join(self._texts)

    def timing(self, decided: AmdDecided) -> AmdVerdict | None:
        if self.verdict is not None or self._timing is not None:
            return None
        self._timing = decided
        self._now = max(self._now, decided.at_s)
        if decided.result is AmdResult.FAX or decided.reason == "beep":
            return self._final(decided.result, decided.reason)
        if self._human_words and decided.result is not AmdResult.HUMAN:
            return self._final(AmdResult.HUMAN, "words_human")
        return None

    def words(self, text: str, *, at_s: float) -> AmdVerdict | None:
        """Recognised text (a final or a partial) that came at ``at_s`` on the audio clock."""
        if self.verdict is not None or not text.strip():
            return None
        self._now = max(self._now, at_s)
        self._texts.append(text.strip())
        judged = judge_words(text)
        if judged.result is AmdResult.MACHINE:
            return self._final(AmdResult.MACHINE, "words_machine")
        went_on = self._speech_after >= self.config.resumed_speech_s
        if judged.result is AmdResult.HUMAN and not self._texts[:-1] and not went_on:
            self._human_words = True  # only the first thing said, and then silence: a recording's "hi" goes on
            self._speech_since_words = 0.0
        timing = self._timing
        if timing is not None and timing.result is not AmdResult.HUMAN and self._human_words:
            return self._final(AmdResult.HUMAN, "words_human")
        return self.tick(at_s)

    def audio(self, *, voiced: bool, dt: float) -> AmdVerdict | None:
        """Every frame, from the answer on: the clock advances; speech that goes on after a person's words, or
        after a human verdict, counts against a person."""
        if self.verdict is not None:
            return None
        self._now += dt
        if voiced:
            if self._human_words:
                self._speech_since_words += dt
                if self._speech_since_words >= self.config.resumed_speech_s:
                    self._human_words = False  # the words heard so far were not the whole greeting
            if self._timing is not None:
                self._speech_after += dt
                if self._timing.result is not AmdResult.MACHINE and self._speech_after >= self.config.resumed_speech_s:
                    return self._final(AmdResult.MACHINE, "speech_went_on")
        return self.tick(self._now)

    def tick(self, now_s: float) -> AmdVerdict | None:
        """The deadline: ``words_wait_s`` after the timing verdict, the timing verdict stands."""
        self._now = max(self._now, now_s)
        timing = self._timing
        if self.verdict is not None or timing is None:
            return None
        hold = self.config.human_hold_s if timing.result is AmdResult.HUMAN else self.config.words_wait_s
        if self._now - timing.at_s >= hold:
            return self._final(timing.result, timing.reason)
        return None

    def _final(self, result: AmdResult, reason: str) -> AmdVerdict:
        self.verdict = AmdVerdict(
            result=result, reason=reason, at_s=round(self._now, 3), timing=self._timing, words=self.heard
        )
        return self.verdict
