"""RTCP sender/receiver reports (RFC 3550 §6.4), SDES CNAME (§6.5) and BYE (§6.6) in compound packets.

Parsing applies the A.2 validity checks: every packet is version 2 and its length fits the datagram, only
the last packet may be padded, and the first packet of a compound is SR or RR. Report blocks whose count
overruns the packet are rejected. Failures raise :class:`RtcpError` with one of :data:`RTCP_ERROR_REASONS`;
SDES, APP and unknown packet types are skipped.

Round-trip time (§6.4.1): ``A - LSR - DLSR`` in 1/65536 s, where A is the arrival time as the middle 32
bits of the NTP timestamp, LSR echoes the middle 32 bits of our last SR and DLSR is the peer's delay since
receiving it. Only consistency matters, so "now" may be any clock as long as SRs and RTT use the same one;
the tick engine uses the wall clock passed in.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

from gateway.media.errors import LocalMediaError, RtcpError

PT_SR = 200
PT_RR = 201
PT_SDES = 202
PT_BYE = 203

#: Stable labels for :attr:`RtcpError.reason`.
RTCP_ERROR_REASONS = ("short", "version", "length", "padding", "first_not_report", "report_count")

NTP_EPOCH_OFFSET = 2_208_988_800  # seconds from 1900-01-01 (NTP) to 1970-01-01 (Unix)

_HEADER = struct.Struct("!BBH")
_SR_INFO = struct.Struct("!IIIIII")  # SSRC, NTP msw, NTP lsw, RTP ts, packet count, octet count
_BLOCK = struct.Struct("!IIIIII")  # SSRC, fraction|cumulative, ext highest seq, jitter, LSR, DLSR


class ReportBlock(NamedTuple):
    """One reception report (§6.4.1) about source ``ssrc``."""

    ssrc: int
    fraction_lost: int  # 0..255, fixed point /256
    cumulative_lost: int  # signed 24-bit
    highest_seq: int
    jitter: int  # timestamp units
    lsr: int
    dlsr: int  # 1/65536 s


@dataclass(frozen=True, slots=True, kw_only=True)
class SenderReport:
    ssrc: int
    ntp_timestamp: int
    rtp_timestamp: int
    packet_count: int
    octet_count: int
    reports: tuple[ReportBlock, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ReceiverReport:
    ssrc: int
    reports: tuple[ReportBlock, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Bye:
    ssrcs: tuple[int, ...]
    reason: str = ""


RtcpPacket = SenderReport | ReceiverReport | Bye


# ------------------------------------------------------------------------------------------------ time


def ntp_timestamp(seconds: float) -> int:
    """64-bit NTP timestamp of a Unix-epoch time in seconds."""
    ntp = seconds + NTP_EPOCH_OFFSET
    whole = int(ntp)
    return ((whole & 0xFFFFFFFF) << 32) | int((ntp - whole) * (1 << 32))


def ntp_middle(ntp: int) -> int:
    """The middle 32 bits of a 64-bit NTP timestamp (the LSR / arrival format of §6.4.1)."""
    return (ntp >> 16) & 0xFFFFFFFF


def round_trip_seconds(block: ReportBlock, arrival_ntp: int) -> float | None:
    """RTT from a report block about our stream; None without an LSR or if clocks make it negative."""
    if block.lsr == 0:
        return None
    rtt = (ntp_middle(arrival_ntp) - block.lsr - block.dlsr) & 0xFFFFFFFF
    if rtt >= 0x80000000:
        return None
    return rtt / 65536.0


# ---------------------------------------------------------------------------------------------- build


def _pack_blocks(blocks: tuple[ReportBlock, ...]) -> bytes:
    return b"".join(
        _BLOCK.pack(
            b.ssrc,
            ((b.fraction_lost & 0xFF) << 24) | (b.cumulative_lost & 0xFFFFFF),
            b.highest_seq & 0xFFFFFFFF,
            b.jitter & 0xFFFFFFFF,
            b.lsr & 0xFFFFFFFF,
            b.dlsr & 0xFFFFFFFF,
        )
        for b in blocks
    )


def _sdes_cname(ssrc: int, cname: str) -> bytes:
    text = cname.encode()[:255]
    chunk = struct.pack("!IBB", ssrc, 1, len(text)) + text + b"\x00"
    chunk += b"\x00" * (-len(chunk) % 4)
    return _HEADER.pack(0x81, PT_SDES, (4 + len(chunk)) // 4 - 1) + chunk


def build_report(
    *,
    ssrc: int,
    cname: str,
    sender: SenderReport | None = None,
    reports: tuple[ReportBlock, ...] = (),
) -> bytes:
    """A compound packet: SR (when ``sender`` is given: we sent RTP) or RR, then SDES CNAME (§6.1)."""
    if len(reports) > 31:
        raise LocalMediaError(f"at most 31 report blocks per packet, got {len(reports)}")
    blocks = _pack_blocks(reports)
    if sender is not None:
        body = _SR_INFO.pack(
            ssrc,
            (sender.ntp_timestamp >> 32) & 0xFFFFFFFF,
            sender.ntp_timestamp & 0xFFFFFFFF,
            sender.rtp_timestamp & 0xFFFFFFFF,
            sender.packet_count & 0xFFFFFFFF,
            sender.octet_count & 0xFFFFFFFF,
        )
        pt = PT_SR
    else:
        body = struct.pack("!I", ssrc)
        pt = PT_RR
    body += blocks
    first = _HEADER.pack(0x80 | len(reports), pt, (4 + len(body)) // 4 - 1) + body
    return first + _sdes_cname(ssrc, cname)


def build_bye(*, ssrc: int, cname: str, reason: str = "") -> bytes:
    """RR (empty) + SDES + BYE, the compound a leaving source sends (§6.6)."""
    body = struct.pack("!I", ssrc)
    if reason:
        text = reason.encode()[:255]
        body += bytes([len(text)]) + text
        body += b"\x00" * (-len(body) % 4)
    bye = _HEADER.pack(0x81, PT_BYE, (4 + len(body)) // 4 - 1) + body
    return build_report(ssrc=ssrc, cname=cname) + bye


# ---------------------------------------------------------------------------------------------- parse


def parse_rtcp(data: bytes) -> list[RtcpPacket]:
    """SR, RR and BYE packets of one compound datagram. Raises :class:`RtcpError` (only) when malformed."""
    size = len(data)
    if size < 8:
        raise RtcpError("short", f"{size} bytes, an RTCP packet needs at least 8")
    out: list[RtcpPacket] = []
    offset = 0
    while offset < size:
        if size - offset < 4:
            raise RtcpError("short", f"{size - offset} trailing bytes")
        b0, pt, words = _HEADER.unpack_from(data, offset)
        if b0 >> 6 != 2:
            raise RtcpError("version", f"version {b0 >> 6} at offset {offset}")
        end = offset + 4 * (words + 1)
        if end > size:
            raise RtcpError("length", f"packet at {offset} claims {4 * (words + 1)} bytes, {size - offset} left")
        if offset == 0 and pt not in (PT_SR, PT_RR):
            raise RtcpError("first_not_report", f"compound starts with packet type {pt}")
        body_end = end
        if b0 & 0x20:
            if end != size:
                raise RtcpError("padding", "only the last packet of a compound may be padded")
            pad = data[end - 1]
            if pad == 0 or pad > end - offset - 4:
                raise RtcpError("padding", f"padding count {pad}")
            body_end -= pad
        count = b0 & 0x1F
        if pt == PT_SR:
            need = offset + 4 + _SR_INFO.size + count * _BLOCK.size
            if need > body_end:
                raise RtcpError("report_count", f"SR with {count} blocks needs {need - offset} bytes")
            ssrc, msw, lsw, rtp_ts, packets, octets = _SR_INFO.unpack_from(data, offset + 4)
            blocks = _parse_blocks(data, offset + 4 + _SR_INFO.size, count)
            out.append(
                SenderReport(
                    ssrc=ssrc,
                    ntp_timestamp=(msw << 32) | lsw,
                    rtp_timestamp=rtp_ts,
                    packet_count=packets,
                    octet_count=octets,
                    reports=blocks,
                )
            )
        elif pt == PT_RR:
            need = offset + 8 + count * _BLOCK.size
            if need > body_end:
                raise RtcpError("report_count", f"RR with {count} blocks needs {need - offset} bytes")
            (ssrc,) = struct.unpack_from("!I", data, offset + 4)
            out.append(ReceiverReport(ssrc=ssrc, reports=_parse_blocks(data, offset + 8, count)))
        elif pt == PT_BYE:
            if offset + 4 + 4 * count > body_end:
                raise RtcpError("report_count", f"BYE with {count} sources overruns the packet")
            ssrcs = struct.unpack_from(f"!{count}I", data, offset + 4)
            reason = ""
            at = offset + 4 + 4 * count
            if at < body_end:
                length = data[at]
                reason = data[at + 1 : min(at + 1 + length, body_end)].decode("utf-8", "replace")
            out.append(Bye(ssrcs=tuple(ssrcs), reason=reason))
        offset = end
    return out


def _parse_blocks(data: bytes, offset: int, count: int) -> tuple[ReportBlock, ...]:
    blocks = []
    for i in range(count):
        ssrc, lost_word, highest, jitter, lsr, dlsr = _BLOCK.unpack_from(data, offset + i * _BLOCK.size)
        cumulative = lost_word & 0xFFFFFF
        if cumulative & 0x800000:
            cumulative -= 0x1000000
        blocks.append(ReportBlock(ssrc, lost_word >> 24, cumulative, highest, jitter, lsr, dlsr))
    return tuple(blocks)
