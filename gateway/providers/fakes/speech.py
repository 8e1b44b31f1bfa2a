"""Deterministic "speech" for the TTS fakes: one voiced syllable-train per word with exactly known boundaries.

Every word of the text becomes a voiced tone burst (a 110-200 Hz pulse train with a few harmonics under a raised
cosine envelope) whose length follows the word's letters, then a pause that follows its punctuation. All
durations are whole milliseconds, so a test can compute exactly where each word starts and ends in the audio and
compare the timestamps a fake reports (Cartesia ``word_timestamps``, ElevenLabs character alignment) with the
audio it sent. It sounds like murmured speech, crosses an energy VAD like speech, and costs microseconds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

LEAD_MS = 30  # silence before the first word of a synthesis
_WORD = re.compile(r"\S+")


@dataclass(frozen=True, slots=True, kw_only=True)
class SpokenWord:
    """One word of a synthesis: its text, its span in the text (chars) and in the audio (ms from the start)."""

    text: str
    char_start: int
    char_end: int
    start_ms: int
    end_ms: int


def word_ms(word: str) -> int:
    """How long a word sounds: 60 ms plus 45 ms per letter or digit."""
    return 60 + 45 * sum(ch.isalnum() for ch in word)


def pause_ms(word: str) -> int:
    """The pause after a word: longer after a clause or sentence end."""
    if word[-1] in ".?!":
        return 250
    if word[-1] in ",;:":
        return 150
    return 40


def layout(text: str, *, lead_ms: int = LEAD_MS) -> tuple[list[SpokenWord], int]:
    """The words of ``text`` placed in time, and the total duration (ms) including the pause after the last."""
    words: list[SpokenWord] = []
    cursor = lead_ms if text.strip() else 0
    for match in _WORD.finditer(text):
        word = match.group()
        start = cursor
        cursor += word_ms(word)
        words.append(
            SpokenWord(text=word, char_start=match.start(), char_end=match.end(), start_ms=start, end_ms=cursor)
        )
        cursor += pause_ms(word)
    return words, cursor


def render(text: str, *, sample_rate: int = 24_000, lead_ms: int = LEAD_MS) -> tuple[bytes, list[SpokenWord]]:
    """PCM16 LE mono of ``text`` and its word layout. The same text always gives the same bytes."""
    words, total_ms = layout(text, lead_ms=lead_ms)
    out = np.zeros(total_ms * sample_rate // 1000, dtype=np.float64)
    for index, word in enumerate(words):
        first = word.start_ms * sample_rate // 1000
        last = word.end_ms * sample_rate // 1000
        n = last - first
        t = np.arange(n) / sample_rate
        pitch = 110.0 + (sum(map(ord, word.text)) + index * 7) % 90
        phase = 2 * np.pi * pitch * t
        voice = np.sin(phase) + 0.5 * np.sin(2 * phase) + 0.3 * np.sin(3 * phase) + 0.15 * np.sin(5 * phase)
        envelope = np.sin(np.pi * (np.arange(n) + 0.5) / n) ** 0.5
        out[first:last] = voice * envelope
    peak = float(np.max(np.abs(out))) if out.size else 0.0
    if peak > 0:
        out *= 0.3 * 32767 / peak
    return out.astype("<i2").tobytes(), words


def char_times(text: str, words: list[SpokenWord], total_ms: int) -> list[tuple[int, int]]:
    """``(start_ms, duration_ms)`` of every character of ``text`` (ElevenLabs-style alignment): a word's letters
    share its sound evenly, the spaces after it its pause."""
    times: list[tuple[int, int]] = []
    cursor_ms = 0
    position = 0
    for index, word in enumerate(words):
        while position < word.char_start:  # the spaces before this word sound as the pause before it
            times.append((cursor_ms, word.start_ms - cursor_ms))
            position += 1
        n = word.char_end - word.char_start
        span = word.end_ms - word.start_ms
        for i in range(n):
            start = word.start_ms + i * span // n
            times.append((start, word.start_ms + (i + 1) * span // n - start))
        position = word.char_end
        cursor_ms = word.end_ms
        if index == len(words) - 1:
            break
    while position < len(text):
        times.append((cursor_ms, max(total_ms - cursor_ms, 0)))
        position += 1
    return times
