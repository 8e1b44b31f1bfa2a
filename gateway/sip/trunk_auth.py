"""Which trunk a new call comes from, by its source address, and so whom its digest answer is checked against.

Owns: `SourceTrunks`, used by the inbound policy (policy.py, step 5) for initial INVITEs:

* a source inside one or more trunks' networks belongs to the most specific of them (the longest prefix; on a
  tie, the first declared); that trunk's `Authenticator` checks the call (None: its addresses are trusted, no
  challenge) — another trunk's credentials are wrong there, whatever they are;
* a source in no trunk's networks: the endpoint's own `SipConfig.authenticator` (the global inbound credential,
  or none), or, with ``reject_unmatched``, 403 before any challenge.

Sans-I/O: addresses in, decisions out.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from .auth import Authenticator

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, kw_only=True)
class TrunkSource:
    """A trunk's networks, and the authenticator its callers answer (None: not challenged)."""

    name: str
    networks: tuple[str, ...]
    authenticator: Authenticator | None = field(default=None, compare=False)


@dataclass(frozen=True, kw_only=True)
class TrunkMatch:
    """A source's trunk (None: no trunk's networks hold it)."""

    trunk: str | None
    authenticator: Authenticator | None


class SourceTrunks:
    """Trunks by source address: `match(host)`."""

    def __init__(self, trunks: tuple[TrunkSource, ...], *, reject_unmatched: bool = False) -> None:
        self.reject_unmatched = reject_unmatched
        entries: list[tuple[int, int, Network, TrunkSource]] = []
        for order, trunk in enumerate(trunks):
            for cidr in trunk.networks:
                network = ipaddress.ip_network(cidr, strict=False)
                entries.append((-network.prefixlen, order, network, trunk))
        self._entries = sorted(entries, key=lambda entry: entry[:2])

    def trunk_of(self, host: str) -> TrunkSource | None:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return None
        for _, _, network, trunk in self._entries:
            if address.version == network.version and address in network:
                return trunk
        return None

    def match(self, host: str, fallback: Authenticator | None) -> TrunkMatch:
        """The trunk of ``host`` and the authenticator its call answers; ``fallback`` for a source of no trunk."""
        trunk = self.trunk_of(host)
        if trunk is None:
            return TrunkMatch(trunk=None, authenticator=fallback)
        return TrunkMatch(trunk=trunk.name, authenticator=trunk.authenticator)
