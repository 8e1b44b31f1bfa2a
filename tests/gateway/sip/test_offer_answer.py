"""One call's offer/answer (gateway/sip/offer_answer.py), tested as h11 tests its connections: two of them
negotiating with each other -- first offer and answer, hold and resume both ways, rekeys, refreshes, codec
changes, refusals that name the problem -- and hypothesis over sequences of re-offers."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from gateway.sip.errors import LocalProtocolError, SipConfigError
from gateway.sip.offer_answer import (
    Answered,
    MediaPolicy,
    OfferAnswer,
    OfferAnswerState,
    Refused,
)
from gateway.sip.sdes import crypto_lines
from gateway.sip.sdp import DIRECTIONS, Direction, SessionDescription, build_offer, parse_sdp

SUITE_80, SUITE_32 = "AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32"
_SENDS = {"sendrecv": True, "sendonly": True, "recvonly": False, "inactive": False}
_RECEIVES = {"sendrecv": True, "sendonly": False, "recvonly": True, "inactive": False}


class Keys:
    """A deterministic key source (what os.urandom stands in for): every key is new, and says whose it is."""

    def __init__(self, owner: int) -> None:
        self.owner = owner
        self.counter = itertools.count(1)

    def __call__(self, n: int) -> bytes:
        return bytes([self.owner, next(self.counter) % 256]) * (n // 2) + bytes(n % 2)


def side(
    owner: int, *, codecs: tuple[str, ...] = ("PCMU", "PCMA"), srtp: str = "optional", **policy: object
) -> OfferAnswer:
    return OfferAnswer(
        MediaPolicy(codecs=codecs, srtp=srtp, **policy),  # type: ignore[arg-type]
        session_id=1000 + owner,
        key_source=Keys(owner),
        address=f"192.0.2.{owner}",
        port=40000 + 2 * owner,
    )


def answered(result: Answered | Refused) -> Answered:
    assert isinstance(result, Answered), result
    return result


def refused(result: Answered | Refused) -> Refused:
    assert isinstance(result, Refused), result
    return result


def call(a: OfferAnswer, b: OfferAnswer) -> tuple[Answered, Answered]:
    """A offers, B answers, A takes the answer (over the wire: bytes both ways)."""
    offer = a.offer()
    at_b = answered(b.answer(offer.to_bytes()))
    assert b.local is not None
    at_a = answered(a.take_answer(b.local.to_bytes()))
    return at_b, at_a


def reoffer(
    offerer: OfferAnswer, answerer: OfferAnswer, *, direction: Direction | None = None, rekey: bool = False
) -> tuple[Answered, Answered]:
    offer = offerer.offer(direction=direction, rekey=rekey)
    at_answerer = answered(answerer.update(offer.to_bytes()))
    assert answerer.local is not None
    at_offerer = answered(offerer.take_answer(answerer.local.to_bytes()))
    return at_answerer, at_offerer


def version(oa: OfferAnswer) -> int:
    assert oa.local is not None
    return oa.local.origin.session_version


def audio_line(description: SessionDescription | None) -> int:
    assert description is not None
    return next(i for i, m in enumerate(description.media) if m.port != 0)


def sdp(text: str) -> bytes:
    return "".join(line.strip() + "\r\n" for line in text.strip().splitlines()).encode()


# -------------------------------------------------------------------------------------------- first offer


def test_two_sides_agree_on_codec_payload_types_keys_and_addresses() -> None:
    a, b = side(1), side(2, codecs=("PCMA", "PCMU"))
    at_b, at_a = call(a, b)
    assert at_a.media.codec_name == at_b.media.codec_name == "PCMA"  # the answerer's order decides
    assert (at_a.media.payload_type, at_a.media.telephone_event_payload_type) == (8, 101)
    assert at_b.media.remote_rtp == ("192.0.2.1", 40002) and at_a.media.remote_rtp == ("192.0.2.2", 40004)
    assert at_a.media.direction == at_b.media.direction == "sendrecv"
    assert a.srtp is not None and b.srtp is not None  # both optional: A's OSRTP offer is taken as SRTP
    assert (a.srtp.local_key, a.srtp.remote_key) == (b.srtp.remote_key, b.srtp.local_key)
    assert a.srtp.suite == b.srtp.suite == SUITE_80 and a.srtp.local_key[0] == 1 and b.srtp.local_key[0] == 2
    assert version(a) == version(b) == 1
    assert a.state is b.state is OfferAnswerState.NEGOTIATED
    assert b.local is not None and b.local.origin.session_id == 1002


def test_required_offers_savp_and_off_offers_plain_rtp() -> None:
    a, b = side(1, srtp="required", suites=(SUITE_32,)), side(2, srtp="required")
    offer = a.offer()
    assert offer.media[0].proto == "RTP/SAVP"
    assert [(line.tag, line.suite) for _, line in crypto_lines(offer.media[0])] == [(1, SUITE_32)]  # type: ignore[union-attr]
    answered(b.answer(offer))
    answered(a.take_answer(b.local))  # type: ignore[arg-type]
    assert a.srtp is not None and a.srtp.suite == SUITE_32
    plain, other = side(3, srtp="off"), side(4, srtp="off")
    call(plain, other)
    assert plain.srtp is None and other.srtp is None and b"a=crypto" not in plain.local.to_bytes()  # type: ignore[union-attr]


def test_the_opus_clock_picks_the_48000_telephone_event() -> None:
    a, b = side(1, codecs=("opus", "PCMU")), side(2, codecs=("opus",))
    at_b, at_a = call(a, b)
    assert (at_b.media.codec_name, at_b.media.payload_type, at_b.media.telephone_event_payload_type) == (
        "opus",
        111,
        110,
    )
    assert at_a.media.telephone_event_clock_rate == 48000


def test_an_offer_answered_before_the_rtp_port_is_open_is_described_when_bound() -> None:
    a = side(1)
    b = OfferAnswer(MediaPolicy(), session_id=7, key_source=Keys(2))
    result = answered(b.answer(a.offer()))
    assert b.local is None and result.media.codec_name == "PCMU"  # the cost can be known before the port
    b.bind(address="198.51.100.9", port=30000)
    assert b.local is not None and (b.local.media[0].port, b.local.origin.address) == (30000, "198.51.100.9")
    answered(a.take_answer(b.local))
    with pytest.raises(LocalProtocolError, match="bound"):
        b.bind(address="198.51.100.9", port=30002)


# ---------------------------------------------------------------------------------------- hold, resume


@pytest.mark.parametrize(
    ("held_by_offer", "answer", "offerer_now"),
    [("sendonly", "recvonly", "sendonly"), ("inactive", "inactive", "inactive"), ("recvonly", "sendonly", "recvonly")],
)
def test_hold_and_resume_either_way(held_by_offer: Direction, answer: Direction, offerer_now: Direction) -> None:
    a, b = side(1), side(2)
    call(a, b)
    at_b, at_a = reoffer(a, b, direction=held_by_offer)
    assert (at_b.media.direction, at_a.media.direction) == (answer, offerer_now)
    assert at_b.media.on_hold == (held_by_offer in ("sendonly", "inactive"))
    assert b.local is not None and b.local.media[0].direction == answer
    assert (version(a), version(b)) == (2, 2)
    # B refreshes: A's hold is A's wish and outlives B's re-offer.
    at_a, at_b = reoffer(b, a)
    assert at_a.media.direction == offerer_now and at_b.media.direction == answer
    # B offers sendrecv where it answered the hold (one up); A answers what it offered last (the same)
    assert (version(a), version(b)) == (2, 3)
    at_b, at_a = reoffer(a, b, direction="sendrecv")
    assert at_b.media.direction == at_a.media.direction == "sendrecv" and not at_b.media.on_hold
    assert (version(a), version(b)) == (3, 3)


def test_both_sides_hold_and_the_call_goes_inactive() -> None:
    a, b = side(1), side(2)
    call(a, b)
    reoffer(a, b, direction="sendonly")
    at_a, at_b = reoffer(b, a, direction="sendonly")
    assert at_a.media.direction == at_b.media.direction == "inactive"
    at_b, at_a = reoffer(a, b, direction="sendrecv")  # A resumes; B still holds A
    assert (at_b.media.direction, at_a.media.direction) == ("sendonly", "recvonly")


def test_an_rfc_2543_hold_stops_our_sending_but_not_our_receiving() -> None:
    a, b = side(1), side(2)
    call(a, b)
    offer = a.offer()
    held = replace(offer, connection=replace(offer.connection, address="0.0.0.0"))  # type: ignore[arg-type]
    result = answered(b.update(held))
    assert result.media.on_hold and result.media.direction == "recvonly"


# -------------------------------------------------------------------------------------- keys, refresh


def test_a_rekey_changes_the_offerers_key_only() -> None:
    a, b = side(1), side(2)
    call(a, b)
    assert a.srtp is not None and b.srtp is not None
    a_key, b_key = a.srtp.local_key, b.srtp.local_key
    at_b, at_a = reoffer(a, b, rekey=True)
    assert at_b.rekeyed and at_a.rekeyed and at_b.changed
    assert b.srtp.local_key == b_key and b.srtp.remote_key != a_key  # type: ignore[union-attr]
    assert a.srtp.local_key == b.srtp.remote_key and a.srtp.remote_key == b_key  # type: ignore[union-attr]
    assert (a.srtp.tag, a.srtp.suite) == (b.srtp.tag, b.srtp.suite)  # type: ignore[union-attr]
    assert (version(a), version(b)) == (2, 1)  # B's answer is the same description as before


def test_a_refresh_changes_nothing_and_keeps_both_versions() -> None:
    a, b = side(1), side(2)
    call(a, b)
    at_b, at_a = reoffer(b, a)  # B's re-offer is its answer again; A's answer lists less than its offer did
    assert not at_b.changed and not at_b.rekeyed and not at_a.changed
    assert (version(a), version(b)) == (2, 1)
    assert a.local is not None and [c.name for c in a.local.media[0].codecs] == ["PCMU", "telephone-event"]
    assert len(crypto_lines(a.local.media[0])) == 1  # the accepted line only
    first_a, first_b = a.local, b.local
    reoffer(a, b)
    reoffer(b, a)
    assert (a.local, b.local) == (first_a, first_b)


def test_a_peer_that_moves_its_media_address_is_followed() -> None:
    a, b = side(1), side(2)
    call(a, b)
    offer = a.offer()
    moved = replace(offer, media=(replace(offer.media[0], port=50000),))
    result = answered(b.update(moved))
    assert result.changed and not result.rekeyed and result.media.remote_rtp == ("192.0.2.1", 50000)


# -------------------------------------------------------------------------------------------- codecs


def test_a_reoffer_that_ranks_another_codec_first_keeps_the_calls_codec() -> None:
    a, b = side(1, codecs=("PCMA",), srtp="off"), side(2, codecs=("PCMU", "PCMA"), srtp="off")
    call(a, b)
    reoffer_ = build_offer(local_address="192.0.2.1", local_port=40002, session_id=1001, session_version=2)
    assert answered(b.update(reoffer_)).media.codec_name == "PCMA"


def test_a_codec_change_is_refused_unless_the_policy_allows_it() -> None:
    pcma_only = build_offer(
        local_address="192.0.2.1", local_port=40002, session_id=1001, session_version=2, preferences=("PCMA",)
    )
    a, b = side(1, srtp="off"), side(2, srtp="off")
    call(a, b)
    result = refused(b.update(pcma_only))
    assert (result.status, result.code) == (488, "codec_change")
    assert result.reason == "codec change not supported: the call is PCMU and the re-offer has none"
    assert b.media is not None and b.media.codec_name == "PCMU" and version(b) == 1  # the call goes on
    c, d = side(3, srtp="off"), side(4, srtp="off", allow_codec_change=True)
    call(c, d)
    changed = answered(d.update(pcma_only))
    assert changed.changed and changed.media.codec_name == "PCMA" and version(d) == 2


def test_a_payload_type_that_changes_codec_mid_call_is_refused() -> None:
    a, b = side(1, codecs=("opus",)), side(2, codecs=("opus",))
    call(a, b)
    offer = a.offer()
    media = offer.media[0]
    moved = replace(
        media,
        formats=("96", *media.formats[1:]),
        codecs=(replace(media.codecs[0], payload_type=96), *media.codecs[1:]),
    )
    result = refused(b.update(replace(offer, media=(moved,))))
    assert result.reason == "the re-offer moves opus from payload type 111 to 96 (RFC 3264 §8.3.2)"


# -------------------------------------------------------------------------------------------- refusals


_PLAIN_PCMU = """
    v=0
    o=- 1 1 IN IP4 192.0.2.1
    s=-
    c=IN IP4 {address}
    t=0 0
    m=audio 4000 {proto} {formats}
    {extra}
"""


def plain(*, address: str = "192.0.2.1", proto: str = "RTP/AVP", formats: str = "0", extra: str = "") -> bytes:
    return sdp(_PLAIN_PCMU.format(address=address, proto=proto, formats=formats, extra=extra or "a=sendrecv"))


@pytest.mark.parametrize(
    ("policy", "offer", "code", "reason"),
    [
        ({}, b"v=0\r\no=- 1 1 IN IP4 192.0.2.1\r\ns=-\r\nm=audio x RTP/AVP 0\r\n", "bad_sdp", "SDP: line 4: bad port"),
        ({}, plain(formats="18"), "no_common_codec", "SDP: no common audio codec"),
        (
            {},
            plain(proto="UDP/TLS/RTP/SAVPF", formats="111"),
            "no_common_codec",
            "SDP: no RTP/AVP audio stream offered",
        ),
        (
            {"srtp": "required"},
            plain(),
            "srtp_refused",
            "SRTP: SRTP is required here and the offer has no a=crypto",
        ),
        (
            {"srtp": "off"},
            plain(proto="RTP/SAVP", extra="a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:c2hvcnQ="),
            "srtp_refused",
            "SRTP: the offer's audio is RTP/SAVP only and SRTP is off here",
        ),
        (
            {},
            plain(proto="RTP/SAVP", extra="a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:c2hvcnQ="),
            "srtp_refused",
            "SRTP: no usable a=crypto: a=crypto:1 key of 5 octets, AES_CM_128_HMAC_SHA1_80 needs 30",
        ),
        ({}, plain(address="media.example.com"), "bad_sdp", "SDP: media address 'media.example.com' is not an IP"),
    ],
)
def test_a_refused_first_offer_says_why(policy: dict[str, object], offer: bytes, code: str, reason: str) -> None:
    b = side(2, **policy)  # type: ignore[arg-type]
    result = refused(b.answer(offer))
    assert (result.status, result.code) == (488, code) and result.reason.startswith(reason), result.reason
    assert b.state is OfferAnswerState.IDLE and b.local is None and b.media is None


def test_moving_a_call_between_rtp_and_srtp_is_refused_and_the_call_goes_on() -> None:
    a, b = side(1, srtp="off"), side(2)
    call(a, b)
    secure = side(9, srtp="required").offer()
    result = refused(b.update(secure))
    assert result.reason == "SRTP: the call is RTP; changing it to SRTP mid-call is not supported"
    assert b.srtp is None and b.media is not None and b.media.remote_rtp == ("192.0.2.1", 40002)


def test_an_answer_that_breaks_our_offer_is_refused() -> None:
    a = side(1, codecs=("PCMA",))
    a.offer()
    wrong_codec = refused(a.take_answer(plain()))
    assert (wrong_codec.code, wrong_codec.reason) == ("no_common_codec", "SDP: no common audio codec")
    two_lines = refused(a.take_answer(plain(extra="m=video 0 RTP/AVP 31")))
    assert two_lines.reason == "SDP: the answer has 2 m= lines, our offer had 1 (RFC 3264 §6)"
    assert a.state is OfferAnswerState.OFFERED  # the first offer's call cannot go on: the worker ends it
    required = side(3, srtp="required")
    required.offer()
    no_crypto = refused(required.take_answer(plain(proto="RTP/SAVP", formats="0")))
    assert no_crypto.reason == "SRTP: the answer has no a=crypto for our SRTP offer"


def test_a_refused_answer_to_a_reoffer_leaves_the_call_as_it_was() -> None:
    a, b = side(1), side(2)
    call(a, b)
    before = (a.media, a.srtp)
    a.offer(direction="sendonly", rekey=True)
    result = refused(a.take_answer(plain()))  # a plain answer to an SRTP call
    assert result.code == "srtp_refused" and (a.media, a.srtp) == before
    assert a.state is OfferAnswerState.NEGOTIATED


def test_a_peers_offer_replaces_our_unanswered_reoffer() -> None:
    a, b = side(1), side(2)
    call(a, b)
    a.offer(direction="sendonly")  # its answer would come in an ACK the SIP core absorbs
    at_a, _ = reoffer(b, a)
    assert a.state is OfferAnswerState.NEGOTIATED and at_a.media.direction == "sendonly"
    a.offer(direction="sendrecv")
    again = a.offer()  # a second re-offer replaces the first, still unanswered
    assert again.media[0].direction == "sendrecv" and a.state is OfferAnswerState.REOFFERED
    assert answered(b.update(again)).media.direction == "sendrecv"
    assert answered(a.take_answer(b.local)).media.direction == "sendrecv"  # type: ignore[arg-type]


def test_steps_out_of_order_are_local_errors() -> None:
    a = side(1)
    with pytest.raises(LocalProtocolError, match="cannot take an answer in state idle"):
        a.take_answer(plain())
    with pytest.raises(LocalProtocolError, match="cannot take a re-offer in state idle"):
        a.update(plain())
    a.offer()
    with pytest.raises(LocalProtocolError, match="cannot make an offer in state offered"):
        a.offer()
    with pytest.raises(LocalProtocolError, match="cannot answer an offer in state offered"):
        a.answer(plain())
    unbound = OfferAnswer(MediaPolicy(), session_id=1, key_source=Keys(1))
    with pytest.raises(LocalProtocolError, match="bind"):
        unbound.offer()


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({"codecs": ()}, "codecs must be distinct names"),
        ({"codecs": ("PCMU", "G729")}, "codecs must be distinct names"),
        ({"codecs": ("PCMU", "PCMU")}, "codecs must be distinct names"),
        ({"srtp": "sometimes"}, "SRTP mode must be one of"),
        ({"suites": ("F8_128_HMAC_SHA1_80",)}, "SRTP suites must be among"),
    ],
)
def test_a_policy_is_checked_when_made(policy: dict[str, object], message: str) -> None:
    with pytest.raises(SipConfigError, match=message):
        MediaPolicy(**policy)  # type: ignore[arg-type]


# -------------------------------------------------------------------------------------------- properties

_MODES = [("off", "off"), ("optional", "optional"), ("optional", "required"), ("required", "optional")]
_MODES += [("required", "required"), ("optional", "off"), ("off", "optional")]
_CODEC_LISTS = st.lists(st.sampled_from(["PCMU", "PCMA", "G722", "opus"]), min_size=1, max_size=4, unique=True)
_STEP = st.tuples(st.booleans(), st.sampled_from([None, *DIRECTIONS]), st.booleans())


@settings(max_examples=150, deadline=None)
@given(
    modes=st.sampled_from(_MODES),
    codecs_a=_CODEC_LISTS,
    codecs_b=_CODEC_LISTS,
    steps=st.lists(_STEP, max_size=12),
)
def test_any_sequence_of_reoffers_keeps_both_sides_agreed(
    modes: tuple[str, str],
    codecs_a: list[str],
    codecs_b: list[str],
    steps: list[tuple[bool, Direction | None, bool]],
) -> None:
    """Invariants after every exchange: one codec both policies list, directions that complement each other
    (RFC 3264 §6.1), each side's key changed only by its own rekey, and each o= version up by exactly one
    when (and only when) that side's description changed."""
    a = side(1, codecs=tuple(codecs_a), srtp=modes[0])
    b = side(2, codecs=tuple(codecs_b), srtp=modes[1])
    offer = a.offer()
    first = b.answer(offer)
    if isinstance(first, Refused):  # nothing in common (codec or security): a 488 that says so
        assert first.status == 488 and first.code in ("no_common_codec", "srtp_refused")
        assert not set(codecs_a) & set(codecs_b) or ("off" in modes and "required" in modes)
        return
    assert set(codecs_a) & set(codecs_b) and not ("off" in modes and "required" in modes)
    answered(a.take_answer(b.local))  # type: ignore[arg-type]
    codec = first.media.codec_name
    _check_agreed(a, b, codec, codecs_a, codecs_b)
    for a_offers, direction, rekey in steps:
        offerer, answerer = (a, b) if a_offers else (b, a)
        keys_before = {id(x): x.srtp.local_key if x.srtp else None for x in (a, b)}
        wish_before = offerer.wish
        sent_before = {id(x): x.local for x in (a, b)}
        offer = offerer.offer(direction=direction, rekey=rekey)
        at_answerer = answered(answerer.update(offer.to_bytes()))
        assert answerer.local is not None
        answer = answerer.local
        answered(offerer.take_answer(answer.to_bytes()))
        _check_agreed(a, b, codec, codecs_a, codecs_b)
        # RFC 3264 §6.1: the answer takes no direction the offer did not allow, and all of it unless on hold.
        offered = offer.media[audio_line(offer)].direction or "sendrecv"
        given_ = answer.media[audio_line(answer)].direction or "sendrecv"
        assert not _SENDS[given_] or _RECEIVES[offered]
        assert not _RECEIVES[given_] or _SENDS[offered]
        if answerer.wish == "sendrecv":
            assert (_SENDS[given_], _RECEIVES[given_]) == (_RECEIVES[offered], _SENDS[offered])
        assert offered == (direction or wish_before)
        # keys: the answerer's never change; the offerer's only when it rekeys
        if offerer.srtp is not None:
            assert answerer.srtp is not None
            assert answerer.srtp.local_key == keys_before[id(answerer)]
            assert (offerer.srtp.local_key != keys_before[id(offerer)]) == rekey
            assert at_answerer.rekeyed == rekey
        for x in (a, b):
            before, after = sent_before[id(x)], x.local
            assert before is not None and after is not None
            same = replace(after, origin=before.origin) == before
            assert after.origin.session_version == before.origin.session_version + (0 if same else 1)
            assert after.origin.session_id == before.origin.session_id


def _check_agreed(a: OfferAnswer, b: OfferAnswer, codec: str, codecs_a: list[str], codecs_b: list[str]) -> None:
    assert a.media is not None and b.media is not None
    assert a.media.codec_name == b.media.codec_name == codec and codec in codecs_a and codec in codecs_b
    assert a.media.payload_type == b.media.payload_type
    assert a.media.telephone_event_payload_type == b.media.telephone_event_payload_type
    assert _SENDS[a.media.direction] == _RECEIVES[b.media.direction]
    assert _SENDS[b.media.direction] == _RECEIVES[a.media.direction]
    assert (a.srtp is None) == (b.srtp is None)
    if a.srtp is not None and b.srtp is not None:
        assert (a.srtp.local_key, a.srtp.remote_key) == (b.srtp.remote_key, b.srtp.local_key)
        assert (a.srtp.tag, a.srtp.suite) == (b.srtp.tag, b.srtp.suite)
    assert parse_sdp(a.local.to_bytes()) == a.local  # type: ignore[union-attr]


# ----------------------------------------------------------------------------- RFC 3264 corner cases

_TWO_AUDIO_AND_VIDEO = """
    v=0
    o=- 5 5 IN IP4 192.0.2.7
    s=-
    c=IN IP4 192.0.2.7
    t=0 0
    m=video 5000 RTP/AVP 31
    m=audio 0 RTP/AVP 0
    m=audio 6000 RTP/AVP 8 0 101
    a=rtpmap:101 telephone-event/8000
    a=ptime:{ptime}
    m=audio 7000 RTP/AVP 0
"""


def test_streams_we_do_not_take_are_answered_with_port_0_and_stay_in_our_reoffer() -> None:
    b = side(2, srtp="off", codecs=("PCMA", "PCMU"))
    result = answered(b.answer(sdp(_TWO_AUDIO_AND_VIDEO.format(ptime=20))))
    # The port-0 audio line is skipped; the first live one is taken, with static payload types and no rtpmap.
    assert (result.media.media_index, result.media.codec_name, result.media.payload_type) == (2, "PCMA", 8)
    assert result.media.remote_rtp == ("192.0.2.7", 6000)
    assert b.local is not None
    assert [(m.media, m.port) for m in b.local.media] == [("video", 0), ("audio", 0), ("audio", 40004), ("audio", 0)]
    assert b.local.media[2].formats == ("8", "101")  # the offerer's numbers (RFC 3264 §6.1)
    reoffer_ = b.offer(direction="sendonly")
    assert [(m.media, m.port) for m in reoffer_.media] == [(m.media, m.port) for m in b.local.media]
    assert reoffer_.media[2].direction == "sendonly" and reoffer_.origin.session_version == 2


def test_an_answer_may_take_the_second_line_and_refuse_the_rest() -> None:
    b = side(2, srtp="off")
    answered(b.answer(sdp(_TWO_AUDIO_AND_VIDEO.format(ptime=20))))
    offer = b.offer()
    answer = sdp("""
        v=0
        o=- 5 6 IN IP4 192.0.2.7
        s=-
        c=IN IP4 192.0.2.7
        t=0 0
        m=video 0 RTP/AVP 31
        m=audio 0 RTP/AVP 0
        m=audio 6002 RTP/AVP 0 101
        a=rtpmap:101 telephone-event/8000
        m=audio 0 RTP/AVP 0
    """)
    assert len(offer.media) == 4
    result = answered(b.take_answer(answer))
    assert result.media.remote_rtp == ("192.0.2.7", 6002) and result.changed and not result.rekeyed


@pytest.mark.parametrize(("ptime", "taken"), [(20, 20), (40, 40), (60, 60), (30, 20), (10, 20), (240, 20)])
def test_the_offers_ptime_is_taken_when_our_tick_can_send_it(ptime: int, taken: int) -> None:
    b = side(2, srtp="off")
    result = answered(b.answer(sdp(_TWO_AUDIO_AND_VIDEO.format(ptime=ptime))))
    assert result.media.ptime == taken and b.local is not None and b.local.media[2].ptime == taken


def test_an_offer_without_telephone_event_gets_an_answer_without_it() -> None:
    b = side(2, srtp="off")
    result = answered(b.answer(plain(formats="0")))
    assert result.media.telephone_event_payload_type is None
    assert b.local is not None and [c.name for c in b.local.media[0].codecs] == ["PCMU"]


def test_a_policy_without_telephone_event_neither_offers_nor_answers_it() -> None:
    a, b = side(1, srtp="off", telephone_event=False), side(2, srtp="off")
    assert [c.name for c in a.offer().media[0].codecs] == ["PCMU", "PCMA"]
    answered(b.answer(a.local))  # type: ignore[arg-type]
    at_a = answered(a.take_answer(b.local))  # type: ignore[arg-type]
    assert at_a.media.telephone_event_payload_type is None


def test_a_session_level_direction_holds_like_a_media_level_one() -> None:
    a, b = side(1, srtp="off"), side(2, srtp="off")
    call(a, b)
    offer = a.offer()
    held = replace(offer, direction="sendonly", media=(replace(offer.media[0], direction=None),))
    result = answered(b.update(held))
    assert result.media.on_hold and result.media.direction == "recvonly"


def test_a_reoffer_that_removes_the_audio_stream_is_refused_and_the_call_goes_on() -> None:
    a, b = side(1, srtp="off"), side(2, srtp="off")
    call(a, b)
    offer = a.offer()
    removed = replace(offer, media=(replace(offer.media[0], port=0),))
    result = refused(b.update(removed))
    assert (result.code, result.reason) == ("no_common_codec", "SDP: no RTP/AVP audio stream offered")
    assert b.media is not None and b.media.remote_rtp == ("192.0.2.1", 40002)


def test_ipv6_media_addresses_are_taken() -> None:
    a = OfferAnswer(MediaPolicy(srtp="off"), session_id=1, key_source=Keys(1), address="2001:db8::1", port=4000)
    b = side(2, srtp="off")
    offer = a.offer()
    assert offer.connection is not None and offer.connection.address_type == "IP6"
    assert answered(b.answer(offer.to_bytes())).media.remote_rtp == ("2001:db8::1", 4000)


_CONNECTION = st.sampled_from(
    ["c=IN IP4 192.0.2.9", "c=IN IP4 0.0.0.0", "c=IN IP6 2001:db8::9", "c=IN IP4 host.example"]
)
_M_LINE = st.sampled_from(
    [
        "m=audio 4100 RTP/AVP 0 8 101",
        "m=audio 4100 RTP/AVP 8 0",
        "m=audio 0 RTP/AVP 0",
        "m=audio 4100 RTP/SAVP 0 101",
        "m=audio 4100 RTP/AVP 96",
        "m=audio 4100 RTP/AVP 0 96",
        "m=audio x RTP/AVP 0",
        "m=video 5000 RTP/AVP 31",
    ]
)
_ATTRIBUTE = st.sampled_from(
    [
        "a=rtpmap:101 telephone-event/8000",
        "a=rtpmap:96 opus/48000/2",
        "a=rtpmap:96 PCMU/8000",
        "a=rtpmap:0 PCMA/8000",
        "a=sendonly",
        "a=recvonly",
        "a=inactive",
        "a=sendrecv",
        "a=ptime:40",
        "a=ptime:banana",
        "a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:" + "QUJD" * 10,
        "a=crypto:2 AES_CM_128_HMAC_SHA1_32 inline:" + "WFla" * 10,
        "a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:c2hvcnQ=",
        "a=rtcp:4101",
        "b=AS:64",
        "x=unknown",
    ]
)
_SECTION = st.tuples(_M_LINE, st.lists(_ATTRIBUTE, max_size=4)).map(lambda s: [s[0], *s[1]])


@settings(max_examples=300, deadline=None)
@given(
    srtp=st.sampled_from(["off", "optional", "required"]),
    connection=_CONNECTION,
    sections=st.lists(_SECTION, min_size=1, max_size=3),
    before=st.booleans(),
)
def test_any_reoffer_is_answered_or_refused_with_488_and_a_refusal_changes_nothing(
    srtp: str, connection: str, sections: list[list[str]], before: bool
) -> None:
    """Whatever a peer re-offers, update() answers it or refuses it (488 with a reason); a refusal leaves the
    call, our description and its version exactly as they were."""
    a, b = side(1, srtp=srtp), side(2, srtp=srtp)
    call(a, b)
    if before:
        reoffer(a, b, direction="sendonly")
    lines = ["v=0", "o=- 1 9 IN IP4 192.0.2.9", "s=-", connection, "t=0 0", *itertools.chain(*sections)]
    body = "".join(line + "\r\n" for line in lines).encode()
    state = (b.media, b.srtp, b.local, b.state)
    result = b.update(body)
    event(type(result).__name__ if isinstance(result, Answered) else result.code)
    if isinstance(result, Refused):
        assert result.status == 488 and result.reason and len(result.reason) < 200
        assert (b.media, b.srtp, b.local, b.state) == state
        return
    assert b.local is not None and b.media is not None and b.media.codec_name == state[0].codec_name  # type: ignore[union-attr]
    assert b.local.origin.session_version - state[2].origin.session_version in (0, 1)  # type: ignore[union-attr]


def test_a_refused_reoffer_leaves_the_call_and_our_wish_as_they_were() -> None:
    a, b = side(1), side(2)
    call(a, b)
    a.offer(direction="sendonly")  # the peer answers this hold with a 4xx/5xx
    a.offer_refused()
    assert a.state is OfferAnswerState.NEGOTIATED and a.wish == "sendrecv"
    at_b, _ = reoffer(a, b)  # a refresh of ours is no hold
    assert at_b.media.direction == "sendrecv" and not at_b.media.on_hold
    reoffer(a, b, direction="sendonly")
    a.offer(direction="sendrecv")  # a refused resume: the peer stays on hold
    a.offer_refused()
    assert a.wish == "sendonly"
    at_b, _ = reoffer(a, b)
    assert at_b.media.on_hold
    with pytest.raises(LocalProtocolError):
        a.offer_refused()  # nothing is pending
