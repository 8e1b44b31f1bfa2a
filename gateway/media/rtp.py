"""RTP fixed header parsing and building (RFC 3550 §5.1), plus 16/32-bit serial-number arithmetic.

Parsing runs in ``datagram_received`` for every packet, so it is one ``struct.unpack_from`` plus a few
integer checks, and returns a :class:`RtpPacket`: a plain class with ``__slots__``, which the compiled build
(ADR 0008) makes a native class, built without a call into the interpreter. A ``NamedTuple`` is built through
its generated (interpreted) ``__new__``, and a frozen dataclass through the interpreted ``__init__`` that
``dataclasses`` writes for it; compiled with mypyc, a parse that returned either cost more per packet than one
that returns this class (docs/performance/2026-12-03-compiled-records.md).

Validity checks follow RFC 3550 §5.1 and A.1: version must be 2; the CSRC list, the header extension
(§5.3.1: 16-bit profile, 16-bit length in 32-bit words) and the padding (§5.1: the last octet counts the
padding octets including itself, so it is at least 1) must all fit inside the datagram. Each failure raises
:class:`RtpError` with one of :data:`RTP_ERROR_REASONS`.
"""

from __future__ import annotations

import struct
from typing import final

from gateway.media.errors import LocalMediaError, RtpError

RTP_VERSION = 2
RTP_HEADER_SIZE = 12

#: Stable labels for :attr:`RtpError.reason`.
RTP_ERROR_REASONS = ("short", "version", "csrc_count", "extension_length", "padding")

_HEADER = struct.Struct("!BBHII")
_EXTENSION = struct.Struct("!HH")

SEQ_MOD = 1 << 16
TS_MOD = 1 << 32


@final
class RtpPacket:
    """One parsed RTP packet; ``payload`` has the header, extension and padding removed. Read-only by convention:
    the parser makes it and the media path only reads it."""

    __slots__ = (
        "csrc",
        "extension_data",
        "extension_profile",
        "marker",
        "payload",
        "payload_type",
        "sequence_number",
        "ssrc",
        "timestamp",
    )

    def __init__(
        self,
        marker: bool,
        payload_type: int,
        sequence_number: int,
        timestamp: int,
        ssrc: int,
        payload: bytes,
        csrc: tuple[int, ...] = (),
        extension_profile: int | None = None,
        extension_data: bytes = b"",
    ) -> None:
        self.marker = marker
        self.payload_type = payload_type
        self.sequence_number = sequence_number
        self.timestamp = timestamp
        self.ssrc = ssrc
        self.payload = payload
        self.csrc = csrc
        self.extension_profile = extension_profile
        self.extension_data = extension_data

    def __repr__(self) -> str:
        return (
            f"RtpPacket(pt={self.payload_type}, seq={self.sequence_number}, ts={self.timestamp}, "
            f"ssrc={self.ssrc:#010x}, marker={self.marker}, payload={len(self.payload)} bytes)"
        )


def parse_rtp(data: bytes) -> RtpPacket:
    """Parse one RTP datagram. Raises :class:`RtpError` (and nothing else) for any malformed input."""
    size = len(data)
    if size < RTP_HEADER_SIZE:
        raise RtpError("short", f"{size} bytes, the fixed header needs {RTP_HEADER_SIZE}")
    b0, b1, seq, ts, ssrc = _HEADER.unpack_from(data)
    if b0 >> 6 != RTP_VERSION:
        raise RtpError("version", f"version {b0 >> 6}, expected 2")
    offset = RTP_HEADER_SIZE
    csrc: tuple[int, ...] = ()
    cc = b0 & 0x0F
    if cc:
        offset += 4 * cc
        if offset > size:
            raise RtpError("csrc_count", f"CSRC count {cc} needs {offset} bytes, datagram has {size}")
        csrc = struct.unpack_from(f"!{cc}I", data, RTP_HEADER_SIZE)
    end = size
    if b0 & 0x20:
        pad = data[-1]
        if pad == 0 or pad > size - offset:
            raise RtpError("padding", f"padding count {pad} with {size - offset} bytes after the header")
        end -= pad
    ext_profile: int | None = None
    ext_data = b""
    if b0 & 0x10:
        if offset + 4 > end:
            raise RtpError("extension_length", "header extension announced but no room for its header")
        ext_profile, words = _EXTENSION.unpack_from(data, offset)
        ext_start = offset + 4
        offset = ext_start + 4 * words
        if offset > end:
            raise RtpError("extension_length", f"extension of {words} words overruns the packet")
        ext_data = data[ext_start:offset]
    return RtpPacket(bool(b1 & 0x80), b1 & 0x7F, seq, ts, ssrc, data[offset:end], csrc, ext_profile, ext_data)


def build_rtp(
    *,
    payload_type: int,
    sequence_number: int,
    timestamp: int,
    ssrc: int,
    payload: bytes,
    marker: bool = False,
    csrc: tuple[int, ...] = (),
) -> bytes:
    """Serialize one RTP packet (version 2, no padding, no extension)."""
    if not 0 <= payload_type <= 127:
        raise LocalMediaError(f"payload type {payload_type} is outside 0..127")
    if len(csrc) > 15:
        raise LocalMediaError(f"at most 15 CSRCs, got {len(csrc)}")
    header = _HEADER.pack(
        0x80 | len(csrc),
        (0x80 if marker else 0) | payload_type,
        sequence_number & 0xFFFF,
        timestamp & 0xFFFFFFFF,
        ssrc & 0xFFFFFFFF,
    )
    if csrc:
        header += struct.pack(f"!{len(csrc)}I", *csrc)
    return header + payload


def pack_rtp_header(marker: bool, payload_type: int, sequence_number: int, timestamp: int, ssrc: int) -> bytes:
    """The 12-byte fixed header, unchecked: the hot path of the outbound tick (inputs come from validated state)."""
    return _HEADER.pack(0x80, (0x80 if marker else 0) | payload_type, sequence_number, timestamp, ssrc)


def looks_like_rtcp(data: bytes) -> bool:
    """RFC 5761 §4: with rtcp-mux, a second octet in 192..223 (RTCP packet types 192-223) is RTCP, not RTP."""
    return len(data) >= 2 and 192 <= data[1] <= 223


def seq_delta(a: int, b: int) -> int:
    """Signed distance a - b between two 16-bit sequence numbers, in -32768..32767."""
    return ((a - b + 0x8000) & 0xFFFF) - 0x8000


def ts_delta(a: int, b: int) -> int:
    """Signed distance a - b between two 32-bit RTP timestamps, in -2**31..2**31-1."""
    return ((a - b + 0x80000000) & 0xFFFFFFFF) - 0x80000000
