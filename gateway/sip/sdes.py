"""SDP Security Descriptions for SRTP (RFC 4568): ``a=crypto`` lines, and SRTP in the offer/answer of a call.

Owns: parsing and serializing ``a=crypto:<tag> <crypto-suite> <key-params> [<session-params>]`` (RFC 4568 §9
grammar, SRTP key parameters of §6.1), deciding whether a call's audio is SRTP under the gateway's mode, the
crypto line of our answer and of our offers, and reading the answer to our offer. It never makes keys: the
caller injects them (``key_source``; the worker passes ``os.urandom``), so this core stays deterministic.

Rules followed, and why:

* RFC 4568 §5.1.2: the answerer accepts exactly one offered crypto attribute per stream, the first *valid*
  one in the offerer's order (the order of the SDP), or rejects the stream. A line that breaks the grammar or
  names what we cannot do (a suite other than AES_CM_128_HMAC_SHA1_80/_32, a key that is not 30 octets, an MKI,
  a key method other than ``inline``, several keys, a session parameter we do not implement) is not valid for
  us and is passed over; one bad line among good ones costs nothing. When no line is usable the stream is
  refused; with no other stream left that is 488, and the reason phrase says which line failed and why.
* RFC 4568 §6.3: session parameters. ``KDR=0`` (no key derivation rate) and ``WSH=<n>`` (replay window hint,
  n >= 64) are taken; ``UNENCRYPTED_SRTP``, ``UNENCRYPTED_SRTCP``, ``UNAUTHENTICATED_SRTP``, ``FEC_KEY``, ``KDR``
  other than 0 and unknown parameters make the line unusable, except unknown ones written with a leading
  ``-`` (§6.3.7: optional extensions the receiver may ignore). ``FEC_ORDER`` is read and ignored (no FEC).
* RFC 4568 §6.1: the key lifetime is the limit of the key's owner, who rekeys by a new offer; we read it and
  never stop a call for it (our own keys carry none: libsrtp's own limit applies).
* RFC 4568 §5.1.2 / §6.1: the answer's line carries the accepted line's tag and suite with a key of ours.
* Profiles: RTP/SAVP, and RTP/SAVPF (AVPF feedback is ignored, as with RTP/AVPF). RFC 8643 (OSRTP): an RTP/AVP
  stream with ``a=crypto`` is an opportunistic offer; the answer keeps RTP/AVP and, when SRTP is on, carries a
  crypto line and the media is SRTP; with SRTP off it is answered as plain RTP/AVP.
* Modes (:data:`SrtpMode`): ``off`` takes plain RTP only (an offer whose audio is RTP/SAVP only gets 488);
  ``optional`` takes SRTP when offered and plain RTP otherwise, and our offers are OSRTP (RTP/AVP with crypto
  lines); ``required`` takes only SRTP (a plain offer gets 488) and our offers are RTP/SAVP.
* RFC 4568 §7.1.4 (subsequent offers): a re-offer that keeps the accepted key keeps the crypto context, so
  the replay window and the rollover counter carry on; a new key of the offerer's replaces only the inbound
  context (a fresh one starts at ROC 0, as a sender that made a new context does); we keep our own key unless
  the suite changes. Switching a call between RTP and SRTP mid-call is refused (488): the call goes on as it was.

Error tree (both :class:`~gateway.sip.errors.RemoteProtocolError`, answered 488): :class:`CryptoError` is one
unusable ``a=crypto`` line (``reason`` says why); :class:`SrtpRefused` is an offer or answer whose security
does not fit the mode. Neither is raised for a good line among bad ones.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal, get_args

from .errors import RemoteProtocolError
from .sdp import (
    RTP_PROFILES,
    SRTP_PROFILES,
    SUPPORTED_CODECS,
    Attribute,
    LocalMedia,
    MediaDescription,
    NegotiatedMedia,
    NoCommonCodec,
    SessionDescription,
    negotiate,
)

SrtpMode = Literal["off", "optional", "required"]
SRTP_MODES: tuple[SrtpMode, ...] = get_args(SrtpMode)

#: crypto-suite -> (master key octets, master salt octets, authentication tag octets), RFC 4568 §6.2.
SUITES: dict[str, tuple[int, int, int]] = {
    "AES_CM_128_HMAC_SHA1_80": (16, 14, 10),
    "AES_CM_128_HMAC_SHA1_32": (16, 14, 4),
}
SUPPORTED_SUITES: tuple[str, ...] = tuple(SUITES)
MIN_WINDOW = 64  # RFC 3711 §3.3.2: the replay window is at least 64 packets
MAX_WINDOW = 0x7FFF  # libsrtp's largest

_TAG = re.compile(r"[0-9]{1,9}")
_SUITE = re.compile(r"[A-Za-z0-9_]+")
_KEY_METHOD = re.compile(r"[A-Za-z0-9_]+")
_KEY_INFO = re.compile(r"[\x21-\x3a\x3c-\x7e]+")  # visible characters except ";"
_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")
_LIFETIME = re.compile(r"(2\^)?([0-9]{1,20})")
_MKI = re.compile(r"([0-9]{1,20}):([0-9]{1,3})")
_SESSION_PARAM = re.compile(r"[\x21-\x7e]+")
_WSP = re.compile(r"[ \t]+")
_REASON_MAX = 160  # the 488's reason phrase stays one readable line


class CryptoError(RemoteProtocolError):
    """One ``a=crypto`` line that breaks the grammar or asks for something we do not do; ``reason`` says which."""

    def __init__(self, reason: str, *, tag: int | None = None) -> None:
        super().__init__(f"a=crypto: {reason}", status_code=488)
        self.crypto_reason = reason
        self.tag = tag


class SrtpRefused(RemoteProtocolError):
    """A description whose media security does not fit the mode (or no usable crypto line): answer 488."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"SRTP: {reason}", status_code=488)


def _no_usable(failures: list[str]) -> str:
    """ "no usable a=crypto: <why>; <why>" with as many whole reasons as fit one reason phrase."""
    text = "no usable a=crypto: " + failures[0]
    for shown, failure in enumerate(failures[1:], start=1):
        if len(text) + len(failure) + 2 > _REASON_MAX:
            return f"{text}; and {len(failures) - shown} more"
        text += "; " + failure
    return text


# ------------------------------------------------------------------------------------------ value types


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyParam:
    """One ``inline:<key||salt>[|lifetime][|MKI:length]`` key parameter (RFC 4568 §6.1)."""

    key_salt: bytes
    lifetime: int | None = None  # packets; "2^31" is stored as 2**31
    mki: tuple[int, int] | None = None  # (value, length in octets)
    lifetime_text: str = ""  # as written ("2^31" or "2147483648"), for serializing it back unchanged

    def to_text(self) -> str:
        text = "inline:" + base64.b64encode(self.key_salt).decode("ascii")
        if self.lifetime is not None:
            text += "|" + (self.lifetime_text or str(self.lifetime))
        if self.mki is not None:
            text += f"|{self.mki[0]}:{self.mki[1]}"
        return text


@dataclass(frozen=True, slots=True, kw_only=True)
class CryptoAttribute:
    """One ``a=crypto`` line as parsed; :func:`usable_key` says whether we can use it."""

    tag: int
    suite: str
    keys: tuple[KeyParam, ...]
    session_params: tuple[str, ...] = ()

    def to_value(self) -> str:
        """The attribute's value (what follows ``a=crypto:``)."""
        parts = [str(self.tag), self.suite, ";".join(key.to_text() for key in self.keys), *self.session_params]
        return " ".join(parts)

    def to_attribute(self) -> Attribute:
        return Attribute(name="crypto", value=self.to_value())


@dataclass(frozen=True, slots=True, kw_only=True)
class SrtpNegotiated:
    """The SRTP of one call's audio stream, as offer/answer left it (keys are master key || master salt)."""

    tag: int
    suite: str
    local_key: bytes  # what we protect with (the key in our SDP)
    remote_key: bytes  # what the peer protects with (the key in its SDP)
    replay_window: int | None = None  # the peer's WSH, when it sent one

    def local_attribute(self) -> Attribute:
        """Our ``a=crypto`` line for this stream (in an answer, or in a re-offer that keeps the keys)."""
        return CryptoAttribute(tag=self.tag, suite=self.suite, keys=(KeyParam(key_salt=self.local_key),)).to_attribute()


@dataclass(frozen=True, slots=True, kw_only=True)
class SecureNegotiation:
    """:func:`negotiate_secure`'s outcome: the audio stream and codec, and its SRTP (None: plain RTP)."""

    media: NegotiatedMedia
    srtp: SrtpNegotiated | None


# ----------------------------------------------------------------------------------------------- parser


def parse_crypto(value: str) -> CryptoAttribute:
    """Parse the value of one ``a=crypto`` attribute by the RFC 4568 §9 grammar with SRTP key parameters.

    Raises :class:`CryptoError` (and nothing else) for a line that breaks the grammar. A line that parses may
    still be one we cannot use (:func:`usable_key`)."""
    parts = _WSP.split(value.strip())
    if len(parts) < 3:
        raise CryptoError("needs a tag, a crypto-suite and key parameters")
    tag_text, suite, key_params, *session_params = parts
    if not _TAG.fullmatch(tag_text):
        raise CryptoError(f"tag {tag_text[:12]!r} is not 1 to 9 digits")
    tag = int(tag_text)
    if not _SUITE.fullmatch(suite):
        raise CryptoError("crypto-suite is not letters, digits and '_'", tag=tag)
    keys = tuple(_key_param(param, tag) for param in key_params.split(";"))
    for param in session_params:
        if not _SESSION_PARAM.fullmatch(param):
            raise CryptoError("session parameter has characters outside VCHAR", tag=tag)
    return CryptoAttribute(tag=tag, suite=suite, keys=keys, session_params=tuple(session_params))


def _key_param(text: str, tag: int) -> KeyParam:
    method, colon, info = text.partition(":")
    if not colon or not _KEY_METHOD.fullmatch(method) or not _KEY_INFO.fullmatch(info):
        raise CryptoError("key parameter is not <key-method>:<key-info>", tag=tag)
    if method != "inline":
        raise CryptoError(f"key method {method[:20]!r} is not supported (only inline)", tag=tag)
    key_text, *rest = info.split("|")
    if len(rest) > 2:
        raise CryptoError("key-info has more than key|lifetime|MKI", tag=tag)
    if not _BASE64.fullmatch(key_text) or len(key_text) % 4 == 1:
        raise CryptoError("key is not base64", tag=tag)
    try:  # RFC 4568 §6.1 follows RFC 3548 base64; senders that drop the "=" padding are common enough
        key_salt = base64.b64decode(key_text + "=" * (-len(key_text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise CryptoError("key is not base64", tag=tag) from None
    lifetime: int | None = None
    lifetime_text = ""
    mki: tuple[int, int] | None = None
    for field in rest:
        if (match := _MKI.fullmatch(field)) is not None and mki is None:
            length = int(match.group(2))
            if not 1 <= length <= 128:
                raise CryptoError(f"MKI length {length} outside 1..128", tag=tag)
            mki = (int(match.group(1)), length)
        elif (match := _LIFETIME.fullmatch(field)) is not None and lifetime is None and mki is None:
            exponent = int(match.group(2))
            if match.group(1):
                if exponent > 64:
                    raise CryptoError(f"lifetime 2^{exponent} is beyond 2^64", tag=tag)
                lifetime = 2**exponent
            else:
                lifetime = exponent
            if lifetime == 0:
                raise CryptoError("lifetime 0", tag=tag)
            lifetime_text = field
        else:
            raise CryptoError(f"bad lifetime or MKI {field[:24]!r}", tag=tag)
    return KeyParam(key_salt=key_salt, lifetime=lifetime, mki=mki, lifetime_text=lifetime_text)


def _window(params: tuple[str, ...], tag: int) -> int | None:
    """Check the session parameters (RFC 4568 §6.3); returns the WSH replay window when there is one."""
    window: int | None = None
    for param in params:
        name, equals, value = param.partition("=")
        if name == "KDR" and equals:
            if value != "0":
                raise CryptoError(f"KDR={value[:8]} is not supported (only 0)", tag=tag)
        elif name == "WSH" and equals:
            if not value.isdigit() or len(value) > 6 or int(value) < MIN_WINDOW:
                raise CryptoError(f"WSH={value[:8]} is not a window of at least {MIN_WINDOW}", tag=tag)
            window = min(int(value), MAX_WINDOW)
        elif name == "FEC_ORDER" and equals and value in ("FEC_SRTP", "SRTP_FEC"):
            continue  # no FEC here: the order is moot
        elif param.startswith("-"):
            continue  # §6.3.7: an optional extension we may ignore
        else:
            raise CryptoError(f"session parameter {name[:24]} is not supported", tag=tag)
    return window


def usable_key(attribute: CryptoAttribute, suites: tuple[str, ...] = SUPPORTED_SUITES) -> tuple[bytes, int | None]:
    """The line's master key || salt and replay window if we can use it; raises :class:`CryptoError` why not."""
    tag = attribute.tag
    if attribute.suite not in suites:
        raise CryptoError(f"suite {attribute.suite[:40]} is not supported", tag=tag)
    if len(attribute.keys) != 1:
        raise CryptoError(f"{len(attribute.keys)} keys (several keys need MKIs, which are not supported)", tag=tag)
    key = attribute.keys[0]
    if key.mki is not None:
        raise CryptoError("MKI is not supported", tag=tag)
    key_octets, salt_octets, _ = SUITES[attribute.suite]
    if len(key.key_salt) != key_octets + salt_octets:
        raise CryptoError(
            f"key of {len(key.key_salt)} octets, {attribute.suite} needs {key_octets + salt_octets}", tag=tag
        )
    return key.key_salt, _window(attribute.session_params, tag)


def crypto_lines(media: MediaDescription) -> list[tuple[str, CryptoAttribute | CryptoError]]:
    """Every ``a=crypto`` line of a media section in order, each parsed or with the error that stopped it."""
    lines: list[tuple[str, CryptoAttribute | CryptoError]] = []
    for attribute in media.attributes:
        if attribute.name != "crypto":
            continue
        value = attribute.value or ""
        try:
            lines.append((value, parse_crypto(value)))
        except CryptoError as exc:
            lines.append((value, exc))
    return lines


# ---------------------------------------------------------------------------------------- offer/answer


def _first_usable(
    media: MediaDescription, suites: tuple[str, ...]
) -> tuple[CryptoAttribute, bytes, int | None] | list[str]:
    """The offerer's first valid line we support (RFC 4568 §5.1.2), or why each line failed."""
    failures: list[str] = []
    for _, parsed in crypto_lines(media):
        if isinstance(parsed, CryptoError):
            failures.append(_described(parsed))
            continue
        try:
            key, window = usable_key(parsed, suites)
        except CryptoError as exc:
            failures.append(_described(exc))
            continue
        return parsed, key, window
    return failures


def _described(error: CryptoError) -> str:
    return f"a=crypto:{error.tag} {error.crypto_reason}" if error.tag is not None else error.crypto_reason


def _only(offer: SessionDescription, index: int) -> SessionDescription:
    """The offer with every stream but ``index`` turned off (port 0): codec negotiation on that one stream."""
    media = tuple(m if i == index else replace(m, port=0) for i, m in enumerate(offer.media))
    return replace(offer, media=media)


def _has_audio(offer: SessionDescription, profiles: frozenset[str]) -> bool:
    return any(m.media == "audio" and m.port != 0 and m.proto.upper() in profiles for m in offer.media)


def negotiate_secure(
    offer: SessionDescription,
    *,
    local: LocalMedia,
    mode: SrtpMode,
    key_source: Callable[[int], bytes],
    preferences: tuple[str, ...] = SUPPORTED_CODECS,
    suites: tuple[str, ...] = SUPPORTED_SUITES,
    current: SrtpNegotiated | None = None,
) -> SecureNegotiation:
    """Answer ``offer``: the audio stream, its codec and whether it is SRTP under ``mode`` (module docstring).

    SRTP streams (RTP/SAVP(F), or RTP/AVP with crypto lines: OSRTP) are preferred in offer order when the
    mode allows them; ``key_source(n)`` makes our key (n octets) unless ``current`` (the call's SRTP before
    this re-offer) has one for the same suite. Raises :class:`SrtpRefused` or
    :class:`~gateway.sip.sdp.NoCommonCodec` (both 488)."""
    if mode not in SRTP_MODES:
        raise ValueError(f"SRTP mode must be one of {SRTP_MODES}, got {mode!r}")
    if mode == "off":
        try:
            return SecureNegotiation(media=negotiate(offer, local=local, preferences=preferences), srtp=None)
        except NoCommonCodec:
            if _has_audio(offer, SRTP_PROFILES) and not _has_audio(offer, RTP_PROFILES):
                raise SrtpRefused("the offer's audio is RTP/SAVP only and SRTP is off here") from None
            raise
    failures: list[str] = []
    codec_missing = False
    profiles = RTP_PROFILES | SRTP_PROFILES
    for index, media in enumerate(offer.media):
        if media.media != "audio" or media.port == 0 or media.proto.upper() not in profiles:
            continue
        secure = media.proto.upper() in SRTP_PROFILES
        if not secure and not any(a.name == "crypto" for a in media.attributes):
            continue  # plain RTP/AVP: considered below, when the mode allows it
        chosen = _first_usable(media, suites)
        if isinstance(chosen, list):
            failures.extend(chosen or [f"m= line {index} ({media.proto}) has no a=crypto"])
            continue
        try:
            negotiated = negotiate(_only(offer, index), local=local, preferences=preferences, profiles=profiles)
        except NoCommonCodec:
            codec_missing = True
            continue
        attribute, remote_key, window = chosen
        if current is not None and current.suite == attribute.suite:
            local_key = current.local_key
        else:
            key_octets, salt_octets, _ = SUITES[attribute.suite]
            local_key = key_source(key_octets + salt_octets)
        srtp = SrtpNegotiated(
            tag=attribute.tag,
            suite=attribute.suite,
            local_key=local_key,
            remote_key=remote_key,
            replay_window=window,
        )
        return SecureNegotiation(media=negotiated, srtp=srtp)
    if mode == "required":
        if failures:
            raise SrtpRefused(_no_usable(failures))
        if codec_missing:
            raise NoCommonCodec("no common audio codec")
        raise SrtpRefused("SRTP is required here and the offer has no a=crypto")
    try:
        return SecureNegotiation(media=negotiate(offer, local=local, preferences=preferences), srtp=None)
    except NoCommonCodec:
        if failures and not codec_missing:
            raise SrtpRefused(_no_usable(failures)) from None
        raise


def check_update(previous: SrtpNegotiated | None, update: SrtpNegotiated | None) -> None:
    """A re-offer may rekey, not switch between RTP and SRTP: raises :class:`SrtpRefused` when it would."""
    if (previous is None) != (update is None):
        was, now = ("SRTP", "RTP") if previous is not None else ("RTP", "SRTP")
        raise SrtpRefused(f"the call is {was}; changing it to {now} mid-call is not supported")


def with_crypto(
    description: SessionDescription, media_index: int, attributes: tuple[Attribute, ...], *, proto: str | None = None
) -> SessionDescription:
    """``description`` (ours) with crypto lines added to one m= line, and its profile changed if asked."""
    media = list(description.media)
    section = media[media_index]
    media[media_index] = replace(
        section, proto=proto or section.proto, attributes=section.attributes + tuple(attributes)
    )
    return replace(description, media=tuple(media))


def secure_answer(answer: SessionDescription, negotiation: SecureNegotiation) -> SessionDescription:
    """Our answer (from :func:`~gateway.sip.sdp.build_answer`) with the crypto line of the accepted one."""
    if negotiation.srtp is None:
        return answer
    return with_crypto(answer, negotiation.media.media_index, (negotiation.srtp.local_attribute(),))


def offer_crypto(
    mode: SrtpMode, key_source: Callable[[int], bytes], suites: tuple[str, ...] = SUPPORTED_SUITES
) -> tuple[CryptoAttribute, ...]:
    """The crypto lines of a new offer of ours (tags 1.., our suite order, a fresh key each); () when off."""
    if mode == "off":
        return ()
    lines = []
    for tag, suite in enumerate(suites, start=1):
        key_octets, salt_octets, _ = SUITES[suite]
        lines.append(
            CryptoAttribute(tag=tag, suite=suite, keys=(KeyParam(key_salt=key_source(key_octets + salt_octets)),))
        )
    return tuple(lines)


def secure_offer(offer: SessionDescription, mode: SrtpMode, lines: tuple[CryptoAttribute, ...]) -> SessionDescription:
    """Our offer (from :func:`~gateway.sip.sdp.build_offer`, one audio m= line) made secure per ``mode``:
    RTP/SAVP when SRTP is required, RTP/AVP with the crypto lines (RFC 8643 OSRTP) when optional."""
    if mode == "off" or not lines:
        return offer
    proto = "RTP/SAVP" if mode == "required" else None
    return with_crypto(offer, 0, tuple(line.to_attribute() for line in lines), proto=proto)


def reoffer_crypto(srtp: SrtpNegotiated) -> tuple[CryptoAttribute, ...]:
    """The crypto line of a re-offer that keeps the call's SRTP as it is (same tag, suite and key of ours)."""
    return (CryptoAttribute(tag=srtp.tag, suite=srtp.suite, keys=(KeyParam(key_salt=srtp.local_key),)),)


def read_answer(
    answer: SessionDescription,
    negotiated: NegotiatedMedia,
    offered: tuple[CryptoAttribute, ...],
    mode: SrtpMode,
) -> SrtpNegotiated | None:
    """The SRTP of the remote's answer to our offer (``offered``: our crypto lines), or None for plain RTP.

    RFC 4568 §5.1.3: the answer accepts exactly one of our lines, with its tag and suite and the answerer's
    key. An answer with no crypto line is plain RTP, which only an OSRTP offer (mode optional) allows.
    Raises :class:`SrtpRefused`."""
    media = answer.media[negotiated.media_index]
    lines = crypto_lines(media)
    secure_profile = media.proto.upper() in SRTP_PROFILES
    if not lines or mode == "off" or not offered:
        if secure_profile or mode == "required":
            raise SrtpRefused("the answer has no a=crypto for our SRTP offer")
        return None
    if len(lines) != 1:
        raise SrtpRefused(f"the answer has {len(lines)} a=crypto lines, RFC 4568 allows one")
    parsed = lines[0][1]
    if isinstance(parsed, CryptoError):
        raise SrtpRefused(_described(parsed))
    ours = next((line for line in offered if line.tag == parsed.tag), None)
    if ours is None or ours.suite != parsed.suite:
        raise SrtpRefused(f"the answer's a=crypto:{parsed.tag} {parsed.suite[:40]} is not one we offered")
    try:
        remote_key, window = usable_key(parsed, (ours.suite,))
    except CryptoError as exc:
        raise SrtpRefused(_described(exc)) from None
    return SrtpNegotiated(
        tag=parsed.tag,
        suite=parsed.suite,
        local_key=ours.keys[0].key_salt,
        remote_key=remote_key,
        replay_window=window,
    )
