"""SDES (RFC 4568): a=crypto grammar, choosing a line per mode, our answers and offers, reading answers, re-offers."""

from __future__ import annotations

import base64
import contextlib
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.sip.sdes import (
    CryptoAttribute,
    CryptoError,
    KeyParam,
    SrtpNegotiated,
    SrtpRefused,
    check_update,
    crypto_lines,
    negotiate_secure,
    offer_crypto,
    parse_crypto,
    read_answer,
    reoffer_crypto,
    secure_answer,
    secure_offer,
    usable_key,
)
from gateway.sip.sdp import LocalMedia, NoCommonCodec, build_answer, build_offer, parse_sdp

KEY_A = bytes(range(30))
KEY_B = bytes(range(100, 130))
B64_A = base64.b64encode(KEY_A).decode()
B64_B = base64.b64encode(KEY_B).decode()


def sdp(text: str) -> bytes:
    return "".join(line.strip() + "\r\n" for line in text.strip().splitlines()).encode()


def offer(proto: str, *crypto: str, second: str = "") -> bytes:
    lines = "\n".join(f"a=crypto:{c}" for c in crypto)
    return sdp(f"""
        v=0
        o=- 1 1 IN IP4 127.0.0.1
        s=-
        c=IN IP4 127.0.0.1
        t=0 0
        m=audio 4000 {proto} 0 101
        a=rtpmap:0 PCMU/8000
        a=rtpmap:101 telephone-event/8000
        {lines}
        a=sendrecv
        {second}
    """)


class Keys:
    """Deterministic key source: each call gives the next distinct key (what os.urandom stands in for)."""

    def __init__(self) -> None:
        self.counter = itertools.count(1)
        self.asked: list[int] = []

    def __call__(self, n: int) -> bytes:
        self.asked.append(n)
        return bytes([next(self.counter)]) * n


def answer_to(body: bytes, mode: str = "optional", **kwargs: object):  # type: ignore[no-untyped-def]
    return negotiate_secure(parse_sdp(body), local=LocalMedia(), mode=mode, key_source=Keys(), **kwargs)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ grammar


def test_parse_full_line_with_lifetime_mki_and_session_params() -> None:
    line = parse_crypto(f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_A}|2^20|1:4 KDR=0 WSH=128")
    assert line.tag == 1
    assert line.suite == "AES_CM_128_HMAC_SHA1_80"
    assert line.keys == (KeyParam(key_salt=KEY_A, lifetime=2**20, mki=(1, 4), lifetime_text="2^20"),)
    assert line.session_params == ("KDR=0", "WSH=128")
    assert line.to_value() == f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_A}|2^20|1:4 KDR=0 WSH=128"


def test_parse_decimal_lifetime_and_mki_without_lifetime() -> None:
    assert parse_crypto(f"7 AES_CM_128_HMAC_SHA1_32 inline:{B64_A}|1048576").keys[0].lifetime == 1048576
    key = parse_crypto(f"7 AES_CM_128_HMAC_SHA1_32 inline:{B64_A}|3:2").keys[0]
    assert key.mki == (3, 2) and key.lifetime is None


def test_parse_tolerates_tabs_and_several_spaces() -> None:
    assert parse_crypto(f"2\tAES_CM_128_HMAC_SHA1_80   inline:{B64_A}").tag == 2


def test_unpadded_base64_is_read() -> None:
    # 30 octets need no padding; 31 would. A sender that strips "=" is still understood.
    key = bytes(31)
    text = base64.b64encode(key).decode().rstrip("=")
    assert parse_crypto(f"1 AES_CM_128_HMAC_SHA1_80 inline:{text}").keys[0].key_salt == key


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("1 AES_CM_128_HMAC_SHA1_80", "needs a tag, a crypto-suite and key parameters"),
        (f"x AES_CM_128_HMAC_SHA1_80 inline:{B64_A}", "tag 'x' is not 1 to 9 digits"),
        (f"1234567890 AES_CM_128_HMAC_SHA1_80 inline:{B64_A}", "tag '1234567890' is not 1 to 9 digits"),
        (f"1 AES-CM inline:{B64_A}", "crypto-suite is not letters, digits and '_'"),
        ("1 AES_CM_128_HMAC_SHA1_80 inline:not*base64", "key is not base64"),
        ("1 AES_CM_128_HMAC_SHA1_80 inline:QUJD=A", "key is not base64"),
        ("1 AES_CM_128_HMAC_SHA1_80 inline", "key parameter is not <key-method>:<key-info>"),
        (f"1 AES_CM_128_HMAC_SHA1_80 uri:{B64_A}", "key method 'uri' is not supported (only inline)"),
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_A}|2^20|1:4|9", "key-info has more than key|lifetime|MKI"),
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_A}|1:4|2^20", "bad lifetime or MKI '2^20'"),
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_A}|1:200", "MKI length 200 outside 1..128"),
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_A}|2^99", "lifetime 2^99 is beyond 2^64"),
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_A}|0", "lifetime 0"),
    ],
)
def test_grammar_errors_are_precise(value: str, reason: str) -> None:
    with pytest.raises(CryptoError) as caught:
        parse_crypto(value)
    assert caught.value.crypto_reason == reason
    assert caught.value.status_code == 488


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (f"1 F8_128_HMAC_SHA1_80 inline:{B64_A}", "suite F8_128_HMAC_SHA1_80 is not supported"),
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_A[:-4]}", "key of 27 octets, AES_CM_128_HMAC_SHA1_80 needs 30"),
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_A}|2^31|1:4", "MKI is not supported"),
        (
            f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_A}|2^20|1:4;inline:{B64_B}|2^20|2:4",
            "2 keys (several keys need MKIs, which are not supported)",
        ),
        (
            f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_A} UNENCRYPTED_SRTP",
            "session parameter UNENCRYPTED_SRTP is not supported",
        ),
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_A} KDR=4", "KDR=4 is not supported (only 0)"),
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_A} WSH=32", "WSH=32 is not a window of at least 64"),
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_A} FEC_KEY=x", "session parameter FEC_KEY is not supported"),
    ],
)
def test_lines_we_cannot_use_say_why(value: str, reason: str) -> None:
    with pytest.raises(CryptoError) as caught:
        usable_key(parse_crypto(value))
    assert caught.value.crypto_reason == reason
    assert caught.value.tag == 1


def test_usable_key_with_optional_extension_and_window() -> None:
    line = parse_crypto(f"1 AES_CM_128_HMAC_SHA1_32 inline:{B64_A}|2^31 -X_LATER=1 KDR=0 WSH=256 FEC_ORDER=FEC_SRTP")
    assert usable_key(line) == (KEY_A, 256)


def test_usable_key_only_among_configured_suites() -> None:
    line = parse_crypto(f"1 AES_CM_128_HMAC_SHA1_32 inline:{B64_A}")
    with pytest.raises(CryptoError, match="suite AES_CM_128_HMAC_SHA1_32 is not supported"):
        usable_key(line, ("AES_CM_128_HMAC_SHA1_80",))


@given(
    tag=st.integers(0, 999_999_999),
    suite=st.sampled_from(["AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32", "OTHER_SUITE"]),
    key=st.binary(min_size=1, max_size=60),
    lifetime=st.one_of(st.none(), st.integers(1, 48)),
    mki=st.one_of(st.none(), st.tuples(st.integers(0, 2**32), st.integers(1, 128))),
    params=st.lists(st.sampled_from(["KDR=0", "WSH=64", "-EXT"]), max_size=3),
)
def test_serialize_parse_round_trip(
    tag: int, suite: str, key: bytes, lifetime: int | None, mki: tuple[int, int] | None, params: list[str]
) -> None:
    param = KeyParam(
        key_salt=key,
        lifetime=None if lifetime is None else 2**lifetime,
        lifetime_text="" if lifetime is None else f"2^{lifetime}",
        mki=mki,
    )
    line = CryptoAttribute(tag=tag, suite=suite, keys=(param,), session_params=tuple(params))
    assert parse_crypto(line.to_value()) == line


@given(st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=120))
def test_any_printable_line_parses_or_raises_crypto_error(value: str) -> None:
    with contextlib.suppress(CryptoError):
        parse_crypto(value)


# ---------------------------------------------------------------------------------------- answerer


def test_savp_offer_answered_with_one_line_of_ours_in_offerers_order() -> None:
    body = offer("RTP/SAVP", f"1 AES_CM_128_HMAC_SHA1_32 inline:{B64_A}", f"2 AES_CM_128_HMAC_SHA1_80 inline:{B64_B}")
    result = answer_to(body)
    assert result.srtp is not None
    assert (result.srtp.tag, result.srtp.suite, result.srtp.remote_key) == (1, "AES_CM_128_HMAC_SHA1_32", KEY_A)
    assert result.srtp.local_key == bytes([1]) * 30  # the injected key source's first key
    answer = secure_answer(
        build_answer(
            parse_sdp(body), result.media, local_address="127.0.0.1", local_port=5000, session_id=1, session_version=1
        ),
        result,
    )
    text = answer.to_bytes().decode()
    assert "m=audio 5000 RTP/SAVP 0 101\r\n" in text
    ours = base64.b64encode(bytes([1]) * 30).decode()
    assert text.count("a=crypto:") == 1
    assert f"a=crypto:1 AES_CM_128_HMAC_SHA1_32 inline:{ours}\r\n" in text
    # The answer reads back as what it says.
    lines = crypto_lines(parse_sdp(answer.to_bytes()).media[0])
    assert [parsed for _, parsed in lines] == [parse_crypto(f"1 AES_CM_128_HMAC_SHA1_32 inline:{ours}")]


def test_savpf_is_taken_like_savp() -> None:
    result = answer_to(offer("RTP/SAVPF", f"3 AES_CM_128_HMAC_SHA1_80 inline:{B64_A}"))
    assert result.srtp is not None and result.srtp.tag == 3


def test_bad_lines_before_a_good_one_are_passed_over() -> None:
    body = offer(
        "RTP/SAVP",
        "1 AES_CM_128_HMAC_SHA1_80 inline:***",
        f"2 AES_CM_128_HMAC_SHA1_80 inline:{B64_A[:20]}",
        f"3 AES_CM_128_HMAC_SHA1_80 inline:{B64_A}|2^20|1:4",
        f"4 AEAD_AES_256_GCM inline:{B64_A}",
        f"5 AES_CM_128_HMAC_SHA1_80 inline:{B64_B}|2^31",
    )
    result = answer_to(body, "required")
    assert result.srtp is not None and (result.srtp.tag, result.srtp.remote_key) == (5, KEY_B)


def test_no_usable_line_is_488_naming_each_failure() -> None:
    body = offer(
        "RTP/SAVP",
        "1 AES_CM_128_HMAC_SHA1_80 inline:***",
        f"2 AES_CM_128_HMAC_SHA1_80 inline:{B64_A[:20]}",
        f"3 AES_CM_128_HMAC_SHA1_80 inline:{B64_A}|2^20|1:4",
        f"4 F8_128_HMAC_SHA1_80 inline:{B64_A}",
    )
    for mode in ("optional", "required"):
        with pytest.raises(SrtpRefused) as caught:
            answer_to(body, mode)
        assert caught.value.status_code == 488
        assert caught.value.reason == (
            "SRTP: no usable a=crypto: a=crypto:1 key is not base64; a=crypto:2 key of 15 octets, "
            "AES_CM_128_HMAC_SHA1_80 needs 30; a=crypto:3 MKI is not supported; and 1 more"
        )  # whole reasons, as many as fit one readable reason phrase


def test_savp_without_crypto_is_refused() -> None:
    with pytest.raises(SrtpRefused, match=r"m= line 0 \(RTP/SAVP\) has no a=crypto"):
        answer_to(offer("RTP/SAVP"), "required")


def test_off_refuses_savp_only_and_answers_osrtp_plainly() -> None:
    with pytest.raises(SrtpRefused, match="RTP/SAVP only and SRTP is off here"):
        answer_to(offer("RTP/SAVP", f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_A}"), "off")
    result = answer_to(offer("RTP/AVP", f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_A}"), "off")
    assert result.srtp is None
    body = offer("RTP/AVP", f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_A}")
    answer = secure_answer(
        build_answer(
            parse_sdp(body), result.media, local_address="127.0.0.1", local_port=5000, session_id=1, session_version=1
        ),
        result,
    )
    assert b"a=crypto" not in answer.to_bytes() and b"RTP/AVP" in answer.to_bytes()


def test_osrtp_offer_is_srtp_when_on_and_keeps_avp() -> None:
    body = offer("RTP/AVP", f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_A}")
    for mode in ("optional", "required"):
        result = answer_to(body, mode)
        assert result.srtp is not None and result.srtp.remote_key == KEY_A
        answer = secure_answer(
            build_answer(
                parse_sdp(body),
                result.media,
                local_address="127.0.0.1",
                local_port=5000,
                session_id=1,
                session_version=1,
            ),
            result,
        )
        assert b"m=audio 5000 RTP/AVP 0 101\r\n" in answer.to_bytes() and b"a=crypto:1 " in answer.to_bytes()


def test_osrtp_with_only_bad_crypto_falls_back_to_plain_when_optional() -> None:
    body = offer("RTP/AVP", "1 AES_CM_128_HMAC_SHA1_80 inline:***")
    assert answer_to(body, "optional").srtp is None
    with pytest.raises(SrtpRefused, match="a=crypto:1 key is not base64"):
        answer_to(body, "required")


def test_plain_offer_is_plain_when_optional_and_488_when_required() -> None:
    assert answer_to(offer("RTP/AVP"), "optional").srtp is None
    with pytest.raises(SrtpRefused, match="SRTP is required here and the offer has no a=crypto"):
        answer_to(offer("RTP/AVP"), "required")


def test_best_effort_pair_prefers_the_secure_stream() -> None:
    # Some phones offer the same audio twice: RTP/SAVP first, then RTP/AVP. The secure one is taken, the other
    # gets port 0 in the answer.
    second = "m=audio 4002 RTP/AVP 0\na=rtpmap:0 PCMU/8000"
    body = offer("RTP/SAVP", f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_A}", second=second)
    result = answer_to(body, "optional")
    assert result.srtp is not None and result.media.media_index == 0
    # And the plain one when SRTP is off.
    assert answer_to(body, "off").media.media_index == 1
    # A usable SAVP stream listed after the plain one is still preferred.
    body = sdp(f"""
        v=0
        o=- 1 1 IN IP4 127.0.0.1
        s=-
        c=IN IP4 127.0.0.1
        t=0 0
        m=audio 4002 RTP/AVP 0
        m=audio 4000 RTP/SAVP 0
        a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:{B64_A}
    """)
    result = answer_to(body, "optional")
    assert result.srtp is not None and result.media.media_index == 1 and result.media.remote_rtp[1] == 4000


def test_secure_stream_without_common_codec_is_no_common_codec() -> None:
    body = sdp(f"""
        v=0
        o=- 1 1 IN IP4 127.0.0.1
        s=-
        c=IN IP4 127.0.0.1
        t=0 0
        m=audio 4000 RTP/SAVP 18
        a=rtpmap:18 G729/8000
        a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:{B64_A}
    """)
    for mode in ("optional", "required"):
        with pytest.raises(NoCommonCodec):
            answer_to(body, mode)


def test_window_hint_and_suite_preference_restriction() -> None:
    body = offer(
        "RTP/SAVP", f"1 AES_CM_128_HMAC_SHA1_32 inline:{B64_A}", f"2 AES_CM_128_HMAC_SHA1_80 inline:{B64_B} WSH=512"
    )
    result = answer_to(body, "required", suites=("AES_CM_128_HMAC_SHA1_80",))
    assert result.srtp is not None
    assert (result.srtp.tag, result.srtp.replay_window, result.srtp.remote_key) == (2, 512, KEY_B)


# ------------------------------------------------------------------------------------------- re-offer


def test_reoffer_keeps_our_key_for_the_same_suite_and_makes_one_for_another() -> None:
    current = SrtpNegotiated(tag=1, suite="AES_CM_128_HMAC_SHA1_80", local_key=KEY_B, remote_key=KEY_A)
    keys = Keys()
    same = negotiate_secure(
        parse_sdp(offer("RTP/SAVP", f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_A}")),
        local=LocalMedia(),
        mode="optional",
        key_source=keys,
        current=current,
    )
    assert same.srtp == current and keys.asked == []
    rekeyed = negotiate_secure(
        parse_sdp(offer("RTP/SAVP", f"4 AES_CM_128_HMAC_SHA1_80 inline:{B64_B}")),
        local=LocalMedia(),
        mode="optional",
        key_source=keys,
        current=current,
    )
    assert rekeyed.srtp is not None
    assert (rekeyed.srtp.tag, rekeyed.srtp.remote_key, rekeyed.srtp.local_key) == (4, KEY_B, KEY_B)  # ours kept
    suite_changed = negotiate_secure(
        parse_sdp(offer("RTP/SAVP", f"1 AES_CM_128_HMAC_SHA1_32 inline:{B64_A}")),
        local=LocalMedia(),
        mode="optional",
        key_source=keys,
        current=current,
    )
    assert suite_changed.srtp is not None and suite_changed.srtp.local_key == bytes([1]) * 30
    assert keys.asked == [30]


def test_switching_between_rtp_and_srtp_mid_call_is_refused() -> None:
    srtp = SrtpNegotiated(tag=1, suite="AES_CM_128_HMAC_SHA1_80", local_key=KEY_B, remote_key=KEY_A)
    check_update(None, None)
    check_update(srtp, srtp)
    with pytest.raises(SrtpRefused, match="the call is SRTP; changing it to RTP mid-call is not supported"):
        check_update(srtp, None)
    with pytest.raises(SrtpRefused, match="the call is RTP; changing it to SRTP mid-call is not supported"):
        check_update(None, srtp)


# ---------------------------------------------------------------------------------- offerer and answer


def _our_offer(mode: str) -> tuple[bytes, tuple[CryptoAttribute, ...]]:
    lines = offer_crypto(mode, Keys())  # type: ignore[arg-type]
    base = build_offer(local_address="127.0.0.1", local_port=6000, session_id=9, session_version=1)
    return secure_offer(base, mode, lines).to_bytes(), lines  # type: ignore[arg-type]


def test_offers_per_mode() -> None:
    plain, lines = _our_offer("off")
    assert lines == () and b"a=crypto" not in plain and b"RTP/AVP" in plain
    optional, lines = _our_offer("optional")
    media = parse_sdp(optional).media[0]
    assert media.proto == "RTP/AVP"  # RFC 8643 OSRTP
    assert [p for _, p in crypto_lines(media)] == list(lines)
    assert [(line.tag, line.suite) for line in lines] == [
        (1, "AES_CM_128_HMAC_SHA1_80"),
        (2, "AES_CM_128_HMAC_SHA1_32"),
    ]
    assert lines[0].keys[0].key_salt != lines[1].keys[0].key_salt  # a key per line
    required, _ = _our_offer("required")
    assert parse_sdp(required).media[0].proto == "RTP/SAVP"


def _answer(proto: str, *crypto: str) -> tuple:  # type: ignore[type-arg]
    from gateway.sip.sdp import negotiate

    description = parse_sdp(offer(proto, *crypto))
    profiles = frozenset({"RTP/AVP", "RTP/AVPF", "RTP/SAVP", "RTP/SAVPF"})
    return description, negotiate(description, local=LocalMedia(), profiles=profiles)


def test_read_answer_takes_the_accepted_line_with_our_key() -> None:
    _, lines = _our_offer("optional")
    description, negotiated = _answer("RTP/AVP", f"2 AES_CM_128_HMAC_SHA1_32 inline:{B64_A}")
    srtp = read_answer(description, negotiated, lines, "optional")
    assert srtp == SrtpNegotiated(
        tag=2, suite="AES_CM_128_HMAC_SHA1_32", local_key=lines[1].keys[0].key_salt, remote_key=KEY_A
    )
    assert reoffer_crypto(srtp)[0].keys[0].key_salt == srtp.local_key


def test_read_answer_plain_only_for_osrtp() -> None:
    _, lines = _our_offer("optional")
    description, negotiated = _answer("RTP/AVP")
    assert read_answer(description, negotiated, lines, "optional") is None
    _, lines = _our_offer("required")
    with pytest.raises(SrtpRefused, match="the answer has no a=crypto for our SRTP offer"):
        read_answer(description, negotiated, lines, "required")
    description, negotiated = _answer("RTP/SAVP")
    with pytest.raises(SrtpRefused, match="the answer has no a=crypto"):
        read_answer(description, negotiated, lines, "optional")


@pytest.mark.parametrize(
    ("crypto", "reason"),
    [
        ((f"3 AES_CM_128_HMAC_SHA1_80 inline:{B64_A}",), "a=crypto:3 AES_CM_128_HMAC_SHA1_80 is not one we offered"),
        ((f"1 AES_CM_128_HMAC_SHA1_32 inline:{B64_A}",), "a=crypto:1 AES_CM_128_HMAC_SHA1_32 is not one we offered"),
        (
            (f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_A}", f"2 AES_CM_128_HMAC_SHA1_32 inline:{B64_B}"),
            "the answer has 2 a=crypto lines",
        ),
        (("1 AES_CM_128_HMAC_SHA1_80 inline:***",), "a=crypto:1 key is not base64"),
        ((f"1 AES_CM_128_HMAC_SHA1_80 inline:{B64_A}|2^31|1:4",), "a=crypto:1 MKI is not supported"),
    ],
)
def test_read_answer_refuses_what_we_did_not_offer(crypto: tuple[str, ...], reason: str) -> None:
    _, lines = _our_offer("required")
    description, negotiated = _answer("RTP/SAVP", *crypto)
    with pytest.raises(SrtpRefused) as caught:
        read_answer(description, negotiated, lines, "required")
    assert reason in caught.value.reason


_CRYPTO_PART = st.sampled_from(
    [
        "1",
        "2",
        "x",
        "AES_CM_128_HMAC_SHA1_80",
        "AES_CM_128_HMAC_SHA1_32",
        "F8_128_HMAC_SHA1_80",
        f"inline:{B64_A}",
        f"inline:{B64_A}|2^31",
        f"inline:{B64_A}|1:4",
        "inline:***",
        "inline:",
        "KDR=0",
        "WSH=8",
        "-EXT",
        "UNENCRYPTED_SRTP",
        ";",
        "|",
    ]
)


@given(
    lines=st.lists(st.lists(_CRYPTO_PART, min_size=0, max_size=6).map(" ".join), max_size=4),
    proto=st.sampled_from(["RTP/SAVP", "RTP/AVP", "RTP/SAVPF"]),
    mode=st.sampled_from(["off", "optional", "required"]),
)
def test_any_crypto_lines_give_an_answer_or_a_488(lines: list[str], proto: str, mode: str) -> None:
    """Whatever the crypto lines of an offer, negotiation answers or refuses with 488; nothing else escapes."""
    body = offer(proto, *lines)
    try:
        result = answer_to(body, mode)
    except (SrtpRefused, NoCommonCodec) as exc:
        assert exc.status_code == 488 and len(exc.reason) <= 200
        return
    if result.srtp is not None:
        assert mode != "off" and len(result.srtp.remote_key) == 30
        assert result.srtp.tag in [parse_crypto(line).tag for line in lines if _parses(line)]
    else:
        assert mode != "required" and proto == "RTP/AVP"


def _parses(line: str) -> bool:
    try:
        parse_crypto(line)
    except CryptoError:
        return False
    return True
