"""One call's SDP offer/answer (RFC 3264 §5-8) with its SDES keys (RFC 4568 §5-7), as a sans-I/O object.

Owns: what the call's audio stream is now -- the codec and its payload type, the telephone-event payload type,
the direction both ways (hold and resume), the SRTP keys of each side -- and the ``o=`` line of every
description we send (session id fixed, version +1 per change). It is fed a :class:`MediaPolicy` (our codecs,
SRTP mode, suites), descriptions from the peer, and keys from an injected ``key_source``; it never makes a key,
reads a clock or touches a socket. Parsing, codec choice and the crypto lines are gateway/sip/sdp.py's and
gateway/sip/sdes.py's; this object decides which of them a call's next step needs, and remembers the outcome.

States and inputs (anything else raises :class:`~gateway.sip.errors.LocalProtocolError`)::

    IDLE        answer(offer)       -> NEGOTIATED   (Refused: stays IDLE)
    IDLE        offer()             -> OFFERED
    OFFERED     take_answer(answer) -> NEGOTIATED   (Refused: stays OFFERED; the call cannot go on)
    OFFERED     take_answer(answer, early=True) -> EARLY   (an 18x's SDP: media starts on it; Refused: OFFERED)
    EARLY       take_answer(answer) -> NEGOTIATED   (the 2xx's SDP, when it differs: gateway/sip/early_media.py)
    EARLY       confirm_early()     -> NEGOTIATED   (the 2xx kept the 18x's SDP)
    NEGOTIATED  update(offer)       -> NEGOTIATED   (Refused: the call goes on as it was)
    NEGOTIATED  offer()             -> REOFFERED
    REOFFERED   take_answer(answer) -> NEGOTIATED   (Refused: back to the state before the re-offer)
    REOFFERED   update(offer)       -> NEGOTIATED   (our re-offer is dropped: see below)
    REOFFERED   offer()             -> REOFFERED    (our unanswered re-offer is replaced)
    REOFFERED   offer_refused()     -> NEGOTIATED   (the peer refused our re-offer: the call goes on as it was)

Rules followed, and why:

* RFC 3264 §6: the answer has the offer's m= lines in order, one audio stream taken and the rest at port 0;
  payload types are the offerer's. An answer to our offer with another count of m= lines is refused.
* RFC 3264 §6.1: the answer's direction is the complement of the offer's, narrowed by our own wish (``offer``'s
  ``direction``: ``sendonly`` puts the peer on hold); the wish outlives a re-offer of the peer's, so a refresh
  of the peer does not take its hold off.
* RFC 3264 §8: a re-offer of ours is our last description (same m= lines, payload types and codec) with the
  new direction and keys; its ``o=`` keeps the session id and the version goes up by one exactly when the
  description changed (:func:`~gateway.sip.sdp.next_session_version`), so a refresh keeps the version.
* RFC 3264 §8.3.2: a payload type keeps its codec for the whole session. A re-offer must keep the call's codec
  (the media state does not switch codecs) unless the policy allows a change; when the codec is still offered
  it is kept even if the policy would rank another first.
* RFC 4568 §7.1.4: a re-offer that keeps its key keeps the SRTP contexts; the offerer's new key changes only
  its own side; our key changes only when the suite does, or when we rekey by ``offer(rekey=True)``. Moving a
  call between RTP and SRTP mid-call is refused (488).
* Media addresses must be IP literals: a host name in ``c=`` would need a DNS lookup for every packet sent.
* A re-INVITE without an offer is answered with our re-offer; the ACK carries the peer's answer (the SIP core's
  ``ReinviteAcked``). An ACK without one (a broken peer) leaves the re-offer pending: a later offer from the
  peer, or a new re-offer of ours, therefore replaces a re-offer still pending.

Refusals are values, not exceptions: :class:`Refused` carries the status (488), a reason phrase naming the
problem (the parser's line, the crypto line, the codec) and a short ``code`` for metrics and end reasons.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from .errors import LocalProtocolError, SipConfigError
from .sdes import (
    SRTP_MODES,
    SUPPORTED_SUITES,
    CryptoAttribute,
    KeyParam,
    SecureNegotiation,
    SrtpMode,
    SrtpNegotiated,
    SrtpRefused,
    check_update,
    negotiate_secure,
    offer_crypto,
    read_answer,
    secure_answer,
    secure_offer,
    with_crypto,
)
from .sdp import (
    RTP_PROFILES,
    SRTP_PROFILES,
    SUPPORTED_CODECS,
    Direction,
    LocalMedia,
    NegotiatedMedia,
    NoCommonCodec,
    SdpError,
    SessionDescription,
    build_answer,
    build_offer,
    negotiate,
    next_session_version,
    parse_sdp,
)

RefusalCode = Literal["bad_sdp", "no_common_codec", "srtp_refused", "codec_change"]
_NOT_ACCEPTABLE = 488  # RFC 3261 §21.4.26: the session description cannot be accepted (also for broken SDP)


class OfferAnswerState(enum.Enum):
    IDLE = "idle"
    OFFERED = "offered"  # our first offer awaits its answer
    EARLY = "early"  # an 18x's SDP runs the media (early media); the 2xx's answer is still to come
    NEGOTIATED = "negotiated"
    REOFFERED = "reoffered"  # our re-offer awaits its answer; the call runs on what was negotiated


_AWAITING = (OfferAnswerState.OFFERED, OfferAnswerState.EARLY)  # our first offer, not answered for good yet


@dataclass(frozen=True, slots=True, kw_only=True)
class MediaPolicy:
    """What a call may take: our codecs in preference order, the SRTP mode and suites (RFC 4568 §6.2).

    ``allow_codec_change``: whether a re-offer may move the call to another codec (the worker's media state
    cannot, so it says no)."""

    codecs: tuple[str, ...] = SUPPORTED_CODECS
    srtp: SrtpMode = "optional"
    suites: tuple[str, ...] = SUPPORTED_SUITES
    telephone_event: bool = True
    allow_codec_change: bool = False

    def __post_init__(self) -> None:
        if (
            not self.codecs
            or len(set(self.codecs)) != len(self.codecs)
            or not set(self.codecs) <= set(SUPPORTED_CODECS)
        ):
            raise SipConfigError(f"codecs must be distinct names among {SUPPORTED_CODECS}, got {self.codecs}")
        if self.srtp not in SRTP_MODES:
            raise SipConfigError(f"SRTP mode must be one of {SRTP_MODES}, got {self.srtp!r}")
        if not self.suites or not set(self.suites) <= set(SUPPORTED_SUITES):
            raise SipConfigError(f"SRTP suites must be among {SUPPORTED_SUITES}, got {self.suites}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Answered:
    """An offer was taken (or our offer's answer read): the call's audio as it stands now.

    ``rekeyed``: the SRTP keys differ from before this step (the media's SRTP contexts must follow);
    ``changed``: anything of the negotiated media or keys differs from before."""

    media: NegotiatedMedia
    srtp: SrtpNegotiated | None
    rekeyed: bool = False
    changed: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class Refused:
    """An offer (or an answer to ours) that cannot be taken: ``status`` and ``reason`` for the SIP response."""

    status: int
    reason: str
    code: RefusalCode


@dataclass(slots=True)
class _Pending:
    """Our offer awaiting its answer: the crypto lines it carried and the codecs the answer may choose from."""

    crypto: tuple[CryptoAttribute, ...]
    mode: SrtpMode
    codecs: tuple[str, ...]


class OfferAnswer:
    """The offer/answer of one call (module docstring). ``session_id`` is our ``o=`` id for the whole call;
    ``key_source(n)`` makes n random octets (``os.urandom`` in the worker); ``address`` and ``port`` are our RTP
    transport address, which :meth:`bind` may give later (an answer decided before the port is open)."""

    def __init__(
        self,
        policy: MediaPolicy,
        *,
        session_id: int,
        key_source: Callable[[int], bytes],
        address: str | None = None,
        port: int | None = None,
    ) -> None:
        self.policy = policy
        self._session_id = session_id
        self._key_source = key_source
        self._address: str | None = None
        self._port: int | None = None
        self._state = OfferAnswerState.IDLE
        self._wish: Direction = "sendrecv"
        self._wish_before: Direction = "sendrecv"  # our wish before the re-offer pending, restored if it is refused
        self._media: NegotiatedMedia | None = None
        self._srtp: SrtpNegotiated | None = None
        self._remote: SessionDescription | None = None
        self._local: SessionDescription | None = None
        self._unsent_answer: SessionDescription | None = None  # an offer answered before bind()
        self._pending: _Pending | None = None
        if address is not None and port is not None:
            self.bind(address=address, port=port)

    # ------------------------------------------------------------------------------------ what stands now

    @property
    def state(self) -> OfferAnswerState:
        return self._state

    @property
    def media(self) -> NegotiatedMedia | None:
        """The negotiated audio stream (codec, payload types, direction, remote address); None before it is."""
        return self._media

    @property
    def srtp(self) -> SrtpNegotiated | None:
        """The call's SDES keys (ours and the peer's); None for plain RTP or before negotiation."""
        return self._srtp

    @property
    def local(self) -> SessionDescription | None:
        """The last description we made to send (our answer or offer)."""
        return self._local

    @property
    def remote(self) -> SessionDescription | None:
        """The last description of the peer's that we took."""
        return self._remote

    @property
    def wish(self) -> Direction:
        """Our own direction: ``sendonly`` or ``inactive`` while we hold the peer."""
        return self._wish

    def bind(self, *, address: str, port: int) -> None:
        """Our RTP transport address, once; an offer answered before it gets its description now."""
        if self._address is not None:
            raise LocalProtocolError("the offer/answer is bound to an RTP address already")
        self._address, self._port = address, port
        if self._unsent_answer is not None:
            offer, self._unsent_answer = self._unsent_answer, None
            self._emit_answer(offer)

    # ------------------------------------------------------------------------------------------ the peer offers

    def answer(self, offer: SessionDescription | bytes) -> Answered | Refused:
        """Take the peer's first offer (an INVITE's body); our answer is :attr:`local` (after :meth:`bind`)."""
        self._expect("answer an offer", OfferAnswerState.IDLE)
        description = _parsed(offer)
        if isinstance(description, Refused):
            return description
        negotiation = self._negotiate(description, preferences=self.policy.codecs, current=None)
        if isinstance(negotiation, Refused):
            return negotiation
        return self._adopt(description, negotiation)

    def update(self, offer: SessionDescription | bytes) -> Answered | Refused:
        """Take a re-offer (re-INVITE or UPDATE): hold, resume, rekey, a new address, or a refresh. A refusal
        leaves the call as it was."""
        self._expect("take a re-offer", OfferAnswerState.NEGOTIATED, OfferAnswerState.REOFFERED)
        description = _parsed(offer)
        if isinstance(description, Refused):
            return description
        assert self._media is not None
        negotiation = self._negotiate(description, preferences=self._reoffer_codecs(), current=self._srtp)
        if isinstance(negotiation, Refused):
            return negotiation
        refused = self._check_continuity(negotiation.media, negotiation.srtp, "re-offer")
        if refused is not None:
            return refused
        self._pending = None
        return self._adopt(description, negotiation)

    # ------------------------------------------------------------------------------------------- we offer

    def offer(self, *, direction: Direction | None = None, rekey: bool = False) -> SessionDescription:
        """Our offer: the first of a call (every codec of the policy, fresh crypto lines per the SRTP mode) or a
        re-offer (the call's codec and keys; ``rekey`` makes a new key of ours). ``direction`` becomes our wish
        (``sendonly`` to hold the peer, ``sendrecv`` to resume); None keeps it."""
        self._expect("make an offer", OfferAnswerState.IDLE, OfferAnswerState.NEGOTIATED, OfferAnswerState.REOFFERED)
        address, port = self._bound()
        if self._state is OfferAnswerState.NEGOTIATED:
            self._wish_before = self._wish
        if direction is not None:
            self._wish = direction
        if self._state is OfferAnswerState.IDLE:
            description = build_offer(
                local_address=address,
                local_port=port,
                session_id=self._session_id,
                session_version=1,
                preferences=self.policy.codecs,
                telephone_event=self.policy.telephone_event,
                direction=self._wish,
            )
            crypto = offer_crypto(self.policy.srtp, self._key_source, self.policy.suites)
            self._pending = _Pending(crypto=crypto, mode=self.policy.srtp, codecs=self.policy.codecs)
            self._state = OfferAnswerState.OFFERED
            return self._emit(secure_offer(description, self.policy.srtp, crypto))
        description, pending = self._reoffer(rekey=rekey)
        self._pending = pending
        self._state = OfferAnswerState.REOFFERED
        return self._emit(description)

    def take_answer(self, answer: SessionDescription | bytes, *, early: bool = False) -> Answered | Refused:
        """The peer's answer to our offer (a 2xx or an ACK body; ``early``: an 18x's, which the 2xx may still
        replace). Refused: the first offer's call cannot go on; a re-offer's call goes on as it was."""
        states = (OfferAnswerState.OFFERED,) if early else (*_AWAITING, OfferAnswerState.REOFFERED)
        self._expect("take an early answer" if early else "take an answer", *states)
        assert self._pending is not None and self._local is not None
        pending, first = self._pending, self._state in _AWAITING
        refused = self._read_answer(answer, pending, first=first)
        if isinstance(refused, Refused):
            if not first:
                self._pending = None
                self._state = OfferAnswerState.NEGOTIATED
            return refused
        description, media, srtp = refused
        before = (self._media, self._srtp)
        rekeyed = self._media is not None and srtp != self._srtp
        self._media, self._srtp, self._remote = media, srtp, description
        if early:
            self._state = OfferAnswerState.EARLY  # the offer stays pending: the 2xx answers it for good
            return Answered(media=media, srtp=srtp, rekeyed=False, changed=True)
        self._pending = None
        self._state = OfferAnswerState.NEGOTIATED
        return Answered(media=media, srtp=srtp, rekeyed=rekeyed, changed=before != (media, srtp))

    def confirm_early(self) -> None:
        """The 2xx kept the early answer (the same SDP, or none): it is now the call's negotiated media."""
        self._expect("confirm the early answer", OfferAnswerState.EARLY)
        self._pending = None
        self._state = OfferAnswerState.NEGOTIATED

    def offer_refused(self) -> None:
        """The peer refused our re-offer (a non-2xx to our re-INVITE): the call goes on as negotiated, with our
        wish as it was before the re-offer (a refused hold is no hold; a refused resume leaves the hold)."""
        self._expect("drop a refused re-offer", OfferAnswerState.REOFFERED)
        self._pending = None
        self._state = OfferAnswerState.NEGOTIATED
        self._wish = self._wish_before

    # -------------------------------------------------------------------------------------------- inside

    def _expect(self, action: str, *states: OfferAnswerState) -> None:
        if self._state not in states:
            raise LocalProtocolError(f"cannot {action} in state {self._state.value}")

    def _bound(self) -> tuple[str, int]:
        if self._address is None or self._port is None:
            raise LocalProtocolError("bind() the RTP address before making a description")
        return self._address, self._port

    def _local_media(self) -> LocalMedia:
        return LocalMedia(direction=self._wish, telephone_event=self.policy.telephone_event)

    def _reoffer_codecs(self) -> tuple[str, ...]:
        assert self._media is not None
        current = self._media.codec_name
        if not self.policy.allow_codec_change:
            return (current,)
        return (current, *(name for name in self.policy.codecs if name != current))

    def _negotiate(
        self, offer: SessionDescription, *, preferences: tuple[str, ...], current: SrtpNegotiated | None
    ) -> SecureNegotiation | Refused:
        try:
            negotiation = negotiate_secure(
                offer,
                local=self._local_media(),
                mode=self.policy.srtp,
                key_source=self._key_source,
                preferences=preferences,
                suites=self.policy.suites,
                current=current,
            )
            _check_media_address(negotiation.media)
        except SrtpRefused as exc:
            return Refused(status=_NOT_ACCEPTABLE, reason=exc.reason, code="srtp_refused")
        except NoCommonCodec as exc:
            if self._media is not None and not self.policy.allow_codec_change and _offers_audio(offer):
                reason = f"codec change not supported: the call is {self._media.codec_name} and the re-offer has none"
                return Refused(status=_NOT_ACCEPTABLE, reason=reason, code="codec_change")
            return Refused(status=_NOT_ACCEPTABLE, reason=exc.reason, code="no_common_codec")
        except SdpError as exc:
            return Refused(status=_NOT_ACCEPTABLE, reason=exc.reason, code="bad_sdp")
        return negotiation

    def _check_continuity(self, media: NegotiatedMedia, srtp: SrtpNegotiated | None, what: str) -> Refused | None:
        """What a later offer or answer may not change: RTP/SRTP, and the payload type of the codec."""
        assert self._media is not None
        try:
            check_update(self._srtp, srtp)
        except SrtpRefused as exc:
            return Refused(status=_NOT_ACCEPTABLE, reason=exc.reason, code="srtp_refused")
        if media.codec_name == self._media.codec_name and media.payload_type != self._media.payload_type:
            reason = (
                f"the {what} moves {media.codec_name} from payload type {self._media.payload_type} to "
                f"{media.payload_type} (RFC 3264 §8.3.2)"
            )
            return Refused(status=_NOT_ACCEPTABLE, reason=reason, code="codec_change")
        return None

    def _adopt(self, offer: SessionDescription, negotiation: SecureNegotiation) -> Answered:
        before = (self._media, self._srtp)
        rekeyed = self._media is not None and negotiation.srtp != self._srtp
        self._media, self._srtp, self._remote = negotiation.media, negotiation.srtp, offer
        self._state = OfferAnswerState.NEGOTIATED
        if self._address is None:
            self._unsent_answer = offer
        else:
            self._emit_answer(offer)
        after = (negotiation.media, negotiation.srtp)
        return Answered(media=negotiation.media, srtp=negotiation.srtp, rekeyed=rekeyed, changed=before != after)

    def _emit_answer(self, offer: SessionDescription) -> None:
        assert self._media is not None
        address, port = self._bound()
        answer = build_answer(
            offer,
            self._media,
            local_address=address,
            local_port=port,
            session_id=self._session_id,
            session_version=1,
        )
        self._emit(secure_answer(answer, SecureNegotiation(media=self._media, srtp=self._srtp)))

    def _emit(self, candidate: SessionDescription) -> SessionDescription:
        self._local = next_session_version(self._local, candidate)
        return self._local

    def _reoffer(self, *, rekey: bool) -> tuple[SessionDescription, _Pending]:
        """Our last description as a re-offer (RFC 3264 §8): same lines and payload types, our direction, the
        call's crypto line (a new key of ours when ``rekey``)."""
        assert self._local is not None and self._media is not None
        index = self._our_audio_index()
        media = list(self._local.media)
        section = media[index]
        attributes = tuple(a for a in section.attributes if a.name != "crypto")
        section = replace(section, direction=self._wish, attributes=attributes)
        if not self.policy.allow_codec_change:  # offer only what we can take: the call's codec and its events
            kept = tuple(c for c in section.codecs if self._is_current(c.name, c.clock_rate))
            section = replace(section, codecs=kept, formats=tuple(str(c.payload_type) for c in kept))
        media[index] = section
        description = replace(self._local, media=tuple(media))
        codecs = (self._media.codec_name,) if not self.policy.allow_codec_change else self.policy.codecs
        if self._srtp is None:
            return description, _Pending(crypto=(), mode="off", codecs=codecs)
        key = self._key_source(len(self._srtp.local_key)) if rekey else self._srtp.local_key
        line = CryptoAttribute(tag=self._srtp.tag, suite=self._srtp.suite, keys=(KeyParam(key_salt=key),))
        secure = section.proto.upper() in SRTP_PROFILES
        mode: SrtpMode = "required" if secure else "optional"
        return with_crypto(description, index, (line.to_attribute(),)), _Pending(
            crypto=(line,), mode=mode, codecs=codecs
        )

    def _is_current(self, name: str, clock_rate: int) -> bool:
        assert self._media is not None
        if name.lower() == "telephone-event":
            return clock_rate == self._media.telephone_event_clock_rate
        return name.lower() == self._media.codec_name.lower()

    def _our_audio_index(self) -> int:
        """The m= line of our description that carries the call's audio (the only one with a port)."""
        assert self._local is not None
        return next(i for i, m in enumerate(self._local.media) if m.media == "audio" and m.port != 0)

    def _read_answer(
        self, answer: SessionDescription | bytes, pending: _Pending, *, first: bool
    ) -> tuple[SessionDescription, NegotiatedMedia, SrtpNegotiated | None] | Refused:
        assert self._local is not None
        description = _parsed(answer)
        if isinstance(description, Refused):
            return description
        if len(description.media) != len(self._local.media):
            reason = (
                f"SDP: the answer has {len(description.media)} m= lines, our offer had "
                f"{len(self._local.media)} (RFC 3264 §6)"
            )
            return Refused(status=_NOT_ACCEPTABLE, reason=reason, code="bad_sdp")
        try:
            media = negotiate(
                description,
                local=self._local_media(),
                preferences=pending.codecs,
                profiles=RTP_PROFILES | SRTP_PROFILES,
            )
            _check_media_address(media)
            srtp = read_answer(description, media, pending.crypto, pending.mode)
        except SrtpRefused as exc:
            return Refused(status=_NOT_ACCEPTABLE, reason=exc.reason, code="srtp_refused")
        except NoCommonCodec as exc:
            code: RefusalCode = "no_common_codec" if first else "codec_change"
            return Refused(status=_NOT_ACCEPTABLE, reason=exc.reason, code=code)
        except SdpError as exc:
            return Refused(status=_NOT_ACCEPTABLE, reason=exc.reason, code="bad_sdp")
        if not first:
            refused = self._check_continuity(media, srtp, "answer")
            if refused is not None:
                return refused
        return description, media, srtp


def _parsed(body: SessionDescription | bytes) -> SessionDescription | Refused:
    if isinstance(body, SessionDescription):
        return body
    try:
        return parse_sdp(body)
    except SdpError as exc:
        return Refused(status=_NOT_ACCEPTABLE, reason=exc.reason, code="bad_sdp")


def _offers_audio(offer: SessionDescription) -> bool:
    profiles = RTP_PROFILES | SRTP_PROFILES
    return any(m.media == "audio" and m.port != 0 and m.proto.upper() in profiles for m in offer.media)


def _check_media_address(media: NegotiatedMedia) -> None:
    try:
        ipaddress.ip_address(media.remote_rtp[0])
    except ValueError:
        raise SdpError(f"media address {media.remote_rtp[0][:64]!r} is not an IP address") from None
