"""Placing a vendor's words in the text the pipeline pushed: character offsets for :class:`~..ports.Word`.

Vendors report words as they spoke them, which is not always as written ("5" may come back as "five", a
trailing comma may be dropped). :func:`locate` finds the word at or after a cursor in the pushed text; when the
spelling differs it takes the next whitespace-delimited token instead, so offsets always advance monotonically
and a truncation never keeps text that was not spoken.
"""

from __future__ import annotations


def _skip_space(text: str, cursor: int) -> int:
    while cursor < len(text) and text[cursor].isspace():
        cursor += 1
    return cursor


def locate(text: str, cursor: int, word: str) -> tuple[int, int]:
    """``(char_start, char_end)`` of ``word`` in ``text`` at or after ``cursor``; ``char_end`` is the next cursor."""
    start = _skip_space(text, cursor)
    needle = word.strip()
    if needle and text.startswith(needle, start):
        return start, start + len(needle)
    end = start
    while end < len(text) and not text[end].isspace():
        end += 1
    return start, end
