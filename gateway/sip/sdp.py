"""SDP session descriptions (RFC 4566) and the audio offer/answer model (RFC 3264) of the gateway.

Owns: parsing and serializing SDP (v/o/s/c/b/t/m/a lines plus i/u/e/p/r/z/k kept verbatim), the frozen
value types that describe it, the choice of ONE audio codec among PCMU/8000, PCMA/8000, G722/8000 and
opus/48000/2 (RFC 7587) together with RFC 4733 telephone-event, and building answers and offers.

Rules followed, and why:

* RFC 4566 §5: ``v=`` comes first, ``o=`` and ``s=`` are required, an unknown type letter rejects the whole
  description. Every media line with a non-zero port needs a ``c=`` at media or session level. Lines may end
  in CRLF or bare LF (many stacks send LF only).
* RFC 3551 §6: static payload types (0 = PCMU/8000, 8 = PCMA/8000, 9 = G722/8000, ...) may come without
  ``a=rtpmap``; dynamic ones (96-127) without an rtpmap are kept in ``formats`` but have no :class:`Codec`.
* RFC 3551 §4.5.2: G.722 samples at 16 kHz but is signalled, and clocked in RTP, at 8000 (an error kept for
  compatibility): ``G722/8000`` is the only G.722 taken, and its telephone-events are the 8000 Hz ones.
* RFC 3264 §6: the answer has as many m-lines as the offer, in order; streams we do not take (video,
  further audio, SRTP profiles unless gateway/sip/sdes.py takes them) are answered with port 0.
  Payload-type numbers are the offer's (§6.1), so the numbers we send with are the numbers the remote
  declared it receives.
* RFC 3264 §6.1 / §8.4: directions are mirrored (offer sendonly -> answer recvonly, recvonly -> sendonly,
  inactive -> inactive); ``c=0.0.0.0`` (RFC 2543 hold) means the remote does not want media, so we do
  not send but stay ready to receive.
* RFC 3264 §8: re-offers keep the ``o=`` session id and raise the version by one only when the
  description changed -- :func:`next_session_version` does exactly that.

Error tree: :class:`SdpError` (malformed description, answer 400) and :class:`NoCommonCodec` (well-formed
but unacceptable, answer 488) are both :class:`~gateway.sip.errors.RemoteProtocolError`.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field, replace
from typing import Literal, get_args

from .errors import RemoteProtocolError

Direction = Literal["sendrecv", "sendonly", "recvonly", "inactive"]
DIRECTIONS: tuple[Direction, ...] = get_args(Direction)
_DIRECTION_BY_NAME: dict[str, Direction] = {d: d for d in DIRECTIONS}
SUPPORTED_CODECS: tuple[str, ...] = ("PCMU", "PCMA", "opus", "G722")
RTP_PROFILES = frozenset({"RTP/AVP", "RTP/AVPF"})  # plain RTP; SRTP profiles are gateway/sip/sdes.py's
SRTP_PROFILES = frozenset({"RTP/SAVP", "RTP/SAVPF"})  # SDES-keyed SRTP (RFC 4568), negotiated by sdes.py

# RFC 3551 table 4: audio payload types that need no rtpmap.
STATIC_PAYLOAD_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("PCMU", 8000, 1), 3: ("GSM", 8000, 1), 4: ("G723", 8000, 1), 5: ("DVI4", 8000, 1), 6: ("DVI4", 16000, 1),
    7: ("LPC", 8000, 1), 8: ("PCMA", 8000, 1), 9: ("G722", 8000, 1), 10: ("L16", 44100, 2), 11: ("L16", 44100, 1),
    12: ("QCELP", 8000, 1), 13: ("CN", 8000, 1), 14: ("MPA", 90000, 1), 15: ("G728", 8000, 1),
    16: ("DVI4", 11025, 1), 17: ("DVI4", 22050, 1), 18: ("G729", 8000, 1),
}  # fmt: skip
# (name, clock, channels) of the codecs we can carry; opus is always signalled as 2 channels (RFC 7587 §7), G.722
# at its RTP clock of 8000, not its 16 kHz sampling rate (RFC 3551 §4.5.2).
_CODEC_SHAPES: dict[str, tuple[int, int]] = {
    "PCMU": (8000, 1),
    "PCMA": (8000, 1),
    "opus": (48000, 2),
    "G722": (8000, 1),
}
_PAYLOAD_TYPES_WE_OFFER = {"PCMU": 0, "PCMA": 8, "opus": 111, "G722": 9}
_TE_PT_8000, _TE_PT_48000 = 101, 110
DEFAULT_PTIME, MAX_PTIME = 20, 120  # 120 ms: the longest opus packet (RFC 6716 §3.2.5)
_HOLD_ADDRESSES = frozenset({"0.0.0.0", "::"})

_SESSION_TYPES = frozenset("vosiuepcbtrzka")
_MEDIA_TYPES = frozenset("icbka")
# RFC 4566 §5 field order, used to put verbatim extras (i/u/e/p/r/z/k) back where they belong.
_EXTRA_RANK = {"i": 0, "u": 1, "e": 2, "p": 3, "r": 4, "z": 5, "k": 6}
_FQDN = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.?$")
_TOKEN = re.compile(r"^[!#$%&'*+\-.0-9A-Z^_`a-z{|}~]+$")
_UINT = re.compile(r"^[0-9]+$")


class SdpError(RemoteProtocolError):
    """A session description is malformed; ``line_number`` (1-based) points at the offending line if any."""

    def __init__(self, reason: str, *, line_number: int | None = None) -> None:
        text = f"line {line_number}: {reason}" if line_number is not None else reason
        super().__init__(f"SDP: {text}", status_code=400)
        self.line_number = line_number


class NoCommonCodec(RemoteProtocolError):
    """The offer is well-formed but has no audio stream we can take: answer 488 Not Acceptable Here."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"SDP: {reason}", status_code=488)


# ------------------------------------------------------------------------------------------ value types


@dataclass(frozen=True, slots=True, kw_only=True)
class Connection:
    """A ``c=`` line (or the address part of ``a=rtcp``): ``IN IP4|IP6 <address>[/ttl...]``."""

    address: str
    address_type: Literal["IP4", "IP6"] = "IP4"
    multicast_suffix: str = ""  # "/127" or "/127/3" as written; unicast telephony never has one

    def to_text(self) -> str:
        return f"IN {self.address_type} {self.address}{self.multicast_suffix}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Origin:
    """The ``o=`` line: who made the description, and which version of it this is."""

    username: str = "-"
    session_id: int
    session_version: int
    address: str
    address_type: Literal["IP4", "IP6"] = "IP4"


@dataclass(frozen=True, slots=True, kw_only=True)
class Codec:
    """One RTP payload format of a media line: from ``a=rtpmap`` (or the static table) and ``a=fmtp``."""

    payload_type: int
    name: str
    clock_rate: int
    channels: int = 1
    fmtp: str = ""  # the parameter string after "a=fmtp:<pt> ", verbatim

    def fmtp_params(self) -> dict[str, str]:
        """``a=fmtp`` as ``key=value;...`` pairs (keys lower-cased); bare flags map to ``""``."""
        params: dict[str, str] = {}
        for item in self.fmtp.split(";"):
            key, _, value = item.strip().partition("=")
            if key:
                params[key.lower()] = value.strip()
        return params


@dataclass(frozen=True, slots=True, kw_only=True)
class Attribute:
    """An ``a=`` line we carry without interpreting (``a=name`` or ``a=name:value``)."""

    name: str
    value: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Rtcp:
    """RFC 3605 ``a=rtcp:<port> [IN IP4 <address>]``."""

    port: int
    connection: Connection | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class MediaDescription:
    """One ``m=`` section. ``direction`` is the media-level attribute only (None when absent)."""

    media: str
    port: int
    proto: str
    formats: tuple[str, ...]
    port_count: int | None = None
    codecs: tuple[Codec, ...] = ()
    connection: Connection | None = None
    bandwidths: tuple[str, ...] = ()
    direction: Direction | None = None
    ptime: int | None = None
    maxptime: int | None = None
    rtcp: Rtcp | None = None
    attributes: tuple[Attribute, ...] = ()
    extra_fields: tuple[tuple[str, str], ...] = ()  # i= and k= lines, verbatim

    @property
    def is_rtp(self) -> bool:
        return _is_rtp(self.proto)

    def codec(self, payload_type: int) -> Codec | None:
        return next((c for c in self.codecs if c.payload_type == payload_type), None)


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionDescription:
    """A whole description. ``direction`` is the session-level attribute (None when absent)."""

    origin: Origin
    session_name: str = "-"
    connection: Connection | None = None
    bandwidths: tuple[str, ...] = ()
    times: tuple[tuple[int, int], ...] = ((0, 0),)
    direction: Direction | None = None
    attributes: tuple[Attribute, ...] = ()
    media: tuple[MediaDescription, ...] = ()
    extra_fields: tuple[tuple[str, str], ...] = ()  # i/u/e/p/r/z/k lines, verbatim

    def direction_of(self, media: MediaDescription) -> Direction:
        """Effective direction of a stream: media level overrides session level; default sendrecv."""
        return media.direction or self.direction or "sendrecv"

    def connection_of(self, media: MediaDescription) -> Connection | None:
        """Effective connection of a stream: media-level ``c=`` over session-level."""
        return media.connection or self.connection

    def is_hold(self, media: MediaDescription) -> bool:
        """Whether this stream puts the other side on hold (sendonly/inactive, or RFC 2543 c=0.0.0.0)."""
        connection = self.connection_of(media)
        if connection is not None and connection.address in _HOLD_ADDRESSES:
            return True
        return self.direction_of(media) in ("sendonly", "inactive")

    def to_bytes(self) -> bytes:
        return serialize_sdp(self).encode("utf-8")


# ----------------------------------------------------------------------------------------------- parser


def _uint(text: str, what: str, line_number: int, *, maximum: int | None = None) -> int:
    if not _UINT.match(text) or len(text) > 20:
        raise SdpError(f"bad {what} {text[:40]!r}", line_number=line_number)
    value = int(text)
    if maximum is not None and value > maximum:
        raise SdpError(f"{what} {value} out of range", line_number=line_number)
    return value


def _address_type(text: str, line_number: int) -> Literal["IP4", "IP6"]:
    if text == "IP4":
        return "IP4"
    if text == "IP6":
        return "IP6"
    raise SdpError(f"unsupported address type {text[:20]!r}", line_number=line_number)


def _check_address(address: str, address_type: str, line_number: int) -> None:
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        if _FQDN.match(address) and not address.replace(".", "").isdigit():
            return  # RFC 4566 allows a fully qualified domain name here
        raise SdpError(f"bad address {address[:60]!r}", line_number=line_number) from None
    if (parsed.version == 4) != (address_type == "IP4"):
        raise SdpError(f"address {address!r} is not {address_type}", line_number=line_number)


def _connection(value: str, line_number: int) -> Connection:
    parts = value.split()
    if len(parts) != 3 or parts[0] != "IN":
        raise SdpError(f"bad c= line {value[:60]!r}", line_number=line_number)
    address_type = _address_type(parts[1], line_number)
    address, slash, suffix = parts[2].partition("/")
    _check_address(address, address_type, line_number)
    if slash and not all(_UINT.match(p) for p in suffix.split("/")):
        raise SdpError(f"bad multicast suffix in {parts[2][:60]!r}", line_number=line_number)
    return Connection(address=address, address_type=address_type, multicast_suffix=slash + suffix)


def _origin(value: str, line_number: int) -> Origin:
    parts = value.split()
    if len(parts) != 6 or parts[3] != "IN":
        raise SdpError(f"bad o= line {value[:60]!r}", line_number=line_number)
    address_type = _address_type(parts[4], line_number)
    _check_address(parts[5], address_type, line_number)
    return Origin(
        username=parts[0],
        session_id=_uint(parts[1], "session id", line_number),
        session_version=_uint(parts[2], "session version", line_number),
        address=parts[5],
        address_type=address_type,
    )


def _bandwidth(value: str, line_number: int) -> str:
    kind, colon, amount = value.partition(":")
    if not colon or not _TOKEN.match(kind) or not _UINT.match(amount):
        raise SdpError(f"bad b= line {value[:60]!r}", line_number=line_number)
    return value


def _ptime(value: str, what: str, line_number: int) -> int:
    # Some stacks write "20.0"; the value is still whole milliseconds.
    match = re.fullmatch(r"([0-9]{1,6})(?:\.[0-9]{1,6})?", value.strip())
    if match is None:
        raise SdpError(f"bad a={what} value {value[:40]!r}", line_number=line_number)
    return int(match.group(1))


@dataclass(slots=True)
class _MediaBuilder:
    """Mutable accumulator for one m= section while its lines are read."""

    line_number: int
    media: str
    port: int
    port_count: int | None
    proto: str
    formats: tuple[str, ...]
    connection: Connection | None = None
    direction: Direction | None = None
    ptime: int | None = None
    maxptime: int | None = None
    rtcp: Rtcp | None = None
    bandwidths: list[str] = field(default_factory=list)
    rtpmaps: dict[int, tuple[str, int, int]] = field(default_factory=dict)
    fmtps: dict[str, str] = field(default_factory=dict)
    attributes: list[Attribute] = field(default_factory=list)
    extra_fields: list[tuple[str, str]] = field(default_factory=list)

    def build(self) -> MediaDescription:
        codecs: list[Codec] = []
        if _is_rtp(self.proto):
            for fmt in self.formats:
                pt = int(fmt)
                shape = self.rtpmaps.get(pt) or (STATIC_PAYLOAD_TYPES.get(pt) if self.media == "audio" else None)
                if shape is not None:
                    name, clock, channels = shape
                    fmtp = self.fmtps.get(fmt, "")
                    codecs.append(Codec(payload_type=pt, name=name, clock_rate=clock, channels=channels, fmtp=fmtp))
        return MediaDescription(
            media=self.media,
            port=self.port,
            port_count=self.port_count,
            proto=self.proto,
            formats=self.formats,
            codecs=tuple(codecs),
            connection=self.connection,
            bandwidths=tuple(self.bandwidths),
            direction=self.direction,
            ptime=self.ptime,
            maxptime=self.maxptime,
            rtcp=self.rtcp,
            attributes=tuple(self.attributes),
            extra_fields=_in_rfc_order(self.extra_fields),
        )


def _in_rfc_order(extras: list[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    # Stored in the order they are written back, so parse(serialize(x)) == x even for sloppy input order.
    return tuple(sorted(extras, key=lambda item: _EXTRA_RANK[item[0]]))


def _is_rtp(proto: str) -> bool:
    return proto.upper().startswith("RTP/") or "/RTP/" in proto.upper()


def _media_line(value: str, line_number: int) -> _MediaBuilder:
    parts = value.split()
    if len(parts) < 3:
        raise SdpError(f"bad m= line {value[:60]!r}", line_number=line_number)
    media, port_text, proto, *formats = parts
    if not _TOKEN.match(media) or not all(_TOKEN.match(p) for p in proto.split("/")):
        raise SdpError(f"bad m= line {value[:60]!r}", line_number=line_number)
    port_part, slash, count_part = port_text.partition("/")
    port = _uint(port_part, "port", line_number, maximum=65535)
    port_count = _uint(count_part, "port count", line_number, maximum=65535) if slash else None
    if _is_rtp(proto):  # payload types are numbers: "096" and "96" are the same one
        formats = [str(_uint(fmt, "payload type", line_number, maximum=127)) for fmt in formats]
    return _MediaBuilder(line_number, media, port, port_count, proto, tuple(formats))


def _rtpmap(value: str, line_number: int) -> tuple[int, tuple[str, int, int]]:
    pt_text, _, encoding = value.partition(" ")
    pt = _uint(pt_text, "rtpmap payload type", line_number, maximum=127)
    parts = encoding.strip().split("/")
    if len(parts) not in (2, 3) or not _TOKEN.match(parts[0]):
        raise SdpError(f"bad a=rtpmap {value[:60]!r}", line_number=line_number)
    clock = _uint(parts[1], "rtpmap clock rate", line_number)
    channels = _uint(parts[2], "rtpmap channels", line_number) if len(parts) == 3 else 1
    if clock == 0 or channels == 0:
        raise SdpError(f"bad a=rtpmap {value[:60]!r}", line_number=line_number)
    return pt, (parts[0], clock, channels)


def _rtcp(value: str, line_number: int) -> Rtcp:
    port_text, _, rest = value.strip().partition(" ")
    port = _uint(port_text, "a=rtcp port", line_number, maximum=65535)
    return Rtcp(port=port, connection=_connection(rest, line_number) if rest.strip() else None)


def _split_lines(data: bytes) -> list[tuple[int, str]]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SdpError(f"not UTF-8 at byte {exc.start}") from None
    lines = []
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.rstrip(" \t\r")  # trailing blanks ("a=sendrecv ", "s= ") are common and meaningless
        if line:  # tolerate blank lines (trailing CRLF, sloppy stacks)
            lines.append((number, line))
    return lines


def parse_sdp(data: bytes) -> SessionDescription:
    """Parse one session description; raises :class:`SdpError` (and nothing else) on malformed input."""
    lines = _split_lines(data)
    if not lines or lines[0][1] != "v=0":
        raise SdpError("description must start with v=0", line_number=lines[0][0] if lines else None)
    origin: Origin | None = None
    session_name: str | None = None
    session_connection: Connection | None = None
    session_direction: Direction | None = None
    bandwidths: list[str] = []
    times: list[tuple[int, int]] = []
    attributes: list[Attribute] = []
    extras: list[tuple[str, str]] = []
    media: list[_MediaBuilder] = []

    for number, line in lines[1:]:
        if len(line) < 2 or line[1] != "=" or not ("a" <= line[0] <= "z"):
            raise SdpError(f"expected <type>=<value>, got {line[:60]!r}", line_number=number)
        kind, value = line[0], line[2:]
        current = media[-1] if media else None
        if kind == "m":
            media.append(_media_line(value, number))
        elif current is not None and kind not in _MEDIA_TYPES:
            raise SdpError(f"{kind}= is not allowed inside a media section", line_number=number)
        elif kind not in _SESSION_TYPES:
            raise SdpError(f"unknown line type {kind}=", line_number=number)
        elif kind == "v":
            raise SdpError("duplicate v= line", line_number=number)
        elif kind == "o":
            if origin is not None:
                raise SdpError("duplicate o= line", line_number=number)
            origin = _origin(value, number)
        elif kind == "s":
            if session_name is not None:
                raise SdpError("duplicate s= line", line_number=number)
            session_name = value
        elif kind == "t":
            parts = value.split()
            if len(parts) != 2:
                raise SdpError(f"bad t= line {value[:60]!r}", line_number=number)
            times.append((_uint(parts[0], "start time", number), _uint(parts[1], "stop time", number)))
        elif kind == "c":
            connection = _connection(value, number)
            if current is None:
                if session_connection is not None:
                    raise SdpError("duplicate session-level c= line", line_number=number)
                session_connection = connection
            else:
                if current.connection is not None:
                    raise SdpError("duplicate media-level c= line", line_number=number)
                current.connection = connection
        elif kind == "b":
            (bandwidths if current is None else current.bandwidths).append(_bandwidth(value, number))
        elif kind == "a":
            name, colon, attr_value = value.partition(":")
            if not _TOKEN.match(name):
                raise SdpError(f"bad attribute name {name[:40]!r}", line_number=number)
            direction = _DIRECTION_BY_NAME.get(name)
            if direction is not None:
                if colon:
                    raise SdpError(f"a={name} takes no value", line_number=number)
                if current is None:
                    session_direction = direction
                else:
                    current.direction = direction
            elif current is None:
                attributes.append(Attribute(name=name, value=attr_value if colon else None))
            else:
                _media_attribute(current, name, attr_value if colon else None, number)
        else:  # i u e p r z k: kept verbatim
            (extras if current is None else current.extra_fields).append((kind, value))

    if origin is None:
        raise SdpError("missing o= line")
    if session_name is None:
        raise SdpError("missing s= line")
    if not media:
        raise SdpError("missing m= line")
    for section in media:
        if section.port != 0 and section.connection is None and session_connection is None:
            raise SdpError("no c= line for this media section", line_number=section.line_number)
    return SessionDescription(
        origin=origin,
        session_name=session_name,
        connection=session_connection,
        bandwidths=tuple(bandwidths),
        times=tuple(times) or ((0, 0),),
        direction=session_direction,
        attributes=tuple(attributes),
        media=tuple(section.build() for section in media),
        extra_fields=_in_rfc_order(extras),
    )


def _media_attribute(builder: _MediaBuilder, name: str, value: str | None, number: int) -> None:
    if name == "rtpmap" and value is not None:
        pt, shape = _rtpmap(value, number)
        builder.rtpmaps.setdefault(pt, shape)  # first mapping wins; a duplicate is noise
    elif name == "fmtp" and value is not None:
        fmt, _, params = value.partition(" ")
        if not fmt:
            raise SdpError(f"bad a=fmtp {value[:60]!r}", line_number=number)
        builder.fmtps.setdefault(str(int(fmt)) if _UINT.match(fmt) and len(fmt) < 6 else fmt, params.strip())
    elif name == "ptime" and value is not None:
        builder.ptime = _ptime(value, name, number)
    elif name == "maxptime" and value is not None:
        builder.maxptime = _ptime(value, name, number)
    elif name == "rtcp" and value is not None:
        builder.rtcp = _rtcp(value, number)
    else:
        builder.attributes.append(Attribute(name=name, value=value))


# ------------------------------------------------------------------------------------------- serializer


def _attribute_line(attribute: Attribute) -> str:
    return f"a={attribute.name}" if attribute.value is None else f"a={attribute.name}:{attribute.value}"


def _ranked(extras: tuple[tuple[str, str], ...], kinds: str) -> list[str]:
    chosen = [(kind, value) for kind, value in extras if kind in kinds]
    chosen.sort(key=lambda item: _EXTRA_RANK[item[0]])  # stable: same-kind lines keep their order
    return [f"{kind}={value}" for kind, value in chosen]


def serialize_sdp(description: SessionDescription) -> str:
    """The description as CRLF-terminated text, fields in RFC 4566 §5 order."""
    o = description.origin
    lines = [
        "v=0",
        f"o={o.username} {o.session_id} {o.session_version} IN {o.address_type} {o.address}",
        f"s={description.session_name}",
        *_ranked(description.extra_fields, "iuep"),
    ]
    if description.connection is not None:
        lines.append(f"c={description.connection.to_text()}")
    lines += [f"b={b}" for b in description.bandwidths]
    lines += [f"t={start} {stop}" for start, stop in description.times]
    lines += _ranked(description.extra_fields, "rzk")
    if description.direction is not None:
        lines.append(f"a={description.direction}")
    lines += [_attribute_line(a) for a in description.attributes]
    for m in description.media:
        port = f"{m.port}/{m.port_count}" if m.port_count is not None else str(m.port)
        lines.append(" ".join([f"m={m.media}", port, m.proto, *m.formats]))
        lines += _ranked(m.extra_fields, "i")
        if m.connection is not None:
            lines.append(f"c={m.connection.to_text()}")
        lines += [f"b={b}" for b in m.bandwidths]
        lines += _ranked(m.extra_fields, "k")
        for codec in m.codecs:
            channels = f"/{codec.channels}" if codec.channels != 1 else ""
            lines.append(f"a=rtpmap:{codec.payload_type} {codec.name}/{codec.clock_rate}{channels}")
            if codec.fmtp:
                lines.append(f"a=fmtp:{codec.payload_type} {codec.fmtp}")
        if m.ptime is not None:
            lines.append(f"a=ptime:{m.ptime}")
        if m.maxptime is not None:
            lines.append(f"a=maxptime:{m.maxptime}")
        if m.rtcp is not None:
            rtcp_address = f" {m.rtcp.connection.to_text()}" if m.rtcp.connection is not None else ""
            lines.append(f"a=rtcp:{m.rtcp.port}{rtcp_address}")
        lines += [_attribute_line(a) for a in m.attributes]
        if m.direction is not None:
            lines.append(f"a={m.direction}")
    return "".join(line + "\r\n" for line in lines)


# ---------------------------------------------------------------------------------------- offer/answer


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalMedia:
    """What we are willing to do on the audio stream, independent of any one offer.

    ``direction`` is our own wish (``sendonly`` when we put the remote on hold); the negotiated direction is
    its intersection with the mirror of the offer's. ``opus_fmtp`` is what we ask the remote to send us.
    """

    direction: Direction = "sendrecv"
    telephone_event: bool = True
    opus_fmtp: str = "minptime=10;useinbandfec=1"


@dataclass(frozen=True, slots=True, kw_only=True)
class OpusParameters:
    """RFC 7587 §6.1 fmtp of the remote's opus: how it wants to receive what we send."""

    useinbandfec: bool = False
    usedtx: bool = False
    stereo: bool = False
    sprop_stereo: bool = False
    cbr: bool = False
    maxplaybackrate: int | None = None
    maxaveragebitrate: int | None = None
    minptime: int | None = None

    @classmethod
    def from_fmtp(cls, params: dict[str, str]) -> OpusParameters:
        # The remote's fmtp must never fail a call: unreadable values fall back to the RFC 7587 defaults.
        def flag(key: str) -> bool:
            return params.get(key, "0").strip() == "1"

        def number(key: str) -> int | None:
            value = params.get(key, "").strip()
            return int(value) if _UINT.match(value) and len(value) < 10 else None

        return cls(
            useinbandfec=flag("useinbandfec"),
            usedtx=flag("usedtx"),
            stereo=flag("stereo"),
            sprop_stereo=flag("sprop-stereo"),
            cbr=flag("cbr"),
            maxplaybackrate=number("maxplaybackrate"),
            maxaveragebitrate=number("maxaveragebitrate"),
            minptime=number("minptime"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class NegotiatedMedia:
    """The outcome of offer/answer for the one audio stream we take (payload types are the remote's)."""

    media_index: int  # which m= line of the remote description
    codec_name: str  # "PCMU" | "PCMA" | "opus" | "G722"
    payload_type: int
    clock_rate: int
    channels: int
    telephone_event_payload_type: int | None
    telephone_event_clock_rate: int | None
    remote_rtp: tuple[str, int]
    remote_rtcp: tuple[str, int]
    direction: Direction  # ours: "sendonly" means we send and do not expect media
    ptime: int
    on_hold: bool  # the remote holds us (sendonly/inactive or c=0.0.0.0)
    opus: OpusParameters | None = None  # the remote's opus fmtp, when opus was chosen
    local_fmtp: str = ""  # the fmtp we put in our SDP for the chosen codec

    @property
    def remote_rtcp_port(self) -> int:
        return self.remote_rtcp[1]


def _sends_receives(direction: Direction) -> tuple[bool, bool]:
    return direction in ("sendrecv", "sendonly"), direction in ("sendrecv", "recvonly")


def _direction(send: bool, receive: bool) -> Direction:
    return ("sendrecv" if receive else "sendonly") if send else ("recvonly" if receive else "inactive")


def _check_preferences(preferences: tuple[str, ...]) -> None:
    unknown = [name for name in preferences if name not in _CODEC_SHAPES]
    if unknown or not preferences:
        raise ValueError(f"codec preferences must be a non-empty subset of {SUPPORTED_CODECS}, got {preferences}")


def _choose_codec(media: MediaDescription, preferences: tuple[str, ...]) -> Codec | None:
    for wanted in preferences:
        clock, _ = _CODEC_SHAPES[wanted]
        for codec in media.codecs:  # offer order among equal names: the offerer's own preference
            # opus/48000 without "/2" is a common mistake; the payload is opus either way.
            if codec.name.lower() == wanted.lower() and codec.clock_rate == clock and codec.channels <= 2:
                return codec
    return None


def _choose_telephone_event(media: MediaDescription, clock_rate: int) -> Codec | None:
    offered = [c for c in media.codecs if c.name.lower() == "telephone-event" and c.clock_rate in (8000, 48000)]
    matching = [c for c in offered if c.clock_rate == clock_rate]
    return next(iter(matching or offered), None)


def _choose_ptime(media: MediaDescription) -> int:
    # Our media tick is 20 ms: whole multiples of it are cheap to send, anything else is not.
    limit = min(media.maxptime or MAX_PTIME, MAX_PTIME)
    ptime = media.ptime
    return ptime if ptime is not None and ptime % DEFAULT_PTIME == 0 and DEFAULT_PTIME <= ptime <= limit else 20


def negotiate(
    offer: SessionDescription,
    *,
    local: LocalMedia,
    preferences: tuple[str, ...] = SUPPORTED_CODECS,
    profiles: frozenset[str] = RTP_PROFILES,
) -> NegotiatedMedia:
    """Pick the first audio RTP stream of ``offer`` that shares a codec with us, and the codec by OUR order.

    Also reads the remote's answer to our own offer (the rules are the same: its payload types are what it
    receives, its direction is its own). Raises :class:`NoCommonCodec` when nothing fits (answer 488).
    ``profiles``: the transport protocols taken (plain RTP; gateway/sip/sdes.py adds the SRTP ones).
    """
    _check_preferences(preferences)
    saw_audio = False
    for index, media in enumerate(offer.media):
        if media.media != "audio" or media.port == 0 or media.proto.upper() not in profiles:
            continue
        saw_audio = True
        codec = _choose_codec(media, preferences)
        if codec is None:
            continue
        connection = offer.connection_of(media)
        if connection is None:  # parse_sdp guarantees one; a hand-built description may not
            raise NoCommonCodec(f"m= line {index} has no connection address")
        telephone_event = _choose_telephone_event(media, codec.clock_rate) if local.telephone_event else None
        rtcp_host = media.rtcp.connection.address if media.rtcp and media.rtcp.connection else connection.address
        rtcp_port = media.rtcp.port if media.rtcp else media.port + 1
        remote_sends, remote_receives = _sends_receives(offer.direction_of(media))
        # RFC 2543 hold (c=0.0.0.0): nowhere to send to, but the remote may still send (music on hold).
        remote_receives = remote_receives and connection.address not in _HOLD_ADDRESSES
        local_sends, local_receives = _sends_receives(local.direction)
        name = next(n for n in SUPPORTED_CODECS if n.lower() == codec.name.lower())
        return NegotiatedMedia(
            media_index=index,
            codec_name=name,
            payload_type=codec.payload_type,
            clock_rate=codec.clock_rate,
            channels=_CODEC_SHAPES[name][1],
            telephone_event_payload_type=telephone_event.payload_type if telephone_event else None,
            telephone_event_clock_rate=telephone_event.clock_rate if telephone_event else None,
            remote_rtp=(connection.address, media.port),
            remote_rtcp=(rtcp_host, rtcp_port),
            direction=_direction(local_sends and remote_receives, local_receives and remote_sends),
            ptime=_choose_ptime(media),
            on_hold=offer.is_hold(media),
            opus=OpusParameters.from_fmtp(codec.fmtp_params()) if name == "opus" else None,
            local_fmtp=local.opus_fmtp if name == "opus" else "",
        )
    raise NoCommonCodec("no common audio codec" if saw_audio else "no RTP/AVP audio stream offered")


def _local_description(
    address: str, session_id: int, session_version: int, media: tuple[MediaDescription, ...]
) -> SessionDescription:
    address_type: Literal["IP4", "IP6"] = "IP6" if ":" in address else "IP4"
    origin = Origin(session_id=session_id, session_version=session_version, address=address, address_type=address_type)
    return SessionDescription(
        origin=origin, connection=Connection(address=address, address_type=address_type), media=media
    )


def _audio_codecs(
    name: str, payload_type: int, fmtp: str, telephone_events: tuple[tuple[int, int], ...]
) -> tuple[Codec, ...]:
    clock, channels = _CODEC_SHAPES[name]
    main = Codec(payload_type=payload_type, name=name, clock_rate=clock, channels=channels, fmtp=fmtp)
    events = tuple(
        Codec(payload_type=pt, name="telephone-event", clock_rate=te_clock, fmtp="0-15")
        for pt, te_clock in telephone_events
    )
    return (main, *events)


def build_answer(
    offer: SessionDescription,
    negotiated: NegotiatedMedia,
    *,
    local_address: str,
    local_port: int,
    session_id: int,
    session_version: int,
) -> SessionDescription:
    """Our answer: the chosen stream with one codec (+ telephone-event), every other m= line rejected."""
    media: list[MediaDescription] = []
    for index, offered in enumerate(offer.media):
        if index != negotiated.media_index:
            # RFC 3264 §6: a rejected stream keeps its m= line with port 0 and at least one format.
            media.append(MediaDescription(media=offered.media, port=0, proto=offered.proto, formats=offered.formats))
            continue
        te = negotiated.telephone_event_payload_type
        events = ((te, negotiated.telephone_event_clock_rate or 8000),) if te is not None else ()
        codecs = _audio_codecs(negotiated.codec_name, negotiated.payload_type, negotiated.local_fmtp, events)
        media.append(
            MediaDescription(
                media="audio",
                port=local_port,
                proto=offered.proto,
                formats=tuple(str(c.payload_type) for c in codecs),
                codecs=codecs,
                ptime=negotiated.ptime,
                direction=negotiated.direction,
            )
        )
    return _local_description(local_address, session_id, session_version, tuple(media))


def build_offer(
    *,
    local_address: str,
    local_port: int,
    session_id: int,
    session_version: int,
    preferences: tuple[str, ...] = SUPPORTED_CODECS,
    telephone_event: bool = True,
    direction: Direction = "sendrecv",
    ptime: int = DEFAULT_PTIME,
    opus_fmtp: str = LocalMedia().opus_fmtp,
) -> SessionDescription:
    """Our offer (outbound calls, the 200 to a re-INVITE without SDP): all preferred codecs in our order.

    Payload types: PCMU 0, PCMA 8, G722 9, opus 111, telephone-event/8000 101 and, with opus, telephone-event/48000
    110 so the answerer can match the event clock to the codec it picks.
    """
    _check_preferences(preferences)
    codecs: list[Codec] = []
    for name in preferences:
        clock, channels = _CODEC_SHAPES[name]
        fmtp = opus_fmtp if name == "opus" else ""
        pt = _PAYLOAD_TYPES_WE_OFFER[name]
        codecs.append(Codec(payload_type=pt, name=name, clock_rate=clock, channels=channels, fmtp=fmtp))
    if telephone_event:
        if "opus" in preferences:
            codecs.append(Codec(payload_type=_TE_PT_48000, name="telephone-event", clock_rate=48000, fmtp="0-15"))
        codecs.append(Codec(payload_type=_TE_PT_8000, name="telephone-event", clock_rate=8000, fmtp="0-15"))
    audio = MediaDescription(
        media="audio",
        port=local_port,
        proto="RTP/AVP",
        formats=tuple(str(c.payload_type) for c in codecs),
        codecs=tuple(codecs),
        ptime=ptime,
        direction=direction,
    )
    return _local_description(local_address, session_id, session_version, (audio,))


def next_session_version(previous: SessionDescription | None, candidate: SessionDescription) -> SessionDescription:
    """``candidate`` numbered as the successor of ``previous`` (the last SDP we sent in this dialog).

    RFC 3264 §8: the ``o=`` username, session id and address stay; the version goes up by exactly one
    when anything changed and stays put when the description is the same (a re-INVITE refresh).
    """
    if previous is None:
        return candidate
    same_version = replace(candidate, origin=previous.origin)
    if same_version == previous:
        return previous
    next_origin = replace(previous.origin, session_version=previous.origin.session_version + 1)
    return replace(candidate, origin=next_origin)
