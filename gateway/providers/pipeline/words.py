"""What the caller heard of an assistant item: its text, its word timings, the cut at a barge-in.

An :class:`ItemSpeech` follows one assistant item: the text pushed to the TTS (the concatenation of every pushed
clause, so character offsets are stable), the audio delivered so far in milliseconds, and the words placed on
the item's audio timeline. Timings come from one source per TTS stream, always offset by where that stream's
audio starts in the item (a stream reopened after a fault starts mid-item), never reset per sentence:

* a timestamped TTS reports :class:`~.ports.Word` values itself (espeak events, ElevenLabs alignment, Cartesia
  timestamps);
* otherwise they are estimated: each stretch of audio is credited to the text it speaks, and words are spread
  over it in proportion to their characters (:func:`estimate_words`).

The cut follows the anchors' rule: a word counts as heard once its start has played. :meth:`ItemSpeech.heard`
returns ``text[:w.char_end]`` for the last word with ``w.start_ms < audio_end_ms`` (stripped), or "" when no
word started.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gateway.providers.pipeline.ports import Word

# Speaking rate used to place words of text whose audio has not finished arriving: about 14 characters per
# second of English speech (LiveKit paces at 3.83 syllables per second, which is the same order).
CHARS_PER_SECOND = 14.0
BYTES_PER_MS = 48  # 24 kHz mono PCM16

_WORD = re.compile(r"\S+")


def word_spans(text: str, *, offset: int = 0) -> list[tuple[int, int]]:
    """(start, end) character offsets of the whitespace-separated words of ``text``, shifted by ``offset``."""
    return [(m.start() + offset, m.end() + offset) for m in _WORD.finditer(text)]


def estimate_words(text: str, *, char_offset: int, start_ms: int, duration_ms: int) -> list[Word]:
    """Words of ``text`` spread over ``duration_ms`` from ``start_ms`` in proportion to their characters."""
    spans = word_spans(text, offset=char_offset)
    if not spans:
        return []
    weights = [end - start + 1 for start, end in spans]  # +1: the gap after each word takes time too
    total = sum(weights)
    words: list[Word] = []
    elapsed = 0
    for (start, end), weight in zip(spans, weights, strict=True):
        begin = start_ms + duration_ms * elapsed // total
        elapsed += weight
        finish = start_ms + duration_ms * elapsed // total
        words.append(
            Word(
                text=text[start - char_offset : end - char_offset],
                start_ms=begin,
                end_ms=finish,
                char_start=start,
                char_end=end,
            )
        )
    return words


@dataclass(slots=True)
class _Segment:
    """One TTS stream's share of the item: where its text and audio start in the item."""

    char_base: int
    ms_base: int
    timestamps: bool
    words: list[Word] = field(default_factory=list)
    audio_ms: int = 0
    done: bool = False


@dataclass(slots=True)
class ItemSpeech:
    """The speech of one assistant item (see the module docstring)."""

    item_id: str
    text: str = ""
    audio_bytes: int = 0
    _segments: list[_Segment] = field(default_factory=list)

    @property
    def audio_ms(self) -> int:
        return self.audio_bytes // BYTES_PER_MS

    def begin_segment(self, *, char_base: int, timestamps: bool) -> None:
        """A TTS stream starts speaking the item's text from ``char_base`` at the audio delivered so far."""
        self._segments.append(_Segment(char_base=char_base, ms_base=self.audio_ms, timestamps=timestamps))

    def pushed(self, text: str) -> None:
        self.text += text

    def audio(self, pcm_len: int) -> None:
        self.audio_bytes += pcm_len
        if self._segments:
            segment = self._segments[-1]
            segment.audio_ms = self.audio_ms - segment.ms_base

    def words_reported(self, words: Iterable[Word]) -> None:
        """Engine word timings of the current stream (its own timeline and text offsets)."""
        if not self._segments:
            return
        segment = self._segments[-1]
        for w in words:
            segment.words.append(
                Word(
                    text=w.text,
                    start_ms=w.start_ms + segment.ms_base,
                    end_ms=w.end_ms + segment.ms_base,
                    char_start=w.char_start + segment.char_base,
                    char_end=w.char_end + segment.char_base,
                )
            )

    def segment_done(self) -> None:
        if self._segments:
            self._segments[-1].done = True

    def words(self) -> list[Word]:
        """Every word placed on the item's timeline so far (estimated where the TTS gave none)."""
        return self._placed()[0]

    def _placed(self) -> tuple[list[Word], bool]:
        placed: list[Word] = []
        estimated = False
        for index, segment in enumerate(self._segments):
            end_char = self._segments[index + 1].char_base if index + 1 < len(self._segments) else len(self.text)
            # A stream replaced after a fault may have timed words its successor speaks again.
            timed = [w for w in segment.words if w.char_end <= end_char] if segment.timestamps else []
            if timed:
                placed += timed
                # Timings lag the audio (an engine reports a word once it is complete): the words after the last
                # reported one are estimated from where it ended, as for a TTS without timestamps.
                last = timed[-1]
                start_char, start_ms = last.char_end, last.end_ms
            else:
                start_char, start_ms = segment.char_base, segment.ms_base
            text = self.text[start_char:end_char]
            if not text.strip():
                continue
            estimated = True
            delivered = segment.ms_base + segment.audio_ms - start_ms
            if segment.done:
                duration = max(delivered, 0)
            else:  # audio still arriving: place the text at a standard speaking rate
                duration = max(delivered, int(len(text.strip()) * 1000 / CHARS_PER_SECOND))
            placed += estimate_words(text, char_offset=start_char, start_ms=start_ms, duration_ms=duration)
        return placed, estimated

    def heard(self, audio_end_ms: int) -> str:
        """The text of the words whose audio started before ``audio_end_ms`` ("" when none did)."""
        return heard_prefix(self.text, self.words(), audio_end_ms)

    def resume_point(self) -> int:
        """Character offset after the last word whose audio has completely arrived (where a new TTS stream would
        pick up after a fault)."""
        done_chars = 0
        delivered = self.audio_ms
        for word in self.words():
            if word.end_ms <= delivered:
                done_chars = word.char_end
        return done_chars

    @property
    def estimated(self) -> bool:
        """True when any word's timing is an estimate."""
        return self._placed()[1]


def heard_prefix(text: str, words: Sequence[Word], audio_end_ms: int) -> str:
    cut = 0
    for word in words:
        if word.start_ms < audio_end_ms:
            cut = max(cut, word.char_end)
    if cut and not any(char.isalnum() for char in text[cut:]):
        cut = len(text)  # the last word was heard: its closing punctuation belongs to what was said
    return text[:cut].strip()
