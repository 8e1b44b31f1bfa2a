"""Cut streamed LLM text into clauses for the TTS, so the first clause is spoken before the model finishes.

A clause ends after ``.``, ``?``, ``!``, ``;`` or ``:`` followed by whitespace, or after ``,`` once the clause
holds ``min_comma_chars`` characters; text without such a break is released anyway past ``max_chars`` at the
last space. The concatenation of every clause (and the :meth:`ClauseSplitter.flush` remainder) is exactly the
text fed in, whitespace included, so character offsets into the item text stay valid for word timings.
A full stop inside a number ("3.5") or after a single capital ("J. Smith") is not a break; a sentence end that
closes the text fed so far is one when it follows a word of two or more letters (streamed tokens end there, and
waiting for the next token's space would cost one token interval).
"""

from __future__ import annotations

_ENDS = ".?!;:"


class ClauseSplitter:
    def __init__(self, *, min_comma_chars: int = 20, max_chars: int = 200) -> None:
        self._min_comma = min_comma_chars
        self._max = max_chars
        self._pending = ""

    def feed(self, text: str) -> list[str]:
        """Append streamed text; returns the clauses now complete (each with its trailing whitespace)."""
        self._pending += text
        clauses: list[str] = []
        while True:
            cut = self._break()
            if cut <= 0:
                break
            clauses.append(self._pending[:cut])
            self._pending = self._pending[cut:]
        return clauses

    def flush(self) -> str:
        """The rest (end of the reply)."""
        rest, self._pending = self._pending, ""
        return rest

    def _break(self) -> int:
        text = self._pending
        for i, char in enumerate(text):
            if i + 1 >= len(text):
                # A sentence end closing the text so far (a token ends there) need not wait for the next token's
                # space: after a word of two or more letters it cannot be a decimal point or an initial.
                if char in "?!" or (char == "." and i >= 2 and text[i - 1].isalpha() and text[i - 2].isalpha()):
                    return i + 1
                continue
            if not text[i + 1].isspace():
                continue
            if char in _ENDS and not _abbreviation(text, i):
                return _after_space(text, i + 1)
            if char == "," and i + 1 >= self._min_comma:
                return _after_space(text, i + 1)
        if len(text) > self._max:
            space = text.rfind(" ", 0, self._max)
            if space > 0:
                return space + 1
        return 0


def _after_space(text: str, index: int) -> int:
    while index < len(text) and text[index].isspace():
        index += 1
    return index


def _abbreviation(text: str, index: int) -> bool:
    if text[index] != ".":
        return False
    start = index
    while start > 0 and not text[start - 1].isspace():
        start -= 1
    token = text[start:index]
    return len(token) == 1 and token.isupper()
