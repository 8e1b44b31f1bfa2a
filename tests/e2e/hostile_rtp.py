"""Hostile RTP for the live-gateway test: hypothesis strategies for datagrams thrown at a call's RTP and
RTCP ports while a real phone talks on it (RFC 3550 §5.1 / A.1 validity rules, broken one at a time).

Every datagram comes from an address that is not the phone's latched (ip, port): another loopback host
(127.0.0.3) or the phone's own IP with another port. So even a perfectly valid packet must be dropped as
a foreign source; the valid ones carry loud noise as PCMU, which would ruin the echo the phone records if
the gateway ever played them. Kinds:

    short, random       fewer than 12 bytes; arbitrary bytes of any length (also > 2048, the read size)
    version             a sound header with version 0, 1 or 3
    csrc_count          CC announces more CSRCs than the datagram holds
    extension_length    X set, extension header missing or its length overrunning the packet
    padding             P set, last octet 0 or larger than what follows the header
    rtcp_like           second octet 192..223 (RTCP packet types) with garbage after it
    valid_foreign       a valid PCMU packet (or another payload type) from the foreign address
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from hypothesis import strategies as st

__all__ = ["HostileRtp", "hostile_rtp"]

FOREIGN_SOURCES = ("foreign_host", "foreign_port")


@dataclass(frozen=True, kw_only=True)
class HostileRtp:
    kind: str
    data: bytes
    source: str  # one of FOREIGN_SOURCES
    port: str  # "rtp" or "rtcp"

    @property
    def parses(self) -> bool:
        """Whether a correct RTP parser accepts it (then only the source check can drop it)."""
        return self.kind == "valid_foreign"


def _header(
    *, version: int = 2, padding: bool = False, extension: bool = False, cc: int = 0, pt: int = 0
) -> st.SearchStrategy[bytes]:
    first = (version << 6) | (0x20 if padding else 0) | (0x10 if extension else 0) | cc
    return st.builds(
        lambda seq, ts, ssrc, marker: struct.pack("!BBHII", first, (0x80 if marker else 0) | pt, seq, ts, ssrc),
        st.integers(0, 0xFFFF),
        st.integers(0, 0xFFFFFFFF),
        st.integers(0, 0xFFFFFFFF),
        st.booleans(),
    )


# Full-scale PCMU codes (0x00/0x80 are the loudest of each sign): noise the echo would make audible.
_LOUD_PCMU = st.binary(min_size=160, max_size=160).map(lambda b: bytes(x & 0x80 for x in b))


def _kind(kind: str, data: st.SearchStrategy[bytes]) -> st.SearchStrategy[tuple[str, bytes]]:
    return st.tuples(st.just(kind), data)


_PACKETS = st.one_of(
    _kind("short", st.binary(max_size=11)),
    _kind("random", st.one_of(st.binary(max_size=300), st.binary(min_size=2049, max_size=4000))),
    _kind(
        "version",
        st.builds(
            lambda h, p: h + p,
            st.integers(0, 3).filter(lambda v: v != 2).flatmap(lambda v: _header(version=v)),
            _LOUD_PCMU,
        ),
    ),
    _kind(
        "csrc_count",
        st.integers(1, 15).flatmap(
            lambda cc: st.builds(lambda h, tail: h + tail, _header(cc=cc), st.binary(max_size=4 * cc - 1))
        ),
    ),
    _kind(
        "extension_length",
        st.one_of(
            st.builds(lambda h, tail: h + tail, _header(extension=True), st.binary(max_size=3)),
            st.builds(
                lambda h, words, tail: h + struct.pack("!HH", 0xBEDE, words) + tail,
                _header(extension=True),
                st.integers(1, 0xFFFF),
                st.binary(max_size=3),
            ),
        ),
    ),
    _kind(
        "padding",
        st.builds(
            lambda h, payload, pad: h + payload + bytes([pad(len(payload))]),
            _header(padding=True),
            st.binary(max_size=40),
            st.sampled_from([lambda n: 0, lambda n: n + 2, lambda n: 255]),
        ),
    ),
    _kind(
        "rtcp_like",
        st.builds(lambda b1, body: bytes([0x80, b1]) + body, st.integers(192, 223), st.binary(min_size=2, max_size=80)),
    ),
    _kind(
        "valid_foreign",
        st.builds(
            lambda h, p: h + p,
            st.sampled_from([0, 8, 13, 18, 101, 120, 127]).flatmap(lambda pt: _header(pt=pt)),
            _LOUD_PCMU,
        ),
    ),
)


@st.composite
def hostile_rtp(draw: st.DrawFn) -> HostileRtp:
    kind, data = draw(_PACKETS)
    return HostileRtp(
        kind=kind,
        data=data,
        source=draw(st.sampled_from(FOREIGN_SOURCES)),
        port=draw(st.sampled_from(["rtp", "rtp", "rtp", "rtcp"])),
    )
