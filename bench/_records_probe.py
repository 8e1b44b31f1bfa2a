"""What ``gateway bench records`` compiles with mypyc and times: one RTP parse, returning three kinds of record.

The parse is :func:`gateway.media.rtp.parse_rtp`'s fast path (one ``struct.unpack_from``, the payload sliced
off); only the record it returns differs: a ``NamedTuple``, a frozen dataclass, and a plain class with
``__slots__`` (what ``parse_rtp`` returns). Each ``loop_*`` parses the same datagram ``n`` times and reads two
fields of each record, as the receive path does. Kept apart from the gateway's modules so that the bench can
compile it on its own, in a few seconds, exactly as ``gateway compile`` compiles the media plane.

``SlotsRecord`` is ``RtpPacket``'s shape, copied rather than imported, and each loop names its record class
rather than taking one as an argument: mypyc builds a native class directly only when the call names a class
it compiled (``parse_rtp`` and ``RtpPacket`` share their module too). An imported or passed-in class is called
through the generic call path, which is what the bench must not measure for the slots class.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple, final

_HEADER = struct.Struct("!BBHII")
_HEADER_SIZE = 12


class TupleRecord(NamedTuple):
    marker: bool
    payload_type: int
    sequence_number: int
    timestamp: int
    ssrc: int
    payload: bytes
    csrc: tuple[int, ...] = ()
    extension_profile: int | None = None
    extension_data: bytes = b""


@final
@dataclass(frozen=True, slots=True)
class FrozenRecord:
    marker: bool
    payload_type: int
    sequence_number: int
    timestamp: int
    ssrc: int
    payload: bytes
    csrc: tuple[int, ...] = ()
    extension_profile: int | None = None
    extension_data: bytes = b""


@final
class SlotsRecord:
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


def loop_unpack_only(data: bytes, n: int) -> int:
    """The parse without a record: what the three records are measured against."""
    total = 0
    for _ in range(n):
        _b0, _b1, seq, _ts, _ssrc = _HEADER.unpack_from(data)
        total += seq + len(data[_HEADER_SIZE:])
    return total


def loop_tuple(data: bytes, n: int) -> int:
    total = 0
    for _ in range(n):
        _b0, b1, seq, ts, ssrc = _HEADER.unpack_from(data)
        packet = TupleRecord(bool(b1 & 0x80), b1 & 0x7F, seq, ts, ssrc, data[_HEADER_SIZE:])
        total += packet.sequence_number + len(packet.payload)
    return total


def loop_frozen(data: bytes, n: int) -> int:
    total = 0
    for _ in range(n):
        _b0, b1, seq, ts, ssrc = _HEADER.unpack_from(data)
        packet = FrozenRecord(bool(b1 & 0x80), b1 & 0x7F, seq, ts, ssrc, data[_HEADER_SIZE:])
        total += packet.sequence_number + len(packet.payload)
    return total


def loop_slots(data: bytes, n: int) -> int:
    total = 0
    for _ in range(n):
        _b0, b1, seq, ts, ssrc = _HEADER.unpack_from(data)
        packet = SlotsRecord(bool(b1 & 0x80), b1 & 0x7F, seq, ts, ssrc, data[_HEADER_SIZE:])
        total += packet.sequence_number + len(packet.payload)
    return total
