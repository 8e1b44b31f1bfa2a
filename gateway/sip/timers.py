"""Timer values of RFC 3261 §17 (table 4 of appendix A) and RFC 6026 (L, M) as data.

Owns: `SipTimers`, the frozen (T1, T2, T4) triple and every derived timer. Timers that only exist to
absorb retransmissions over unreliable transports (D, I, J, K) are zero on reliable ones (§17.1.2.2,
§17.2.1, §17.2.2); retransmission timers (A, E, G) are not started at all on reliable ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import SipConfigError


@dataclass(frozen=True, kw_only=True)
class SipTimers:
    t1: float = 0.5  # RTT estimate
    t2: float = 4.0  # maximum retransmit interval for non-INVITE requests and INVITE responses
    t4: float = 5.0  # maximum duration a message remains in the network

    def __post_init__(self) -> None:
        if not (0 < self.t1 <= self.t2) or self.t4 <= 0:
            raise SipConfigError("SipTimers needs 0 < t1 <= t2 and t4 > 0")

    @property
    def a(self) -> float:
        """INVITE request retransmit, initial interval; doubles each time (unreliable only)."""
        return self.t1

    @property
    def b(self) -> float:
        """INVITE transaction timeout."""
        return 64 * self.t1

    def d(self, reliable: bool) -> float:
        """Wait time for response retransmits after a non-2xx INVITE final (>= 32 s unreliable)."""
        # 64*T1 is 32 s with the default T1; a shorter T1 (tests) shortens it in proportion.
        return 0.0 if reliable else 64 * self.t1

    @property
    def e(self) -> float:
        """Non-INVITE request retransmit, initial interval; min(2x, T2) after."""
        return self.t1

    @property
    def f(self) -> float:
        """Non-INVITE transaction timeout."""
        return 64 * self.t1

    @property
    def g(self) -> float:
        """INVITE response retransmit, initial interval; min(2x, T2) after."""
        return self.t1

    @property
    def h(self) -> float:
        """Wait time for ACK receipt."""
        return 64 * self.t1

    def i(self, reliable: bool) -> float:
        """Wait time for ACK retransmits."""
        return 0.0 if reliable else self.t4

    def j(self, reliable: bool) -> float:
        """Wait time for non-INVITE request retransmits."""
        return 0.0 if reliable else 64 * self.t1

    def k(self, reliable: bool) -> float:
        """Wait time for non-INVITE response retransmits."""
        return 0.0 if reliable else self.t4

    @property
    def l(self) -> float:  # noqa: E743 — the RFC's name
        """RFC 6026: wait time for INVITE retransmits after a 2xx was sent (Accepted state)."""
        return 64 * self.t1

    @property
    def m(self) -> float:
        """RFC 6026: wait time for 2xx retransmits after the first 2xx (client Accepted state)."""
        return 64 * self.t1

    def backoff(self, interval: float, *, cap: bool) -> float:
        """Next retransmit interval: doubled, capped at T2 for E and G (cap=True), uncapped for A."""
        return min(2 * interval, self.t2) if cap else 2 * interval
