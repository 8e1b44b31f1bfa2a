"""How far the bot's audio is ahead of the caller, and which of its marks wait for playout. Sans-I/O.

The session's playout tells the provider when it has sent the audio before a marker
(:class:`gateway.providers.base.AudioMarked`). The provider places one marker per bot ``mark`` (answered with
the bot's name) and one every ``position_every_ms`` of delivered audio (answered with nothing): the played
position they report, against what was delivered, bounds the audio queued for the caller. A bot may run ahead
of real time (the playout paces it); past ``max_queued_ms`` its audio is refused and counted, never queued
without limit.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class _Marker:
    name: str | None  # the bot's mark name; None for a position marker
    at_ms: float  # audio delivered when it was placed


class PlayoutLedger:
    def __init__(self, *, max_queued_ms: float, position_every_ms: float = 500.0, max_marks: int = 10_000) -> None:
        self.max_queued_ms = max_queued_ms
        self._every_ms = position_every_ms
        self._max_marks = max_marks
        self._markers: dict[str, _Marker] = {}
        self._tokens = 0
        self.delivered_ms = 0.0
        self.played_ms = 0.0
        self._last_position_ms = 0.0
        self.bot_marks_pending = 0

    @property
    def queued_ms(self) -> float:
        """Audio delivered but not yet reported played (an overestimate by at most ``position_every_ms``)."""
        return self.delivered_ms - self.played_ms

    def admits(self, ms: float) -> bool:
        """Whether ``ms`` more audio fits under ``max_queued_ms``."""
        return self.queued_ms + ms <= self.max_queued_ms

    def delivered(self, ms: float) -> str | None:
        """``ms`` of audio went to the session; returns a position marker's token when one is due."""
        self.delivered_ms += ms
        if self.delivered_ms - self._last_position_ms < self._every_ms:
            return None
        self._last_position_ms = self.delivered_ms
        return self._place(None)

    def bot_mark(self, name: str) -> str | None:
        """A bot mark's token; None when too many marks already wait (the mark is refused)."""
        if self.bot_marks_pending >= self._max_marks:
            return None
        self.bot_marks_pending += 1
        return self._place(name)

    def reached(self, token: str) -> str | None:
        """The marker ``token`` was played (or cleared): the bot mark name to answer, if it was one."""
        marker = self._markers.pop(token, None)
        if marker is None:
            return None
        self.played_ms = max(self.played_ms, marker.at_ms)
        if marker.name is not None:
            self.bot_marks_pending -= 1
        return marker.name

    def cleared(self) -> None:
        """Every delivered sample was dropped (a clear): nothing is queued any more."""
        self.played_ms = self.delivered_ms

    def _place(self, name: str | None) -> str:
        self._tokens += 1
        token = f"{'m' if name is not None else 'p'}{self._tokens}"
        self._markers[token] = _Marker(name=name, at_ms=self.delivered_ms)
        return token
