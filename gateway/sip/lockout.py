"""Shutting out password guessing: failed digest authentications counted per source and per user.

Owns: `LockoutConfig` and `AuthLockout`, a sans-I/O table driven by the caller's clock, consulted by the
inbound policy (policy.py) before any digest is verified:

    per source   `max_failures` wrong answers within `window_s` -> the source is blocked for `block_s`;
                 each later block of the same source (while it is remembered) lasts twice the last,
                 up to `max_block_s`. A blocked source's out-of-dialog requests are dropped unanswered.
    per user     `user_max_failures` wrong answers for one username within `window_s`, from any sources
                 -> that username is refused (dropped) for `block_s` (guessing spread over many addresses).
    never        sources in `never_block` (CIDRs) are counted but never blocked.

This is what Kamailio's pike/htable recipes and fail2ban do in front of Asterisk, kept inside the gateway so it
works without either. Memory is bounded: at most `max_entries` sources and users are remembered, oldest first out.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from .errors import SipConfigError


@dataclass(frozen=True, kw_only=True)
class LockoutConfig:
    max_failures: int = 5
    window_s: float = 60.0
    block_s: float = 60.0
    max_block_s: float = 3600.0
    user_max_failures: int = 20
    never_block: tuple[str, ...] = ()
    max_entries: int = 10_000

    def __post_init__(self) -> None:
        if self.max_failures < 1 or self.user_max_failures < 1 or self.max_entries < 1:
            raise SipConfigError("lockout needs max_failures, user_max_failures and max_entries >= 1")
        if self.window_s <= 0 or self.block_s <= 0 or self.max_block_s < self.block_s:
            raise SipConfigError("lockout needs window_s > 0 and 0 < block_s <= max_block_s")
        try:
            for cidr in self.never_block:
                ipaddress.ip_network(cidr, strict=False)
        except ValueError as exc:
            raise SipConfigError(f"bad CIDR in the lockout's never_block: {exc}") from exc


@dataclass(frozen=True, kw_only=True)
class Blocked:
    """A source or a username has just been blocked (the policy turns this into a SourceBlocked event)."""

    scope: str  # "source" | "user"
    key: str  # the address or the username
    failures: int
    block_s: float
    until: float


@dataclass(slots=True)
class _Track:
    failures: deque[float] = field(default_factory=deque)
    blocked_until: float = 0.0
    last_block_s: float = 0.0
    forget_at: float = 0.0


class AuthLockout:
    def __init__(self, config: LockoutConfig) -> None:
        self.config = config
        self._never = [ipaddress.ip_network(cidr, strict=False) for cidr in config.never_block]
        self._sources: OrderedDict[str, _Track] = OrderedDict()
        self._users: OrderedDict[str, _Track] = OrderedDict()

    def never_blocked(self, host: str) -> bool:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self._never)

    def source_blocked(self, host: str, now: float) -> bool:
        track = self._sources.get(host)
        return track is not None and track.blocked_until > now and not self.never_blocked(host)

    def user_blocked(self, username: str, now: float) -> bool:
        track = self._users.get(username)
        return track is not None and track.blocked_until > now

    def failed(self, host: str, username: str | None, now: float) -> list[Blocked]:
        """Count one wrong answer from ``host`` (for ``username`` when it could be read); what it blocked."""
        blocked: list[Blocked] = []
        if not self.never_blocked(host):
            hit = self._count(self._sources, host, self.config.max_failures, now, grow=True)
            if hit is not None:
                blocked.append(Blocked(scope="source", key=host, failures=hit[0], block_s=hit[1], until=now + hit[1]))
        if username:
            hit = self._count(self._users, username, self.config.user_max_failures, now, grow=False)
            if hit is not None:
                blocked.append(Blocked(scope="user", key=username, failures=hit[0], block_s=hit[1], until=now + hit[1]))
        return blocked

    def succeeded(self, host: str) -> None:
        """A right answer from ``host``: its count of failures starts again (its block history stays)."""
        track = self._sources.get(host)
        if track is not None:
            track.failures.clear()

    def _count(
        self, table: OrderedDict[str, _Track], key: str, limit: int, now: float, *, grow: bool
    ) -> tuple[int, float] | None:
        track = table.get(key)
        if track is None or (track.forget_at and now >= track.forget_at and track.blocked_until <= now):
            track = _Track()
            table[key] = track
            while len(table) > self.config.max_entries:
                table.popitem(last=False)
        else:
            table.move_to_end(key)
        if track.blocked_until > now:
            return None  # already blocked: nothing more to decide
        failures = track.failures
        failures.append(now)
        while failures and failures[0] <= now - self.config.window_s:
            failures.popleft()
        track.forget_at = now + self.config.max_block_s + self.config.window_s
        if len(failures) < limit:
            return None
        count = len(failures)
        failures.clear()
        block_s = self.config.block_s
        if grow and track.last_block_s:
            block_s = min(self.config.max_block_s, track.last_block_s * 2)
        track.last_block_s = block_s
        track.blocked_until = now + block_s
        track.forget_at = track.blocked_until + self.config.max_block_s
        return count, block_s
