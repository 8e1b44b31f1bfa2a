"""Network impairment of what the load generator's callers send (caller -> target; the return path is clean).

Perfectly paced packets on loopback say nothing about a jitter buffer. Three impairments, each drawn from the
call's own seeded random stream so that a run can be repeated:

- **loss**: each packet is dropped with probability ``loss_pct`` / 100, independently of the others;
- **jitter**: each packet is held for a uniform 0 .. ``jitter_ms`` before it leaves; above 20 ms packets
  overtake each other, as they do on a real network;
- **bursts**: every ``burst_every_s`` seconds (at a phase drawn per call) a call's packets are held for
  ``burst_ms`` and then leave together with the next one on time: a Wi-Fi retry storm, a congested uplink,
  a stalled SBC.

:class:`~gateway.loadtest.config.ImpairConfig` holds the settings. :class:`CallImpairment` is sans-I/O: it
tells the runner what to do with frame *k* of a call (drop it, or send it after a delay); the runner does it.
"""

from __future__ import annotations

import random

from gateway.loadtest.config import ImpairConfig

_FRAME_S = 0.02


class CallImpairment:
    """One call's impairment: the fate of each frame it sends, from a random stream of its own."""

    __slots__ = ("_burst", "_jitter_s", "_loss", "_period", "_phase", "_rng", "delayed", "dropped")

    def __init__(self, config: ImpairConfig, rng: random.Random) -> None:
        self._rng = random.Random(rng.getrandbits(64))
        self._loss = config.loss_pct / 100.0
        self._jitter_s = config.jitter_ms / 1000.0
        self._burst = config.burst_ms // 20
        self._period = round(config.burst_every_s / _FRAME_S) if self._burst else 0
        self._phase = self._rng.randrange(self._period) if self._period else 0
        self.dropped = 0
        self.delayed = 0

    def delay_s(self, frame: int) -> float | None:
        """None: frame ``frame``'s packet is lost; else the seconds it is held before it leaves (0: at once)."""
        rng = self._rng
        if self._loss and rng.random() < self._loss:
            self.dropped += 1
            return None
        delay = 0.0
        if self._period:
            position = (frame + self._phase) % self._period
            if position < self._burst:
                delay = (self._burst - position) * _FRAME_S  # released with the first frame after the burst
        if self._jitter_s:
            delay += rng.random() * self._jitter_s
        if delay:
            self.delayed += 1
        return delay
