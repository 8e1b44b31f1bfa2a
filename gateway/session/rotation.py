"""When to renew the provider connection: before its known life ends (capabilities.max_connection_s minus a
margin) or soon after it announces its end (ConnectionExpiring), only between turns, but at the latest by a
deadline. Synchronous and clock-driven: the media tick compares ``next_at`` with its clock (O(1)).
"""

from __future__ import annotations

import math
from typing import Literal

from gateway.session.config import SessionConfig

RotationCause = Literal["rotation", "expiring"]


class RotationPlan:
    def __init__(self, config: SessionConfig, *, max_connection_s: float | None) -> None:
        self._config = config
        self._max_connection_s = max_connection_s
        self.next_at = math.inf  # earliest moment a rotation may start
        self._force_at = math.inf  # from here on, rotate even mid-turn
        self._cause: RotationCause = "rotation"

    def connection_opened(self, opened_at: float) -> None:
        """A new connection: plan its renewal (nothing to plan when its life is unknown)."""
        self.next_at = self._force_at = math.inf
        if self._max_connection_s is None:
            return
        config = self._config
        due = opened_at + self._max_connection_s - config.rotation_margin_s
        hard = opened_at + self._max_connection_s - config.expiring_safety_s
        self.next_at, self._cause = due, "rotation"
        self._force_at = max(due, min(due + config.rotation_gap_wait_s, hard))

    def expiring(self, now: float, time_left_s: float) -> None:
        """The provider announced the connection's end: rotate at the next gap, at the latest shortly before."""
        force_at = now + max(0.0, time_left_s - self._config.expiring_safety_s)
        if force_at < self._force_at or self.next_at == math.inf:
            self.next_at, self._force_at, self._cause = now, force_at, "expiring"

    def due(self, now: float, *, between_turns: bool) -> RotationCause | None:
        """The cause when a rotation should start now (the plan is then consumed), else None."""
        if now < self.next_at or not (between_turns or now >= self._force_at):
            return None
        self.next_at = self._force_at = math.inf
        return self._cause

    def cancel(self) -> None:
        self.next_at = self._force_at = math.inf
